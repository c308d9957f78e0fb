"""Decisions through a session's transcript (DESIGN §4 "Approvals"): the lock every
decision takes, how a first decision is named in a refusal, and :func:`decide`, which
records a decision from any process (``rho-actors approve/reject``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptBusyError
from rho_actors.declarations.arguments import ArgumentsError, decode_arguments
from rho_actors.errors import RhoError
from rho_actors.lifecycle import CallTrack, PendingCall
from rho_actors.results import failure
from rho_actors.tool import ToolResult

__all__ = [
    "LOCK_WAIT_S", "ApprovalError", "call_records_appended", "decide", "decided_result", "decoded_or_empty",
    "first_decision", "locked_transcript",
]

LOCK_WAIT_S: Final = 30.0
"""How long (seconds) a decision waits for the session's transcript held by a running prompt."""
_CALL_RECORD: Final = b'"type": "call"'  # how every call record of a transcript reads (its JSON, as Transcript writes)


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


def call_records_appended(path: Path, offset: int) -> tuple[bool, int]:
    """Whether the bytes of the transcript at ``path`` from ``offset`` on hold a ``call``
    record (a decision, from any process), and the offset to look from next time: only
    what was appended is read, never the whole file again (a session's other records, its
    calls' arguments and results, may be large). Raises ``OSError``."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        start = offset if offset <= size else 0  # a shorter file: a new one
        file.seek(start)
        found, kept = False, b""
        while chunk := file.read(1 << 20):
            found = found or _CALL_RECORD in kept + chunk
            kept = (kept + chunk)[-len(_CALL_RECORD):]
            start += len(chunk)
    return found, max(0, start - len(_CALL_RECORD))  # a record cut short at the end is looked at again


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
    approval deadline, or waiting for an external result; ``ValueError`` for a bad
    decision or a rejection without message; ``OSError`` when the transcript cannot be
    used."""
    if decision not in ("approved", "rejected"):
        raise ValueError(f"decision must be 'approved' or 'rejected', got {decision!r}")
    if decision == "rejected" and (not isinstance(message, str) or not message.strip()):
        raise ValueError("a rejection needs a message for the model")
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
        if expires is not None and time.time() >= expires:
            raise ApprovalError(f"call {call_id} of session {session_id!r} is past its approval deadline")
        extra: dict[str, Any] = {"message": message} if decision == "rejected" and message is not None else {}
        transcript.call(track.step, track.index, "decided", call_id=call_id, name=track.name, decision=decision,
                        decided_by=decided_by, arguments_sha256=pending["arguments_sha256"], **extra)
    return f"call {call_id} of session {session_id} {decision}{'' if decided_by is None else f' by {decided_by}'}"


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
