"""The messages of a LoopActor, and the name it is registered under (internal).

The host's :class:`~rho_actors.loop.Loop` tells ``RunTurn`` and asks ``Offered``,
``Running`` and ``SetWithheld``. A call's result is no message: its ``reply`` settles
it in its turn directly (see :mod:`rho_actors.loop_actor`).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

from rho_actors.tool import ToolCall, ToolResult

__all__ = ["Offered", "RunTurn", "Running", "SetWithheld", "loop_name"]


def loop_name(session_id: str) -> str:
    """The name a session's LoopActor is registered under (``whereis``)."""
    return f"loop:{session_id}"


@dataclass(frozen=True, slots=True)
class RunTurn:
    """Run ``calls`` as one turn; ``future`` gets their results, in order."""

    calls: tuple[ToolCall, ...]
    future: concurrent.futures.Future[list[ToolResult]]


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
