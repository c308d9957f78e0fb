"""The messages of a LoopActor, the name it is registered under and its session folder
(internal).

The host's :class:`~rho_actors.loop.Loop` tells ``RunTurn`` and asks ``Offered``,
``Running`` and ``SetWithheld``; a turn's cancel token tells ``CancelTurn`` when it is
set. A call's result is no message: its ``reply`` settles it in its turn directly (see
:mod:`rho_actors.loop_actor`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rho_actors.cancel import CancelToken
from rho_actors.files import private_dir
from rho_actors.tool import ToolCall, ToolResult

__all__ = ["CancelTurn", "Offered", "RunTurn", "Running", "SetWithheld", "loop_name", "make_session_folder"]


def loop_name(session_id: str) -> str:
    """The name a session's LoopActor is registered under (``whereis``)."""
    return f"loop:{session_id}"


def make_session_folder(session_dir: Path) -> Path:
    """Create a session's private folder ``session_dir`` (``data_dir/sessions/<id>``)
    unless it exists, and return it: the one place a session folder is made, on first
    use (before the session's first call, or when the host asks for
    :attr:`rho_actors.Loop.data_dir`), never at the loop's start. Made safely by
    :func:`rho_actors.files.private_dir`: ``sessions`` and the session folder are real
    folders reached without following a symlink, mode ``0700``. Raises
    :class:`rho_actors.files.UnsafePathError` when one is a symlink or no folder, and
    ``OSError`` when it cannot be made."""
    return private_dir(session_dir.parent.parent, session_dir.parent.name, session_dir.name)


@dataclass(frozen=True, slots=True)
class RunTurn:
    """Run ``calls`` as one turn; ``future`` gets their results, in order.
    ``trace_context``: the OpenTelemetry context current in the submitting thread (the
    parent of the calls' spans; None while the system's telemetry is off). Setting
    ``cancel`` cancels the turn; each call runs in a copy of ``context`` (the
    submitter's ``contextvars``); ``on_result(index, result)`` is told each dispatched
    call's result as it settles, from the thread settling it."""

    calls: tuple[ToolCall, ...]
    future: concurrent.futures.Future[list[ToolResult]]
    trace_context: Any = None
    cancel: CancelToken | None = None
    context: contextvars.Context | None = None
    on_result: Callable[[int, ToolResult], None] | None = None


@dataclass(frozen=True, slots=True)
class CancelTurn:
    """The host cancelled turn ``turn``."""

    turn: int


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
