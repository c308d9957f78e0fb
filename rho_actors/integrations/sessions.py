"""What the framework adapters share: which rho session a framework's call runs in,
and the call id it runs under (DESIGN §6c).

An adapter is given a :class:`rho_actors.Loop` (every call runs in that session) or an
:class:`rho_actors.ActorSystem` (each of the framework's threads or conversations is a
rho session of that id, started on first use and kept until :meth:`SessionLoops.close`
or the system stops).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

from rho_actors.loop.handle import Loop
from rho_actors.tool import ToolInfo

if TYPE_CHECKING:
    from rho_actors.declarations.toolset import ToolEntry
    from rho_actors.system import ActorSystem

__all__ = ["SessionLoops", "call_id", "kept_while_unchanged"]

_Made = TypeVar("_Made")


def kept_while_unchanged(
    made: Mapping[str, tuple[ToolInfo, _Made]], offered: Iterable[ToolInfo], make: Callable[[ToolInfo], _Made],
) -> dict[str, tuple[ToolInfo, _Made]]:
    """A framework's tools for the ``offered`` declarations, by name: the one in ``made``
    (what the last call returned) for a declaration unchanged since (the same object, or
    equal), else ``make(info)``. The caller keeps the result for its next call."""
    now: dict[str, tuple[ToolInfo, _Made]] = {}
    for info in offered:
        known = made.get(info.name)
        now[info.name] = known if known is not None and (known[0] is info or known[0] == info) else (info, make(info))
    return now


def call_id(framework_id: object) -> str:
    """The rho call id of a framework's tool call: its own id when it is a non-empty
    ``str``, else a fresh random one (``"call_<32 hex digits>"``)."""
    if isinstance(framework_id, str) and framework_id:
        return str.__str__(framework_id)
    return f"call_{uuid.uuid4().hex}"


class SessionLoops:
    """The loop a framework's call runs in: ``target`` itself when it is a
    :class:`Loop`, else (an :class:`ActorSystem`) the loop of session ``session_id``,
    started on first use. Raises ``TypeError`` for a ``target`` that is neither."""

    def __init__(self, target: Loop | ActorSystem, *, what: str) -> None:
        from rho_actors.system import ActorSystem

        if not isinstance(target, Loop | ActorSystem):
            raise TypeError(f"{what} takes a rho_actors.Loop or ActorSystem, got {type(target).__name__}")
        self._loop = target if isinstance(target, Loop) else None
        self._system = target if isinstance(target, ActorSystem) else None
        self._what = what
        self._loops: dict[str, Loop] = {}
        self._lock = threading.Lock()

    def loop(self, session_id: str | None) -> Loop:
        """The loop for the framework's thread or conversation ``session_id``. Raises
        ``ValueError`` when sessions follow the framework's and it gave none (or one
        rho refuses as a session id: see :meth:`ActorSystem.start_loop`)."""
        if self._loop is not None:
            return self._loop
        assert self._system is not None
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(
                f"{self._what} was given an ActorSystem, so each call needs the framework's thread or "
                f"conversation id as its rho session; this call has none (got {session_id!r})"
            )
        with self._lock:
            loop = self._loops.get(session_id)
            if loop is None or not loop.alive:
                loop = self._system.start_loop(session_id)
                self._loops[session_id] = loop
            return loop

    def offered(self, session_id: str | None = None) -> list[ToolInfo]:
        """The declarations offered now: the fixed loop's, the session's when it has
        one, else every checked registered tool's. Read in the calling thread, no
        actor asked; the values are the registry's own (immutable, shared: a caller
        must copy a schema before changing it)."""
        return [entry.info for entry in self.offered_entries(session_id)]

    def offered_entries(self, session_id: str | None = None) -> list[ToolEntry]:
        """The registry entries of the tools :meth:`offered` declares (shared,
        immutable values)."""
        if self._loop is not None:
            return list(self._loop.offered_entries())
        assert self._system is not None
        with self._lock:
            loop = self._loops.get(session_id) if session_id else None
        if loop is not None and loop.alive:
            return list(loop.offered_entries())
        return list(self._system.tool_set().entries.values())

    def close(self) -> None:
        """Stop the loops this started (a fixed loop is the caller's and stays)."""
        with self._lock:
            loops, self._loops = list(self._loops.values()), {}
        for loop in loops:
            loop.stop()
