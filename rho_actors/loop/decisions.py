"""Decisions through a session's transcript (DESIGN §4 "Approvals"): the lock every
decision takes, how a first decision is named in a refusal, :func:`decide`, which
records a decision from any process (``rho-actors approve/reject``), :func:`record_held`,
which records the calls a turn run directly holds, and :func:`bound_arguments`, what an
approval read from the transcript may run."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from rho_actors.agent.model import Reply
from rho_actors.agent.session_lease import served
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptBusyError
from rho_actors.declarations.arguments import ArgumentsError, decode_arguments
from rho_actors.errors import RhoError
from rho_actors.lifecycle import CallTrack, PendingCall, arguments_sha256
from rho_actors.loop.messages import checked_session_id
from rho_actors.results import failure
from rho_actors.tool import ToolCall, ToolResult

__all__ = [
    "LOCK_WAIT_S", "ApprovalError", "bound_arguments", "decide", "decided_result",
    "decoded_or_empty", "first_decision", "locked_transcript", "record_held",
]

LOCK_WAIT_S: Final = 30.0
"""How long (seconds) a decision waits for the session's transcript held by a running prompt."""


class ApprovalError(RhoError):
    """A decision that cannot be made: an unknown call id (or another session's), a call
    decided already (``str(err)`` names the first decision: what, by whom, when), one of
    another kind (``approve`` of a deferred call), or one that waits behind an earlier
    call of its exclusive turn."""


def first_decision(track: CallTrack) -> str:
    """How a call's first decision reads in a refusal: what, by whom, when."""
    decided = track.states.get("decided")
    if decided is None:
        return f"it has its result already ({track.state})"
    by = decided.get("decided_by")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(decided.get("at", 0)))
    return f"it was {decided['decision']}{'' if by is None else f' by {by}'} at {when}"


@contextlib.contextmanager
def locked_transcript(path: Path, wait_s: float = LOCK_WAIT_S, transcript: Transcript | None = None
                      ) -> Iterator[Transcript]:
    """The transcript at ``path``, opened under its lock as a brief writer (a prompt
    waits for it: :meth:`Transcript.open`), waiting up to ``wait_s`` for another holder
    (a running prompt, another process deciding). ``transcript``: a writer of ``path``
    that read it before, to read only what was appended since
    (:meth:`~rho_actors.agent.transcript.Transcript.reopen`; used by one thread at a time)."""
    until = time.monotonic() + wait_s
    delay = 0.001
    transcript = Transcript(path) if transcript is None else transcript
    transcript.read_unlocked()  # what it gained read before the lock: held for the rest only
    while True:
        try:
            transcript.reopen()
            break
        except TranscriptBusyError:
            if time.monotonic() >= until:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
    try:
        yield transcript
    finally:
        transcript.close()


def decide(data_dir: str | Path, session_id: str, call_id: str, decision: str, *, message: str | None = None,
           decided_by: str | None = None) -> str:
    """Write a decision (``"approved"`` or ``"rejected"``, with ``message``) for pending
    call ``call_id`` of session ``session_id`` into its transcript under
    ``data_dir/sessions/<session_id>``, from any process: the host running the session
    acts on it within :data:`POLL_S` seconds (or the next host, at its start). Returns
    a line saying what was recorded. Raises :class:`ApprovalError` naming the call and
    the first decision when it is unknown, not pending or decided already, past its
    approval deadline (its record's wall-clock ``expires_at``, looked at only while no
    host serves the session: a serving host keeps the deadline on its monotonic clock and
    records the expiry itself; a decision recorded past it while no host held the call
    loses to the expiry at the next host), or waiting for an external result; ``ValueError`` for a bad
    decision or a rejection without message; ``OSError`` when the transcript cannot be
    used."""
    if decision not in ("approved", "rejected"):
        raise ValueError(f"decision must be 'approved' or 'rejected', got {decision!r}")
    if decision == "rejected" and (not isinstance(message, str) or not message.strip()):
        raise ValueError("a rejection needs a message for the model")
    session_id = checked_session_id(session_id)  # no separator, no "..": a folder of data_dir/sessions
    path = Path(data_dir) / "sessions" / session_id / TRANSCRIPT_NAME
    if not os.path.lexists(path):
        raise ApprovalError(f"session {session_id!r} has no transcript under {data_dir}: no call waits there")
    with locked_transcript(path) as transcript:
        track = transcript.history.calls.get(call_id)
        if track is None or (call_id not in transcript.history.open_calls and track.state == "pending"):
            raise ApprovalError(f"no call {call_id!r} waits for a decision in session {session_id!r}")
        if track.state != "pending":
            raise ApprovalError(f"call {call_id} of session {session_id!r} is decided already: "
                                f"{first_decision(track)}")
        pending = track.states["pending"]
        if pending["kind"] != "approval":
            raise ApprovalError(f"call {call_id} waits for a result from outside, not an approval")
        expires = pending.get("expires_at")
        # a host serving the session keeps the deadline on its monotonic clock and records the expiry itself:
        # this process's wall clock (set forward, say) refuses nothing that host still holds
        if expires is not None and time.time() >= expires and not served(path.parent):
            raise ApprovalError(f"call {call_id} of session {session_id!r} is past its approval deadline")
        recorded = [c for m in transcript.history.messages for c in m.tool_calls if c.id == call_id]
        args = decoded_or_empty(recorded[-1].arguments) if recorded else None
        if args is None or arguments_sha256(args) != pending["arguments_sha256"]:  # what a person is shown
            raise ApprovalError(f"call {call_id} of session {session_id!r} is not decided: its recorded arguments "
                                "do not match the SHA-256 its pending record is bound to (the transcript was altered)")
        extra: dict[str, Any] = {"message": message} if decision == "rejected" and message is not None else {}
        transcript.call(track.step, track.index, "decided", call_id=call_id, name=track.name, decision=decision,
                        decided_by=decided_by, arguments_sha256=pending["arguments_sha256"], **extra)
    shown = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return (f"call {call_id} of session {session_id} {decision}{'' if decided_by is None else f' by {decided_by}'}: "
            f"{track.name} {shown if len(shown) <= 300 else shown[:300] + '...'} (arguments SHA-256 "
            f"{pending['arguments_sha256'][:16]})")


def decided_result(pending: PendingCall, decided: Mapping[str, Any], timeout_s: float) -> ToolResult:
    """The result of ``pending`` decided (its ``decided`` record's fields) without being
    run: ``rejected``, ``approval_expired`` after ``timeout_s`` seconds, or ``interrupted``."""
    call_id, name = pending.call_id, pending.name
    if decided.get("decision") == "rejected":
        return failure("rejected", call_id, name, message=decided.get("message") or "rejected")
    if decided.get("decision") == "expired":
        return failure("approval_expired", call_id, name, call=call_id, timeout_s=timeout_s)
    return failure("interrupted", call_id, name)


def decoded_or_empty(arguments: str | Mapping[str, Any]) -> dict[str, Any]:
    """A recorded call's arguments decoded, or ``{}`` when they are not a JSON object."""
    try:
        return decode_arguments(arguments)
    except ArgumentsError:
        return {}


def record_held(transcript: Transcript, held: Sequence[tuple[ToolCall, PendingCall]]) -> None:
    """Record in ``transcript`` (open, locked) the calls a turn run directly holds for a
    decision, each with its :class:`PendingCall`: a call the transcript has in a reply
    without a result and without records of its own (an MCP session records each call
    before it runs) gets its ``pending`` record there; the others a reply of their own
    first (no text, those calls, at the next step), so that the transcript reads them back
    as calls waiting for a decision. A call recorded pending there already (by a prompt)
    is left as it is. One ``fdatasync``, at the last record. Raises ``OSError`` and
    ``ValueError`` as the transcript's writes do."""
    history = transcript.history
    placed: list[tuple[int, int, PendingCall]] = []
    new: list[tuple[ToolCall, PendingCall]] = []
    for call, pending in held:
        where, track = history.unanswered.get(call.id), history.calls.get(call.id)
        if where is not None and track is not None and (track.step, track.index) == where:
            if track.state in ("pending", "decided"):
                continue  # recorded already
            where = None  # an earlier call of that id, interrupted: this one is another
        if where is None:
            new.append((call, pending))
        else:
            placed.append((*where, pending))
    if new:
        step = history.next_step
        transcript.reply(step, Reply(tool_calls=tuple(call for call, _ in new)), sync=False)
        placed += [(step, index, pending) for index, (_, pending) in enumerate(new)]
    for n, (step, index, pending) in enumerate(placed, 1):
        transcript.call(step, index, "pending", call_id=pending.call_id, name=pending.name, kind=pending.kind,
                        arguments_sha256=pending.arguments_sha256, expires_at=pending.expires_at,
                        reason=pending.reason, sync=n == len(placed))


def bound_arguments(pending: PendingCall, args: Mapping[str, Any], decided: Mapping[str, Any]) -> dict[str, Any] | str:
    """The arguments an approval read from the transcript (its ``decided`` record's
    fields: written by another process, or before a restart) runs: the pending call's own
    ``args``, when the decision is bound to their SHA-256 (the one its ``pending`` record
    holds, of the arguments a person was shown) and carries no other arguments; else what
    is wrong with it (a ``str``): such an approval never runs a call. Arguments are edited
    only by ``loop.approve`` in the host, which runs them itself."""
    if pending.kind != "approval":
        return "approves a call that waits for a result from outside, not for an approval"
    bound, edited = decided.get("arguments_sha256"), decided.get("arguments")
    try:
        sha = arguments_sha256(args)
        other = edited is not None and (not isinstance(edited, dict) or arguments_sha256(edited) != sha)
    except ValueError:
        return "holds arguments that cannot be hashed"
    if bound != pending.arguments_sha256 or sha != pending.arguments_sha256 or other:
        return "is bound to other arguments than the call that waits (their SHA-256 differs)"
    return dict(args)
