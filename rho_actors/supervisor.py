"""Supervision of on-demand children: the DynamicSupervisor (OTP's ``DynamicSupervisor``,
``simple_one_for_one``), used for CallActors (``temporary``) and LoopActors.

Children are started from plain data (:class:`StartChild`: an actor class and its
arguments), tracked in start order, and reported back to the supervisor when they stop.
On shutdown every child is asked to stop, in reverse start order, and all of them
together get ``shutdown_ms`` milliseconds; a child still running then is abandoned and
logged: a thread cannot be killed (DESIGN §5), which is what ``process`` isolation is for.

Spares. Starting an actor costs a thread start (~110 µs here, most of a no-op call's
cost). A supervisor given ``spare=StartChild(...)`` keeps ``spares`` such children
started ahead of need in a :class:`Spares` pool, which other actors :meth:`Spares.take`
from without a message round trip; each taken spare is replaced from the supervisor's
thread, off the caller's path. A spare is still a fresh actor for the one job it gets.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import pykka
from loguru import logger

__all__ = ["DynamicSupervisor", "Spares", "StartChild", "children"]

_SHUTDOWN_MS = 5_000


@dataclass(frozen=True, slots=True)
class StartChild:
    """A child spec: start ``actor_class(*args, on_exit=..., **kwargs)``.

    The supervisor passes ``on_exit``, a callable the child must call from its
    ``on_stop`` with its own ref. Sent with ``ask``, the reply is the child's ref.
    """

    actor_class: type[pykka.Actor]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Replenish:
    pass


@dataclass(frozen=True, slots=True)
class _Children:
    pass


class Spares:
    """Children started ahead of need; :meth:`take` is safe from any thread."""

    def __init__(
        self, supervisor: pykka.ActorRef[DynamicSupervisor], spec: StartChild, children: dict[str, Any]
    ) -> None:
        self._idle: collections.deque[pykka.ActorRef[Any]] = collections.deque()
        self._supervisor = supervisor
        self._children = children
        self.spec = spec

    def take(self) -> pykka.ActorRef[Any]:
        """A started child for one job: a spare when one is idle, else one the
        supervisor starts now. Call :meth:`replenish` when off the hot path. Raises
        ``pykka.ActorDeadError`` once the supervisor has stopped."""
        try:
            return self._idle.popleft()
        except IndexError:
            ref: pykka.ActorRef[Any] = self._supervisor.ask(self.spec, block=True, timeout=_SHUTDOWN_MS / 1000)
            return ref

    def abandon(self, ref: pykka.ActorRef[Any]) -> None:
        """Stop supervising a child that was given up on (a call past its deadline): the
        supervisor's shutdown no longer waits for it."""
        self._children.pop(ref.actor_urn, None)

    def replenish(self) -> None:
        """Ask the supervisor to start spares up to its count again (asynchronously)."""
        try:
            self._supervisor.tell(_Replenish())
        except pykka.ActorDeadError:
            pass

    def __len__(self) -> int:
        return len(self._idle)


class DynamicSupervisor(pykka.ThreadingActor):
    """Starts children on demand and stops them, in reverse start order, on shutdown.

    ``shutdown_ms``: how long (milliseconds) the children together get to stop.
    ``spare`` and ``spares``: keep that many children of that spec started ahead of
    need (see :attr:`spare_pool`). Children are never restarted (``temporary``).
    """

    use_daemon_thread = True

    def __init__(
        self, name: str, shutdown_ms: int = _SHUTDOWN_MS, spare: StartChild | None = None, spares: int = 0
    ) -> None:
        super().__init__()
        self.name = name
        self._shutdown_ms = shutdown_ms
        self._children: dict[str, pykka.ActorRef[Any]] = {}
        self._spares = spares
        self.spare_pool = Spares(self.actor_ref, spare, self._children) if spare is not None else None
        self.abandoned = 0

    def on_start(self) -> None:
        if self.spare_pool is not None:
            for _ in range(self._spares):
                self._start_spare()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Replenish):
            while self.spare_pool is not None and len(self.spare_pool) < self._spares:
                self._start_spare()
        elif isinstance(message, StartChild):
            return self._start(message)
        elif isinstance(message, _Children):
            return list(self._children.copy().values())
        else:
            logger.warning("{} ignored an unknown message {!r}", self.name, message)
        return None

    def _start(self, spec: StartChild) -> pykka.ActorRef[Any]:
        children = self._children

        def on_exit(ref: pykka.ActorRef[Any]) -> None:
            # Called in the child's thread; a dict pop is atomic, so no message (and no
            # wake-up of this supervisor) is needed per exit.
            children.pop(ref.actor_urn, None)

        ref = spec.actor_class.start(*spec.args, on_exit=on_exit, **spec.kwargs)
        children[ref.actor_urn] = ref
        if not ref.is_alive():
            children.pop(ref.actor_urn, None)
        return ref

    def _start_spare(self) -> None:
        assert self.spare_pool is not None
        self.spare_pool._idle.append(self._start(self.spare_pool.spec))

    def on_stop(self) -> None:
        children = list(self._children.copy().values())[::-1]
        for ref in children:
            ref.stop(block=False)
        until = time.monotonic() + self._shutdown_ms / 1000
        for ref in children:
            if not ref.actor_stopped.wait(max(0.0, until - time.monotonic())):
                self.abandoned += 1
                logger.warning("{}: child {} did not stop within {} ms; abandoned", self.name, ref, self._shutdown_ms)
        self._children.clear()


def children(supervisor: pykka.ActorRef[DynamicSupervisor], timeout_s: float = 5.0) -> list[pykka.ActorRef[Any]]:
    """The supervisor's live children, in start order."""
    result: list[pykka.ActorRef[Any]] = supervisor.ask(_Children(), block=True, timeout=timeout_s)
    return result
