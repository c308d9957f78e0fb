"""The governor's moves of a step's calls, recorded in the session's transcript as the
call lifecycle's ``call`` records (DESIGN §4 "The lifecycle of a call", "The governor").

While a step's turn runs, :func:`recording_moves` watches the session's calls (a
session that can: ``loop.watch_calls``) and writes each move as a ``call`` record:
``queued`` (waiting for a place or a rate token, with its ``reason``), ``retried`` (an
attempt failed: ``attempt``, ``error_kind``, ``delay_s``) and ``running`` (a later
attempt started). A move the lifecycle does not allow from the call's last recorded
state is made legal by recording ``running`` (attempt 1) first, as a call that only ran
has no record of its own (``running`` → ``retried``); one that cannot be made legal is
not recorded (logged). A record that cannot be written is logged: the call goes on.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from loguru import logger

from rho_actors.agent.transcript import Transcript, TranscriptError
from rho_actors.lifecycle import allowed
from rho_actors.tool import ToolCall

__all__ = ["recording_moves"]


@contextlib.contextmanager
def recording_moves(loop: Any, transcript: Transcript, step: int, calls: Sequence[ToolCall]) -> Iterator[None]:
    """Record the moves of ``calls`` (the ``step``'s) in ``transcript`` while the block
    runs (nothing when ``loop`` has no ``watch_calls``)."""
    watch = getattr(loop, "watch_calls", None)
    if watch is None or not calls:
        yield
        return
    index = {call.id: i for i, call in enumerate(calls)}
    states: dict[str, str] = {}
    lock = threading.Lock()

    def moved(call_id: str, state: str, fields: dict[str, Any], sha: str) -> None:
        i = index.get(call_id)
        if i is None:
            return
        name = calls[i].name
        with lock:
            before = states.get(call_id)
            try:
                if not allowed(before, state) and allowed(before, "running") and allowed("running", state):
                    transcript.call(step, i, "running", call_id=call_id, name=name, arguments_sha256=sha, attempt=1)
                    before = "running"
                if not allowed(before, state):
                    logger.warning("call {}: no move from {} to {}; not recorded", call_id, before, state)
                    return
                given: dict[str, Any] = {**fields, **({"arguments_sha256": sha} if state == "running" else {})}
                transcript.call(step, i, state, call_id=call_id, name=name, sync=state != "queued",  # a wait: the
                                **given)  # next record makes it durable (one fsync a wait saved)
                states[call_id] = state
            except (OSError, ValueError, TranscriptError) as exc:
                logger.warning("call {}: its move to {} could not be recorded: {}", call_id, state, exc)

    stop = watch(moved)
    try:
        yield
    finally:
        stop()
