"""The messages of a LoopActor, the name it is registered under and its session folder
(internal).

The host's :class:`~rho_actors.loop.Loop` tells ``RunTurn`` and asks ``Offered``,
``Running`` and ``SetWithheld``. A call's result is no message: its ``reply`` settles
it in its turn directly (see :mod:`rho_actors.loop_actor`).
"""

from __future__ import annotations

import concurrent.futures
import os
from dataclasses import dataclass
from pathlib import Path

from rho_actors.tool import ToolCall, ToolResult

__all__ = ["Offered", "RunTurn", "Running", "SetWithheld", "loop_name", "make_session_folder"]


def loop_name(session_id: str) -> str:
    """The name a session's LoopActor is registered under (``whereis``)."""
    return f"loop:{session_id}"


def make_session_folder(path: Path) -> Path:
    """Create a session's private folder ``data_dir/sessions/<id>`` unless it exists, and
    return it: the one place it is made, on first use (before the session's first call,
    or when the host asks for :attr:`rho_actors.Loop.data_dir`), never at the loop's
    start. Raises ``OSError`` when it cannot be made."""
    try:
        os.mkdir(path)  # its parent exists since the system started: one system call
    except FileExistsError:
        pass
    except FileNotFoundError:  # the sessions folder was removed meanwhile
        path.mkdir(parents=True, exist_ok=True)
    return path


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
