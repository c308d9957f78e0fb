"""The lifecycle of a call: its states, the moves between them, and how a session's
transcript records them (DESIGN §4 "The lifecycle of a call").

One state machine for every way a call can wait or go on: approvals and deferred
results (a call ``pending`` a person's or another system's decision), the governor (a
call ``queued`` for a place, ``retried`` after a failed attempt), background tasks (a
call ``backgrounded`` past its turn) and MCP's input-required results (a background
call ``pending`` again). Everything here is plain data and pure functions, so that the
runtime, the agent loop, the transcript and a tool in another process read the same
rules::

    STATES        pending, queued, running, retried, backgrounded, decided, settled
    FIRST_STATES  what a call prepared in a turn may start in
    TRANSITIONS   state -> the states it may move to ("settled" is terminal)

A call enters when its reply is recorded (the transcript's ``reply`` record) and
leaves once settled (its ``result`` record): a call that only runs (the usual case)
needs no record of its own in between. Every other state change is one ``call``
record (:func:`call_record` builds and checks it; :func:`fold` reads a transcript's
records back into each call's :class:`CallTrack`)::

    "type": "call", "step": int, "index": int   (the reply and the call's place in it)
    "call_id": str, "name": str, "state": one of RECORDED_STATES, "at": float (Unix s)
    and by state (required, then optional):
      pending       kind ("approval" | "external"), arguments_sha256; expires_at (Unix s
                    or null), reason
      decided       decision ("approved" | "rejected" | "expired" | "resolved"),
                    decided_by (str or null), arguments_sha256; arguments (the object
                    approved when it was edited), message (a rejection's text)
      queued        ; reason
      running       arguments_sha256; attempt (1, 2, ...)
      retried       attempt, error_kind; delay_s
      backgrounded  task_id

The record sits in a version 2 transcript beside the others: readers that do not know
the ``call`` type skip it, and a field added later is ignored by readers that do not
know it (DESIGN §4, ``agent/transcript.py``).

Example::

    record = call_record("pending", call_id="c1", name="delete", index=0,
                         kind="approval", arguments_sha256=arguments_sha256({"path": "/tmp/x"}))
    tracks = fold([{"type": "call", "step": 1, **record}])
    assert tracks["c1"].state == "pending" and allowed("pending", "decided")
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final, Literal

from rho_actors.tool import ErrorKind, ToolCall, ToolResult

__all__ = [
    "held_by",
    "DECISIONS",
    "Deferred",
    "FIRST_STATES",
    "PENDING_KINDS",
    "RECORDED_BY_CALLER",
    "RECORDED_STATES",
    "STATES",
    "TRANSITIONS",
    "CallState",
    "CallTrack",
    "Decision",
    "LifecycleError",
    "PendingCall",
    "PendingKind",
    "allowed",
    "arguments_sha256",
    "call_record",
    "check_move",
    "fold",
    "open_pending",
    "pending_call",
]

CallState = Literal["pending", "queued", "running", "retried", "backgrounded", "decided", "settled"]
Decision = Literal["approved", "rejected", "expired", "resolved"]
PendingKind = Literal["approval", "external"]

STATES: Final[tuple[CallState, ...]] = (
    "pending", "queued", "running", "retried", "backgrounded", "decided", "settled")
"""Every state of a call, in the order a call may pass them."""
RECORDED_STATES: Final[frozenset[str]] = frozenset(STATES) - {"settled"}
"""The states a ``call`` record holds: ``settled`` is the ``result`` record."""
FIRST_STATES: Final[frozenset[str]] = frozenset({"pending", "queued", "running", "backgrounded", "settled"})
"""The states a call enters in from its turn: held for a decision, waiting for a place,
started, run on as a task (a call that only ran needs no record before that), or
settled at once (refused before it ran)."""
DECISIONS: Final[tuple[Decision, ...]] = ("approved", "rejected", "expired", "resolved")
"""How a pending call is decided: by a person (``approved``, ``rejected``), by its clock
(``expired``, past ``approval_timeout_s``) or by the system it waited for
(``resolved``, ``loop.resolve``)."""
PENDING_KINDS: Final[tuple[PendingKind, ...]] = ("approval", "external")
"""What a pending call waits for: a person's approval, or a result from outside
(a tool that returned ``Deferred``)."""
RECORDED_BY_CALLER: Final[ContextVar[bool]] = ContextVar("rho_actors.recorded_by_caller", default=False)
"""True while a turn is submitted by a caller that records its calls' lifecycle in the
session's transcript itself (the agent loop's prompt, which holds the transcript):
otherwise the session's approvals record the calls the turn holds for a decision."""

TRANSITIONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType({
    "pending": frozenset({"decided", "settled"}),  # settled: cancelled while it waited (a task's input)
    "decided": frozenset({"queued", "running", "settled"}),  # approved: it starts; else its result
    "queued": frozenset({"running", "settled"}),  # settled: no place before its deadline, or cancelled
    "running": frozenset({"settled", "retried", "backgrounded", "pending"}),  # pending: it returned Deferred
    "retried": frozenset({"queued", "running", "settled"}),  # the next attempt, or given up
    "backgrounded": frozenset({"settled", "pending"}),  # pending: a task waiting for input
    "settled": frozenset(),
})
"""The moves allowed: ``TRANSITIONS[before]`` is every state a call in ``before`` may
move to. A decided call moves on by its decision: ``approved`` to ``queued`` or
``running``, any other to ``settled``."""

_REQUIRED: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({
    "pending": ("kind", "arguments_sha256"),
    "decided": ("decision", "decided_by", "arguments_sha256"),
    "queued": (),
    "running": ("arguments_sha256",),
    "retried": ("attempt", "error_kind"),
    "backgrounded": ("task_id",),
})
_OPTIONAL: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({
    "pending": ("expires_at", "reason"),
    "decided": ("arguments", "message"),
    "queued": ("reason",),
    "running": ("attempt",),
    "retried": ("delay_s",),
    "backgrounded": (),
})


class LifecycleError(ValueError):
    """A state change the lifecycle does not allow, or a ``call`` record whose fields are
    wrong; ``str(err)`` names the call, the states and the field."""


def allowed(before: str | None, after: str) -> bool:
    """Whether a call in state ``before`` (``None``: a call just prepared) may move to
    ``after``."""
    if before is None:
        return after in FIRST_STATES
    return after in TRANSITIONS.get(before, frozenset())


def arguments_sha256(arguments: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of a call's decoded arguments as canonical JSON (keys sorted,
    compact, ASCII): what an approval binds to. Raises ``ValueError`` for arguments
    JSON cannot hold."""
    try:
        text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"the arguments cannot be hashed as JSON: {exc}") from None
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _check_field(state: str, key: str, value: Any) -> None:
    ok: bool = _CHECKS.get(key, _is_text)(value)
    if not ok:
        raise LifecycleError(f"a {state} record's {key} cannot be {value!r}")


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


_CHECKS: Final[Mapping[str, Any]] = {
        "kind": lambda v: v in PENDING_KINDS,
        "decision": lambda v: v in DECISIONS,
        "arguments_sha256": lambda v: isinstance(v, str) and len(v) == 64,
        "decided_by": lambda v: v is None or isinstance(v, str),
        "expires_at": lambda v: v is None or (type(v) in (int, float) and math.isfinite(v)),
        "attempt": lambda v: type(v) is int and v >= 1,
        "delay_s": lambda v: type(v) in (int, float) and math.isfinite(v) and v >= 0,
        "arguments": lambda v: isinstance(v, dict),
}


def call_record(state: str, *, call_id: str, name: str, index: int, at: float | None = None,
                **fields: Any) -> dict[str, Any]:
    """The fields of the ``call`` record of a call moving to ``state`` (the transcript
    adds ``type`` and ``step``): ``call_id``, ``name``, ``index`` (the call's place in
    its reply), ``at`` (Unix seconds, default now) and the state's fields (the module
    doc's table). Raises :class:`LifecycleError` for a state that is not recorded, a
    required field missing, an unknown field or a value of the wrong type."""
    if state not in RECORDED_STATES:
        raise LifecycleError(f"call {call_id}: {state!r} is not a recorded state (one of "
                             f"{', '.join(s for s in STATES if s in RECORDED_STATES)})")
    if type(index) is not int or index < 0:
        raise LifecycleError(f"call {call_id}: index must be an int >= 0, got {index!r}")
    missing = [k for k in _REQUIRED[state] if k not in fields]
    unknown = [k for k in fields if k not in _REQUIRED[state] and k not in _OPTIONAL[state]]
    if missing or unknown:
        raise LifecycleError(f"call {call_id}: a {state} record " + "; ".join(
            ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has no field {', '.join(unknown)}"]
                                                                     if unknown else [])))
    for key, value in fields.items():
        _check_field(state, key, value)
    return {"call_id": call_id, "name": name, "index": index, "state": state,
            "at": round(time.time() if at is None else at, 6), **fields}


@dataclass(slots=True)
class CallTrack:
    """One call's lifecycle as its ``call`` records tell it: ``state`` now (``settled``
    once its ``result`` record is read), and the latest fields of each state it passed,
    with its ``at`` (``states["pending"]["kind"]``...). ``step`` and ``index`` place it in its reply."""

    call_id: str
    name: str
    step: int
    index: int
    state: str = "running"
    states: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def kind(self) -> str | None:
        """What it waits or waited for (``"approval"``, ``"external"``), if it was pending."""
        return self.states.get("pending", {}).get("kind")

    @property
    def decision(self) -> str | None:
        """Its decision, once decided."""
        return self.states.get("decided", {}).get("decision")

    def move(self, after: str, fields: Mapping[str, Any]) -> None:
        """Move to ``after`` with the record's ``fields``; raises :class:`LifecycleError`
        for a move :data:`TRANSITIONS` does not allow (a decided call moves by its
        decision)."""
        before = self.state if self.states else None
        if not allowed(before, after):
            raise LifecycleError(f"call {self.call_id}: no move from {before or 'its turn'} to {after}")
        if before == "decided" and self.decision != "approved" and after != "settled":
            raise LifecycleError(f"call {self.call_id}: a call {self.decision} can only settle, not become {after}")
        self.state = after
        self.states[after] = dict(fields)


def fold(records: Iterable[Mapping[str, Any]], tracks: dict[str, CallTrack] | None = None) -> dict[str, CallTrack]:
    """Each call's :class:`CallTrack` from a transcript's records (``call`` records, and
    ``result`` records of calls that have a track: they settle it), by call id, in the
    order first seen; ``tracks``: those of the records before them, moved on in place.
    Raises :class:`LifecycleError` (a ``ValueError``) for a record whose fields or move
    are wrong."""
    tracks = {} if tracks is None else tracks
    for record in records:
        kind = record.get("type")
        if kind == "result":
            track = tracks.get(record.get("call_id"))  # type: ignore[arg-type]
            if track is not None and track.state != "settled":
                track.move("settled", {})
            continue
        if kind != "call":
            continue
        state, call_id = record.get("state"), record.get("call_id")
        fields = {k: v for k, v in record.items()
                  if k not in ("v", "seq", "sum", "ts", "type", "step", "call_id", "name", "index", "state", "at")}
        call_record(str(state), call_id=call_id, name=record.get("name"), index=record.get("index"),  # type: ignore[arg-type]
                    at=record.get("at"), **fields)  # checks the fields
        track = tracks.get(call_id)  # type: ignore[arg-type]
        if track is None or (track.step, track.index) != (record["step"], record["index"]):  # a new call, that id
            track = tracks[str(call_id)] = CallTrack(str(call_id), str(record["name"]), record["step"], record["index"])
        track.move(str(state), {**fields, "at": record.get("at")})
    return tracks


def check_move(record: Mapping[str, Any], tracks: Mapping[str, CallTrack]) -> None:
    """Raise :class:`LifecycleError` as :func:`fold` would for ``record`` after
    ``tracks``, moving none of them (a writer checks a record before it is written, and
    moves its track once it is: a record the disk refused moves no call)."""
    track = tracks.get(record.get("call_id"))  # type: ignore[arg-type]
    fold([record], {} if track is None else {track.call_id: replace(track, states=dict(track.states))})


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A call waiting for a decision (``loop.pending()``).

    ``call_id``, ``name``: the call and its tool; ``arguments``: its decoded, validated
    arguments (a copy); ``arguments_sha256``: :func:`arguments_sha256` of them;
    ``requested_at``: when it became pending (Unix time, seconds); ``kind``:
    ``"approval"`` (a person approves or rejects it) or ``"external"`` (its tool
    returned ``Deferred``: ``loop.resolve`` gives its result); ``expires_at``: when an
    approval expires, by the wall clock as it was held (Unix seconds; ``None`` for an
    external call; a host expires it on its monotonic clock); ``reason``: why it
    waits (a ``Deferred``'s reason, or which earlier call of its exclusive turn it waits
    behind)."""

    call_id: str
    name: str
    arguments: Mapping[str, Any]
    arguments_sha256: str
    requested_at: float
    kind: PendingKind = "approval"
    expires_at: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Deferred:
    """What a tool's ``run`` returns when its result will come from outside (a person, a
    queue, a webhook): the call becomes pending with ``kind="external"`` and
    ``loop.resolve(call_id, output)`` gives its result later. ``reason`` (a ``str``)
    tells the model and the host what it waits for. Raises ``TypeError`` for a reason
    that is not a ``str``."""

    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str):
            raise TypeError(f"Deferred reason must be a str, got {type(self.reason).__name__}")


def pending_call(result: ToolResult) -> PendingCall | None:
    """The :class:`PendingCall` a turn's result stands for (``pending_approval`` or
    ``deferred``, with it in ``details["pending"]``), else ``None``."""
    if result.error_kind not in (ErrorKind.PENDING_APPROVAL, ErrorKind.DEFERRED):
        return None
    return held_by(result)


def held_by(result: ToolResult) -> PendingCall | None:
    """The :class:`PendingCall` a turn's result holds in ``details["pending"]``: a held
    call's (:func:`pending_call`) or the acknowledgement of the task it waits as; else ``None``."""
    details = result.details
    pending = details.get("pending") if isinstance(details, Mapping) else None
    return pending if isinstance(pending, PendingCall) else None


def open_pending(tracks: Mapping[str, CallTrack], calls: Iterable[ToolCall]) -> list[PendingCall]:
    """The :class:`PendingCall` of each open call's ``tracks`` (a transcript's
    ``History.open_calls``), its arguments decoded from its reply's ``calls`` (``{}``
    when they cannot be); one decided and not run yet says so in its ``reason``."""
    by_id = {c.id: c for c in calls}
    found = []
    for call_id, track in tracks.items():
        pending = track.states.get("pending", {})
        call = by_id.get(call_id)
        arguments: Any = {} if call is None else call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {}
        reason = pending.get("reason", "") if track.state == "pending" else f"{track.decision}, not run yet"
        found.append(PendingCall(call_id, track.name, MappingProxyType(dict(arguments) if isinstance(
            arguments, Mapping) else {}), pending.get("arguments_sha256", ""), pending.get("at", 0.0),
            pending.get("kind", "approval"), pending.get("expires_at"), reason))
    return found
