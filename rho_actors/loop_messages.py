"""The messages of a LoopActor, and the name it is registered under (internal).

The host's :class:`~rho_actors.loop.Loop` tells ``RunTurn`` and asks ``Offered``,
``Running`` and ``SetWithheld``; a call's isolation tells ``CallDone`` (through the
call's ``reply``); a turn's cancel token tells ``CancelTurn`` when it is set.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
from dataclasses import dataclass
from typing import Any

from rho_actors.cancel import CancelToken
from rho_actors.tool import ToolCall, ToolResult

__all__ = ["CallDone", "CancelTurn", "Offered", "RunTurn", "Running", "SetWithheld", "loop_name"]


def loop_name(session_id: str) -> str:
    """The name a session's LoopActor is registered under (``whereis``)."""
    return f"loop:{session_id}"


@dataclass(frozen=True, slots=True)
class RunTurn:
    """Run ``calls`` as one turn; ``future`` gets their results, in order.
    ``trace_context``: the OpenTelemetry context current in the submitting thread (the
    parent of the calls' spans; None while the system's telemetry is off). Setting
    ``cancel`` cancels the turn; each call runs in a copy of ``context`` (the
    submitter's ``contextvars``)."""

    calls: tuple[ToolCall, ...]
    future: concurrent.futures.Future[list[ToolResult]]
    trace_context: Any = None
    cancel: CancelToken | None = None
    context: contextvars.Context | None = None


@dataclass(frozen=True, slots=True)
class CancelTurn:
    """The host cancelled turn ``turn``."""

    turn: int


@dataclass(frozen=True, slots=True)
class CallDone:
    """Call ``index`` of turn ``turn`` has its ``result``."""

    turn: int
    index: int
    result: ToolResult


@dataclass(frozen=True, slots=True)
class SetWithheld:
    """Replace the names the loop does not offer."""

    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class Offered:
    """Asks for the checked declarations the loop offers now."""


@dataclass(frozen=True, slots=True)
class Running:
    """Asks for the calls running now."""
