"""The checked declarations of untrusted tools, as the systems that read them hold them
(internal).

Each system's DeclarationActor (:mod:`rho_actors.registry.declaration_actor`) owns a
:class:`CheckedCache` (two systems in one process share nothing: each reads and checks an
untrusted tool itself, and unregistering it in one leaves the other's entry alone).
:func:`checked_untrusted` answers :func:`rho_actors.timeout_ms` and
:func:`rho_actors.declaration`, which must not run an untrusted tool's code, from the caches
of the systems alive now. It imports nothing of rho_actors, so the tool contract can use it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Generic, TypeVar

__all__ = ["CheckedCache", "checked_untrusted"]

T = TypeVar("T")


class CheckedCache(Generic[T]):
    """One system's checked declarations, by tool: each a ``ToolInfo`` or a ``Rejected``
    (``T``, so that this module needs neither). Made by the system's
    ``DeclarationState``; seen by :func:`checked_untrusted` while it lives."""

    __slots__ = ("__weakref__", "_held")

    def __init__(self) -> None:
        self._held: dict[int, tuple[Any, T]] = {}
        with _lock:
            _caches.add(self)

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


_lock = threading.Lock()
_caches: weakref.WeakSet[CheckedCache[Any]] = weakref.WeakSet()


def checked_untrusted(tool: Any) -> object | None:
    """The checked declaration (a ``ToolInfo``) or the rejection (a ``Rejected``) of an
    untrusted tool that a live system has read, or ``None`` when none has (yet)."""
    with _lock:
        caches = list(_caches)
    for cache in caches:
        outcome: object | None = cache.get(tool)
        if outcome is not None:
            return outcome
    return None
