"""The checked declarations of untrusted tools, as the systems that read them hold them
(internal).

Each system's DeclarationActor (:mod:`rho_actors.registry.declaration_actor`) owns a
:class:`CheckedCache` (two systems in one process share nothing: each reads and checks an
untrusted tool itself, and unregistering it in one leaves the other's entry alone).
:func:`rho_actors.tool.checked_untrusted` answers :func:`rho_actors.timeout_ms` and
:func:`rho_actors.declaration`, which must not run an untrusted tool's code, from the caches
of the systems alive now (each cache is tracked there while it lives: the tool contract
needs nothing of this module).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from rho_actors.tool import track_checked

__all__ = ["CheckedCache"]

T = TypeVar("T")


class CheckedCache(Generic[T]):
    """One system's checked declarations, by tool: each a ``ToolInfo`` or a ``Rejected``
    (``T``, so that this module needs neither). Made by the system's
    ``DeclarationState``; seen by :func:`rho_actors.tool.checked_untrusted` while it lives."""

    __slots__ = ("__weakref__", "_held")

    def __init__(self) -> None:
        self._held: dict[int, tuple[Any, T]] = {}
        track_checked(self)

    def get(self, tool: Any) -> T | None:
        """``tool``'s outcome, or ``None``."""
        held = self._held.get(id(tool))
        return held[1] if held is not None and held[0] is tool else None

    def put(self, tool: Any, outcome: T) -> None:
        """Keep ``outcome`` as ``tool``'s (for the tool's life: it is held here)."""
        self._held[id(tool)] = (tool, outcome)

    def forget(self, tool: Any) -> None:
        """Drop ``tool``'s outcome (no-op when it has none)."""
        held = self._held.get(id(tool))
        if held is not None and held[0] is tool:
            del self._held[id(tool)]
