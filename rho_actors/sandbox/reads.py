"""Throwaway reads of untrusted declarations (DESIGN §3; internal, re-exported by
:mod:`rho_actors.sandbox`).

:func:`read_declaration_isolated` reads an untrusted tool's five declaration callbacks
in a fresh child process with a time bound and a heap bound, and answers with plain
data only (JSON text). :func:`raw_declaration` turns that answer into the dict
:func:`rho_actors.declarations.checks.check_declaration` checks. :func:`await_answer` and
:func:`end_child` serve every throwaway child (reads, plugin discovery, selftests): one
bounded answer, then the child's whole process tree is killed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pickle
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import psutil

from rho_actors.bounded_json import bound_problem
from rho_actors.declarations.checks import (
    DECLARATION_CALLBACKS,
    DEFAULT_MAX_DESCRIPTION_CHARS,
    DEFAULT_MAX_SCHEMA_BYTES,
    DEFAULT_MAX_SCHEMA_DEPTH,
    DEFAULT_MAX_SCHEMA_NODES,
    Raised,
    read_declaration,
)
from rho_actors.encoding import describe_exception
from rho_actors.errors import RhoError
from rho_actors.sandbox import wire
from rho_actors.sandbox.channel import Channel, DeadlineReached, Malformed
from rho_actors.sandbox.confine.enclosure import ConfinePolicy, Enclosure
from rho_actors.sandbox.confine.libc import LIBC, PR_SET_CHILD_SUBREAPER
from rho_actors.sandbox.confine.trees import kill_tree
from rho_actors.sandbox.processes import Child, close, context, mib, reap, signal_name, spawn
from rho_actors.sandbox.shipping import CALLBACKS, Unshippable, label, ship
from rho_actors.sandbox.slots import WorkerSlots
from rho_actors.sandbox.start_bound import START_TIMEOUT_ENV, default_start_timeout_ms

__all__ = [
    "DEFAULT_HEAP_BYTES",
    "DEFAULT_READ_TIMEOUT_S",
    "IsolatedReadError",
    "ReadFailure",
    "await_answer",
    "become_subreaper",
    "declaration_child",
    "end_child",
    "declaration_answer_bytes",
    "linger",
    "raw_declaration",
    "read_declaration_isolated",
    "value_bounds",
]

DEFAULT_HEAP_BYTES: Final = 256 * 2**20
"""Default address-space bound (``RLIMIT_AS``) of a child process, in bytes."""

DEFAULT_READ_TIMEOUT_S: Final = 2.0
"""Default time bound of an isolated declaration read, in seconds."""

ReadFailure = Literal["timeout", "memory", "crashed", "exited", "unpicklable", "cancelled"]
"""How an isolated read can fail (:attr:`IsolatedReadError.kind`)."""

_MAX_TEXT_CHARS: Final = 1_000
"""The longest text of a raised callback or a value's type name an answer carries (cut)."""
_ESCAPED_CHARS: Final = 12
"""ASCII JSON characters a character may take at most (``\\ud83d\\ude00``)."""
_ENVELOPE_BYTES: Final = 4 * 1024 + 5 * 2 * _MAX_TEXT_CHARS * _ESCAPED_CHARS
"""An answer's bytes beside its values: keys, type names, reasons, raised texts."""
_SLOT_WAIT_S: Final = 60.0
"""How long a declaration read waits for a place under the worker cap (seconds)."""
_EXIT_GRACE_S: Final = 1.0
"""How long a child that closed its pipe gets to finish exiting before it is killed."""
_REAP_TIMEOUT_S: Final = 5.0
_CANCEL_POLL_S: Final = 0.05
"""How often a declaration read looks at its ``cancel`` event, in seconds."""
_UNCONFINED: Final = ConfinePolicy(confine=False)


class IsolatedReadError(RhoError):
    """An isolated declaration read failed; ``kind`` says how (:data:`ReadFailure`):
    ``"timeout"``, ``"memory"``, ``"crashed"``, ``"exited"`` or ``"unpicklable"``;
    ``message`` (also ``str(err)``) names what went wrong and the tool."""

    def __init__(self, kind: ReadFailure, message: str) -> None:
        super().__init__(message)
        self.kind: ReadFailure = kind
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.message))


class _Cancelled(Exception):
    pass


def value_bounds(max_description_chars: int = DEFAULT_MAX_DESCRIPTION_CHARS,
                 max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES, max_schema_nodes: int = DEFAULT_MAX_SCHEMA_NODES,
                 max_schema_depth: int = DEFAULT_MAX_SCHEMA_DEPTH) -> dict[str, Any]:
    """What each declaration callback's value may be, as the child's ASCII JSON, for the
    checks' bounds (:func:`rho_actors.declarations.checks.check_declaration`'s): ``chars``
    by callback (a description of ``max_description_chars`` characters, each escaped as
    12 at most; a schema of ``max_schema_bytes`` UTF-8 bytes, each 3 ASCII characters at
    most), ``containers`` and ``depth`` of a schema (looser than the checks' own node and
    depth bounds, whose messages say more). A larger value could not pass the checks:
    the child reports it unencodable, naming the bound. Every other callback of
    :data:`~rho_actors.declarations.checks.DECLARATION_CALLBACKS` (a call policy's bound, a
    flag) may be 64 characters; ``retry_policy`` a :class:`~rho_actors.RetryPolicy`'s
    fields, ``annotations`` a title of 1,024 characters and the four hints."""
    return {
        "chars": {**dict.fromkeys(DECLARATION_CALLBACKS, 64),  # a number, a bool, a short text
                  "name": 1024, "description": max_description_chars * _ESCAPED_CHARS + 2,
                  "parameter_schema": max_schema_bytes * 3, "rate_group": 128 * _ESCAPED_CHARS + 2,
                  "retry_policy": 512, "annotations": 1024 * _ESCAPED_CHARS + 256},
        "containers": 8 * max_schema_nodes, "depth": max_schema_depth + 2,
    }


def declaration_answer_bytes(max_description_chars: int = DEFAULT_MAX_DESCRIPTION_CHARS,
                             max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> int:
    """The largest declaration answer read from a child (bytes): every callback's value
    at its bound (:func:`value_bounds`) and the answer's envelope; about 400 KiB with the
    default bounds. A larger frame is a malformed answer, refused before it is read."""
    chars = value_bounds(max_description_chars, max_schema_bytes)["chars"]
    return int(sum(chars.values())) + _ENVELOPE_BYTES


def _answer_limits(bounds: Mapping[str, int] | None) -> dict[str, Any]:
    known = ("max_description_chars", "max_schema_bytes", "max_schema_nodes", "max_schema_depth")
    return value_bounds(**{k: v for k, v in (bounds or {}).items() if k in known})




def _type_name(value: Any) -> str:
    try:
        return str(type(value).__qualname__)
    except BaseException:
        return "?"


def _payload_json(cb_name: str, value: Any, limits: Mapping[str, Any]) -> str:
    """One callback's answer as JSON text (see :func:`read_declaration_isolated`), within
    ``limits`` (:func:`value_bounds`)."""
    if isinstance(value, Raised):
        return json.dumps({"raised": value.description[:_MAX_TEXT_CHARS]})
    type_json = json.dumps(_type_name(value)[:_MAX_TEXT_CHARS])
    problem = wire.plain_problem(value, cb_name)
    over = False
    if problem is None:
        try:
            text = json.dumps(value, ensure_ascii=True, allow_nan=False)
        except (ValueError, RecursionError) as exc:  # e.g. an int past the digit limit
            problem = f"{cb_name}: {describe_exception(exc)}"
        else:
            max_chars = limits["chars"].get(cb_name, 64)
            found = bound_problem(text, max_containers=limits["containers"], max_depth=limits["depth"])
            if found is not None:
                problem, over = f"{cb_name}: {found}, over what a valid declaration can have", True
            elif len(text) > max_chars:
                problem, over = f"{cb_name}: {len(text):,} characters as JSON, more than {max_chars:,}", True
            else:
                return f'{{"type": {type_json}, "value": {text}}}'
    marks = ', "over": true' if over else ""
    return f'{{"type": {type_json}, "unencodable": true{marks}, "reason": {json.dumps(problem[:_MAX_TEXT_CHARS])}}}'


def _declaration_answer(payload: bytes, limits: Mapping[str, Any]) -> str:
    """The child's whole answer, as JSON text."""
    try:
        tool = pickle.loads(payload)
    except MemoryError:
        raise
    except BaseException as exc:
        message = f"the tool could not be unpickled in the child process: {describe_exception(exc)}"
        return json.dumps({"error": "unpicklable", "message": message})
    raw = read_declaration(tool)
    for cb_name, value in raw.items():
        if isinstance(value, Raised) and value.description.split(":", 1)[0] == "MemoryError":
            return json.dumps({"error": "memory", "message": f"{cb_name}() raised {value.description}"})
    parts = [f"{json.dumps(cb_name)}: {_payload_json(cb_name, value, limits)}" for cb_name, value in raw.items()]
    return '{"answers": {' + ", ".join(parts) + "}}"


def declaration_child(channel: Channel, payload: tuple[bytes, dict[str, Any]]) -> None:
    """Entry point of a declaration-read child (``payload``: the shipped tool and the
    :func:`value_bounds`): one ``DECLARATION`` answer, then it waits to be ended with
    whatever it started."""
    channel.send(wire.READY, b"")  # started: the read's timeout_s counts from here (the tool's load included)
    become_subreaper()
    try:
        text = _declaration_answer(*payload)
    except MemoryError:
        text = '{"error": "memory", "message": "MemoryError"}'
    except BaseException as exc:
        text = json.dumps({"error": "crashed", "message": f"the reader failed: {describe_exception(exc)}"})
    channel.send(wire.DECLARATION, text.encode("ascii"))
    linger(channel)


def _check_answer(answer: Any) -> dict[str, dict[str, Any]]:
    """The ``{callback: payload}`` dict of a child's answer; raises ``ValueError`` when the
    answer does not have the documented shape."""
    if type(answer) is not dict or type(answer.get("answers")) is not dict:
        raise ValueError("no answers")
    out: dict[str, dict[str, Any]] = {}
    for cb_name, payload in answer["answers"].items():
        if cb_name not in CALLBACKS or type(payload) is not dict:
            raise ValueError(f"a bad entry {cb_name!r}")
        if "raised" in payload:
            ok = set(payload) == {"raised"} and type(payload["raised"]) is str
        else:
            ok = type(payload.get("type")) is str and (
                set(payload) == {"type", "value"}
                or (payload.get("unencodable") is True and set(payload) <= {"type", "unencodable", "over", "reason"})
            )
        if not ok:
            raise ValueError(f"a bad entry {cb_name!r}")
        out[cb_name] = payload
    return out


def read_declaration_isolated(
    tool: Any,
    *,
    timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    start_timeout_s: float | None = None,
    heap_bytes: int = DEFAULT_HEAP_BYTES,
    start_method: str = "forkserver",
    cancel: threading.Event | None = None,
    confine: ConfinePolicy | None = None,
    bounds: Mapping[str, int] | None = None,
    slots: WorkerSlots | None = None,
) -> dict[str, Any]:
    """Read an untrusted tool's declaration callbacks in a fresh, throwaway child process.

    The tool is shipped with cloudpickle (by value when its module could not be imported
    there). The child leads its own process group, bounds its address space to
    ``heap_bytes`` (``RLIMIT_AS``, bytes; ``0`` for no bound), calls ``name``,
    ``description``, ``parameter_schema``, ``timeout_ms``, ``concurrency`` and the call policy's (those the
    tool has) with :func:`rho_actors.declarations.checks.read_declaration`, and answers with
    JSON text only. ``timeout_s`` (seconds) counts from the child's start: its ``READY``,
    sent before it loads the tool; the start itself (a fork server's, the child's fork and
    confinement: a loaded machine's seconds) is bounded by ``start_timeout_s`` (``None``:
    the start bound's default, :func:`~rho_actors.sandbox.start_bound.default_start_timeout_ms`,
    which ``RHO_ACTORS_START_TIMEOUT_MS`` sets), as a worker's is. The child is
    confined by ``confine`` as an untrusted worker is (DESIGN §5: its own uid, Landlock,
    limits, a cgroup bounding its whole tree to ``heap_bytes``); with ``None`` it is not,
    but it still gets only a scrubbed environment and a private ``HOME``/``TMPDIR``.

    Returns ``{callback_name: payload}`` for each callback present, where ``payload`` is
    ``{"raised": "TypeName: message"}`` when the callback raised (any
    ``BaseException``); ``{"type": "<qualname>", "value": <value>}`` when the value is
    strict plain JSON data (exact types dict/list/str/int/float/bool/None, ``str`` keys,
    finite floats); else ``{"type": "<qualname>", "unencodable": True, "reason": "..."}``
    (a ``str`` subclass, a tuple inside a schema...; ``reason`` names the first part that
    is not plain data; with ``"over": True`` when it is plain data over what a valid
    declaration can be, :func:`value_bounds` of ``bounds``, the checks' keyword
    arguments). Feed it to :func:`raw_declaration` to check it.

    The answer is bounded before it is decoded: at most :func:`declaration_answer_bytes`
    bytes, its arrays and objects counted on the text
    (:func:`rho_actors.bounded_json.loads_bounded`). With ``slots`` (the system's worker
    cap) the child takes a place under the cap first, as a worker does (an idle worker
    may be retired for it), for at most 60 s, and gives it back once it is reaped.

    Raises :class:`IsolatedReadError` with ``kind``:
    ``"timeout"`` (the child ran past ``timeout_s``, or did not start within
    ``start_timeout_s``: its process group was killed; or no place under the cap was
    free within 60 s),
    ``"memory"`` (a ``MemoryError`` past ``heap_bytes``, or the child was killed by a
    ``SIGKILL`` it did not get from here), ``"crashed"`` (the child died of a signal, or
    could not be started, or sent a malformed answer), ``"exited"`` (the child exited,
    with any code, 0 included, without an answer) or ``"unpicklable"`` (the tool could
    not be pickled here or unpickled there) or ``"cancelled"`` (``cancel`` was set: the
    child's process group was killed; it is looked at every 50 ms). Raises ``ValueError`` for a bad
    ``start_method`` (``"forkserver"`` or ``"spawn"``). The child is always reaped and
    its whole process tree killed (:func:`end_child`): nothing it started is left running
    (a ``setsid`` escape included, by its cgroup or while the child still lives).
    """
    try:
        _, payload = ship(tool)
    except Unshippable as exc:
        message = f"{label(tool)} could not be shipped to a child process: {exc}"
        raise IsolatedReadError("unpicklable", message) from None
    limits = _answer_limits(bounds)
    max_bytes = declaration_answer_bytes(**{k: v for k, v in (bounds or {}).items()
                                            if k in ("max_description_chars", "max_schema_bytes")})
    claim: list[bool] = []  # the place under the cap, once taken (given back once, whatever interrupts)
    try:
        if slots is not None and not _take_slot(slots, cancel, claim):
            raise IsolatedReadError("timeout", f"reading the declaration of {label(tool)} found no place under the "
                                    f"worker cap of {slots.limit} within {_SLOT_WAIT_S:g} s")
        start_s = default_start_timeout_ms() / 1000 if start_timeout_s is None else start_timeout_s
        frame = _read_frame(tool, payload, limits, max_bytes, start_method, (start_s, timeout_s), heap_bytes, cancel,
                            confine)
    finally:
        if slots is not None:
            slots.give_back(claim)
    try:
        answer = wire.decode_json(frame, max_containers=limits["containers"] + 16, max_depth=limits["depth"] + 3)
    except wire.WireError as exc:
        raise IsolatedReadError(
            "crashed", f"the declaration read of {label(tool)} sent a malformed answer ({describe_exception(exc)})"
        ) from None
    if type(answer) is dict and "error" in answer:
        kind, message = answer.get("error"), str(answer.get("message", ""))
        if kind == "memory":
            raise IsolatedReadError(
                "memory", f"reading the declaration of {label(tool)} exceeded its heap bound of "
                f"{mib(heap_bytes)}: {message}"
            )
        if kind == "unpicklable":
            raise IsolatedReadError("unpicklable", f"{label(tool)}: {message}")
        raise IsolatedReadError("crashed", f"reading the declaration of {label(tool)} failed: {message}")
    try:
        return _check_answer(answer)
    except ValueError as exc:
        raise IsolatedReadError(
            "crashed", f"the declaration read of {label(tool)} sent a malformed answer ({exc})"
        ) from None


def _take_slot(slots: WorkerSlots, cancel: threading.Event | None, claim: list[bool]) -> bool:
    """A place under the worker cap, as a worker takes one (an idle worker retired for
    it when the cap is full), put in ``claim`` as it is taken; ``False`` after
    :data:`_SLOT_WAIT_S` or once ``cancel`` is set."""
    deadline = time.monotonic() + _SLOT_WAIT_S
    while not slots.try_acquire(claim):
        if cancel is not None and cancel.is_set():
            return False
        if slots.retire_idle():
            continue
        if not slots.wait(deadline):
            return False
    return True


def _read_frame(tool: Any, payload: bytes, limits: dict[str, Any], max_bytes: int, start_method: str,
                bounds_s: tuple[float, float], heap_bytes: int, cancel: threading.Event | None,
                confine: ConfinePolicy | None) -> bytes:
    """The read child's answer frame (at most ``max_bytes``) within ``bounds_s`` (its
    start's, then its read's, seconds); the child is ended."""
    ctx = context(start_method)
    enclosure = Enclosure(confine or _UNCONFINED, heap_bytes or None)
    try:
        try:
            child = spawn(ctx, declaration_child, (payload, limits), enclosure.setup, name="rho-declaration-read",
                          label="a declaration read")  # the tool's own label: only on failure
        except Exception as exc:
            raise IsolatedReadError(
                "crashed", f"could not start a child process to read the declaration of {label(tool)}: "
                f"{describe_exception(exc)}"
            ) from None
        enclosure.started(child.pid)
        try:
            return await_answer(child, lambda: f"reading the declaration of {label(tool)}", wire.DECLARATION,
                                max_bytes, bounds_s[1], heap_bytes, cancel, enclosure, start_s=bounds_s[0])
        finally:
            close(child.proc, child.channel.conn)
    finally:
        enclosure.remove()  # what is left of its tree (its cgroup), its private folder


def become_subreaper() -> None:
    """In a throwaway child: adopt every orphaned descendant (Linux
    ``PR_SET_CHILD_SUBREAPER``), so that a daemon a tool starts, even one that leaves its
    process group, stays in the child's process tree for :func:`end_child` to find.
    Best effort: nothing happens where ``prctl`` is unavailable."""
    with contextlib.suppress(Exception):
        LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def linger(channel: Channel) -> None:
    """In a throwaway child, after its answer: wait until the parent ends it (or closes
    the pipe), so the child keeps holding its descendants until :func:`end_child`."""
    with contextlib.suppress(BaseException):
        while True:
            channel.recv()


def end_child(child: Child, enclosure: Enclosure | None = None) -> int | None:
    """Kill a throwaway child and everything it started, then reap it; its exit code
    (``None`` if it could not be reaped within 5 s). The one way a throwaway child ends
    (declaration reads, plugin discovery, selftests).

    While the child is still alive (a subreaper, see :func:`become_subreaper`, so it
    still holds every orphan of its tree) its whole tree is killed: by ``enclosure``
    (:meth:`~rho_actors.sandbox.confine.enclosure.Enclosure.kill`: the tree frozen and killed,
    ``setsid`` escapes included, then its cgroup) when there is one, else by
    :func:`rho_actors.sandbox.confine.trees.kill_tree`; then the child's process group,
    through its pidfd (``child.held``: the group it led, even once it was reaped, never a
    group given its pid since). A child already reaped is not walked (its pid may be
    reused): the caller's ``enclosure.remove()`` kills what is left in its cgroup."""
    proc = child.proc
    if not child.held.reaped():
        if enclosure is not None:
            enclosure.kill()
        else:
            with contextlib.suppress(psutil.Error):
                kill_tree(proc.pid)
    child.held.kill(group=True)
    return reap(proc, _REAP_TIMEOUT_S)


def await_answer(
    child: Child, describe: Callable[[], str], tag: bytes, max_bytes: int, timeout_s: float, heap_bytes: int | None,
    cancel: threading.Event | None = None, enclosure: Enclosure | None = None, start_s: float | None = None,
) -> bytes:
    """A throwaway child's one answer frame (tag ``tag``, at most ``max_bytes``) within
    ``timeout_s`` seconds (with ``start_s``: of its ``READY``, which must come within
    ``start_s`` seconds); ``describe()`` (``"reading the declaration of X"``, called only
    on failure) names the read in errors. In every case the child and its whole process
    tree are ended (:func:`end_child`, through ``enclosure`` when the child has one)
    before this returns or raises :class:`IsolatedReadError`."""
    proc, channel = child.proc, child.channel
    starting = start_s is not None
    deadline = time.monotonic() + (start_s if start_s is not None else timeout_s)
    try:
        while True:  # in slices, to notice ``cancel``; the channel keeps partial frames
            try:
                got, frame = channel.recv(min(deadline, time.monotonic() + _CANCEL_POLL_S), max_bytes)
                if starting and got == wire.READY and not frame:
                    starting, deadline = False, time.monotonic() + timeout_s
                    continue
                if got != tag:
                    raise Malformed(f"an unexpected frame tag {got!r}")
                break
            except DeadlineReached:
                if cancel is not None and cancel.is_set():
                    raise _Cancelled from None
                if time.monotonic() >= deadline:
                    raise
    except _Cancelled:
        end_child(child, enclosure)
        what = describe()
        raise IsolatedReadError("cancelled", f"{what} was cancelled; its process tree was killed") from None
    except DeadlineReached:
        end_child(child, enclosure)
        what = describe()
        if starting:
            raise IsolatedReadError("timeout", f"{what}: its process did not start within {start_s:g} s (the start "
                                    f"bound, {START_TIMEOUT_ENV}); its process tree was killed") from None
        raise IsolatedReadError(
            "timeout", f"{what} took longer than {timeout_s:g} s; its process tree was killed"
        ) from None
    except Malformed as exc:
        end_child(child, enclosure)
        what = describe()
        raise IsolatedReadError("crashed", f"{what}: its process sent a malformed answer ({exc})") from None
    except EOFError:
        code = reap(proc, _EXIT_GRACE_S)
        end_child(child, enclosure)
        what = describe()
        if code is None:
            raise IsolatedReadError(
                "crashed", f"{what}: its process closed its pipe without an answer; its process tree was killed"
            ) from None
        raise _read_ended(what, code, heap_bytes) from None
    except BaseException:
        end_child(child, enclosure)
        raise
    end_child(child, enclosure)  # answered: nothing it started outlives the read
    return frame


def _read_ended(what: str, code: int, heap_bytes: int | None) -> IsolatedReadError:
    if code == -signal.SIGKILL:
        return IsolatedReadError(
            "memory", f"{what} was killed by SIGKILL (not by the sandbox: most likely the kernel's "
            f"out-of-memory killer; heap bound {mib(heap_bytes)})"
        )
    if code < 0:
        return IsolatedReadError("crashed", f"{what} crashed: the child process died of {signal_name(-code)}")
    return IsolatedReadError("exited", f"{what} exited with code {code} without an answer")


@functools.lru_cache(maxsize=256)
def _opaque_type(display: str) -> type:
    """A class named ``display``: stands for a value that did not come back as plain data,
    so that :func:`check_declaration` names it (``"expected str, got MyStr"``)."""
    return type(display, (_Opaque,), {"__slots__": ()})


class _Opaque:
    """Base of the stand-ins made by :func:`_opaque_type`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def raw_declaration(payload: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Turn :func:`read_declaration_isolated`'s answer into the raw dict
    :func:`rho_actors.declarations.checks.check_declaration` takes.

    ``{"raised": text}`` becomes the marker :func:`read_declaration` uses for a raise
    (reported as ``"name() raised ValueError: ..."``); ``{"value": v}`` becomes ``v``; an
    unencodable value becomes a stand-in object whose type is named after the reported
    type, so the check rejects it naming that type (``"name: expected str, got MyStr"``),
    and for a dict or list holding something that is not JSON data, what that is
    (``"parameter_schema: expected dict, got dict holding non-JSON data
    (parameter_schema.enum: a tuple is not JSON data)"``), or why a plain value could not
    be sent, or over what a valid declaration can be (``"description: expected str, got
    str over the bounds of a declaration (description: 20,000,002 characters as JSON,
    more than 196,610)"``). A stand-in for ``timeout_ms``
    or ``concurrency`` means their defaults, as any bad value does.
    """
    raw: dict[str, Any] = {}
    for cb_name, answer in payload.items():
        if "raised" in answer:
            raw[cb_name] = Raised(str(answer["raised"]))
        elif "value" in answer:
            raw[cb_name] = answer["value"]
        else:
            type_name = str(answer.get("type", "?"))
            reason = answer.get("reason")
            display = type_name
            if answer.get("over") is True:  # plain data over what a valid declaration can be
                display = f"{type_name} over the bounds of a declaration ({reason})"
            elif type_name in ("dict", "list"):
                display = f"{type_name} holding non-JSON data" + (f" ({reason})" if reason else "")
            elif reason:  # plain data, but not sendable (too long, a huge int...)
                display = f"{type_name} that cannot be sent ({reason})"
            raw[cb_name] = _opaque_type(display)()
    return raw
