"""Byte budgets for tool results, per turn and per session (DESIGN §4 "Budgets").

A result's size is the UTF-8 length of its text plus the bytes of its images, sounds
and embedded resources (:func:`result_bytes`). Each session's LoopActor charges every
result of a dispatched call to its turn and to its session before recording it; a
result that would take either past its budget is replaced by an ``output_limit`` error
saying so (its text and blocks are dropped), so that what the host keeps for one
turn, or one session, stays bounded whatever tools return: 16 parallel calls each
returning two 31 MiB images cost one turn at most its budget, not 1 GiB. A session's
use counts from its loop's start and never refills; :meth:`ResultBudgets.stats` (in
``ActorSystem.stats()["budgets"]``) shows both caps and each running session's use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Final

from loguru import logger

from rho_actors.agent.image_store import DEFAULT_MAX_IMAGE_STORE_BYTES
from rho_actors.results import capped, failure
from rho_actors.tool import ToolResult

__all__ = [
    "DEFAULT_MAX_SESSION_RESULT_BYTES", "DEFAULT_MAX_TURN_RESULT_BYTES",
    "ResultBudgets", "over_budget", "result_bytes",
]

DEFAULT_MAX_TURN_RESULT_BYTES: Final = 64 * 2**20
"""Default budget of the results of one turn, in bytes (64 MiB)."""
DEFAULT_MAX_SESSION_RESULT_BYTES: Final = 512 * 2**20
"""Default budget of the results of one session's loop, in bytes (512 MiB)."""


def result_bytes(result: ToolResult) -> int:
    """The bytes ``result`` costs a budget: its text (UTF-8), its images' and sounds'
    data, and its embedded resources' text (UTF-8) or blob (a text resource's text
    counts twice: it is also in the model's text)."""
    content = result.content
    text = len(content) if content.isascii() else len(content.encode("utf-8", "surrogatepass"))  # ASCII: a byte each
    if not result.blocks and not result.images:  # text only, the usual case
        return text
    return (text + sum(len(i.data) for i in result.images)
            + sum(len(a.data) for a in result.audio) + sum(r.size for r in result.resources))


def over_budget(session_id: str, result: ToolResult, size: int, over: tuple[str, int, int],
                max_chars: int) -> ToolResult:
    """The ``over_budget`` error (capped at ``max_chars``) that replaces ``result`` (``size``
    bytes) in session ``session_id``: ``over`` is :meth:`ResultBudgets.charge`'s refusal."""
    scope, budget, left = over
    logger.warning("loop {}: the result of call {} ({} bytes) is over its {}'s budget of {} bytes; left out",
                   session_id, result.call_id, size, scope, budget)
    refusal = failure("over_budget", result.call_id, result.name, result.duration_ms, size=size, scope=scope,
                      budget=budget, left=max(0, left))
    return capped(refusal, max_chars)


@dataclass(slots=True)
class _Use:
    session_bytes: int = 0
    turns: dict[int, int] | None = None
    refused: int = 0


class ResultBudgets:
    """The system's result budgets (thread-safe): ``per_turn`` and ``per_session``
    bytes. Raises ``ValueError`` for a budget that is not a positive ``int``."""

    def __init__(self, per_turn: int = DEFAULT_MAX_TURN_RESULT_BYTES,
                 per_session: int = DEFAULT_MAX_SESSION_RESULT_BYTES) -> None:
        for label, value in (("max_turn_result_bytes", per_turn), ("max_session_result_bytes", per_session)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{label} must be a positive int (bytes), got {value!r}")
        self.per_turn = per_turn
        self.per_session = per_session
        self._lock = threading.Lock()
        self._sessions: dict[str, _Use] = {}

    def charge(self, session: str, turn: int, size: int, *, alone: bool = False) -> tuple[str, int, int] | None:
        """Charge ``size`` bytes to ``turn`` of ``session``: ``None`` when admitted, else
        ``(scope, budget, left)`` (``scope`` ``"turn"`` or ``"session"``; nothing is charged).
        ``alone``: the turn's one call, nothing else is charged to it (its share is not
        kept, and it needs no :meth:`turn_done`)."""
        with self._lock:
            use = self._sessions.get(session)
            if use is None:
                use = self._sessions[session] = _Use(turns={})
            assert use.turns is not None
            in_turn = 0 if alone else use.turns.get(turn, 0)
            if in_turn + size > self.per_turn:
                use.refused += 1
                return "turn", self.per_turn, self.per_turn - in_turn
            if use.session_bytes + size > self.per_session:
                use.refused += 1
                return "session", self.per_session, self.per_session - use.session_bytes
            if not alone:
                use.turns[turn] = in_turn + size
            use.session_bytes += size
            return None

    def turn_done(self, session: str, turn: int) -> None:
        """``turn`` of ``session`` is over: its use no longer counts against a turn."""
        with self._lock:
            use = self._sessions.get(session)
            if use is not None and use.turns is not None:
                use.turns.pop(turn, None)

    def forget(self, session: str) -> None:
        """``session``'s loop stopped: drop its use."""
        with self._lock:
            self._sessions.pop(session, None)

    def stats(self) -> dict[str, Any]:
        """``{"max_turn_result_bytes": int, "max_session_result_bytes": int,
        "max_transcript_image_bytes": int, "sessions": {session_id: {"session_bytes": int,
        "turn_bytes": int, "refused": int}}}``: ``turn_bytes`` sums the turns under way,
        ``refused`` counts results left out; ``max_transcript_image_bytes`` bounds each
        transcript's image store (:mod:`rho_actors.agent.image_store`)."""
        with self._lock:
            sessions = {
                sid: {"session_bytes": use.session_bytes, "turn_bytes": sum((use.turns or {}).values()),
                      "refused": use.refused}
                for sid, use in self._sessions.items()
            }
        return {"max_turn_result_bytes": self.per_turn, "max_session_result_bytes": self.per_session,
                "max_transcript_image_bytes": DEFAULT_MAX_IMAGE_STORE_BYTES, "sessions": sessions}
