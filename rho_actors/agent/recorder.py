"""A step's results written to the session's transcript as each call settles (the agent
loop's recorder): a result whose call has run is never lost to a crash of the host while
the turn's other calls still run."""

from __future__ import annotations

import threading
from dataclasses import replace

from loguru import logger

from rho_actors.agent.transcript import Transcript, TranscriptError
from rho_actors.lifecycle import pending_call
from rho_actors.results import text as result_text
from rho_actors.tool import ToolResult

__all__ = ["Recorder", "with_text"]


class Recorder:
    """Writes a step's results to the transcript as each call settles (from the settling threads), so a result whose
    call has run is never lost to a crash of the host while the turn's other calls still run; each index once."""

    def __init__(self, transcript: Transcript, step: int) -> None:
        self._transcript = transcript
        self._step = step
        self._lock = threading.Lock()
        self._done: set[int] = set()

    def record(self, index: int, result: ToolResult, *, quiet: bool = True) -> None:
        """Record ``result`` for call ``index`` unless it is recorded already. ``quiet``
        (from a settling thread): a write that fails is logged and left for the end of
        the turn, where it raises."""
        if pending_call(result) is not None:  # a deferred call's: it waits, recorded as pending
            return
        with self._lock:
            if index in self._done:
                return
            try:
                task_id = result.details.get("task_id") if result.ok and isinstance(result.details, dict) else None
                if isinstance(task_id, str):  # a background call: its lifecycle goes on as a task
                    self._transcript.call(self._step, index, "backgrounded", call_id=result.call_id,
                                          name=result.name, task_id=task_id)
                self._transcript.result(self._step, index, with_text(result))
            except (OSError, ValueError, RecursionError, TranscriptError):  # the disk, or the file gone
                if not quiet:
                    raise
                logger.exception("step {}: the result of call {} could not be recorded yet", self._step, index)
                return
            self._done.add(index)


def with_text(result: ToolResult) -> ToolResult:
    """An error result always carries text (providers refuse an empty one)."""
    if result.ok or result.content.strip():
        return result
    return replace(result, content=result_text("empty_error", kind=result.error_kind))
