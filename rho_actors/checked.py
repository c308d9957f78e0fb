"""The checked declarations of untrusted tools, process-wide (internal).

Filled by each system's DeclarationActor (:mod:`rho_actors.declaration_actor`) when an
untrusted tool's isolated read is done, and read by :func:`rho_actors.timeout_ms` and
:func:`rho_actors.declaration`, which must not run an untrusted tool's code to answer.
It imports nothing of rho_actors, so the tool contract can use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rho_actors.declarations import Rejected
    from rho_actors.tool import ToolInfo

__all__ = ["checked_untrusted", "forget_checked", "keep_checked"]

_table: dict[int, tuple[Any, Any]] = {}


def checked_untrusted(tool: Any) -> ToolInfo | Rejected | None:
    """The checked declaration (or the rejection) of an untrusted tool a system has read,
    or ``None`` when none has (yet)."""
    held = _table.get(id(tool))
    return held[1] if held is not None and held[0] is tool else None


def keep_checked(tool: Any, outcome: ToolInfo | Rejected) -> None:
    """Record ``outcome`` as ``tool``'s checked declaration (for the tool's life)."""
    _table[id(tool)] = (tool, outcome)


def forget_checked(tool: Any) -> None:
    """Drop ``tool``'s entry (it was unregistered)."""
    held = _table.get(id(tool))
    if held is not None and held[0] is tool:
        del _table[id(tool)]
