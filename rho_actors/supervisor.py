"""Supervision of on-demand children: the DynamicSupervisor (OTP's ``DynamicSupervisor``,
``simple_one_for_one``), used for CallActors (``temporary``) and LoopActors.

Children are started from plain data (:class:`StartChild`: an actor class and its
arguments) in the supervisor's own thread, tracked in start order, and told to the
supervisor again when they stop. On shutdown every child is asked to stop (its
``cancel`` hook first, then pykka's stop) and all of them are given ``shutdown_ms``
milliseconds together; a child still running then is abandoned and logged: a thread
cannot be killed (DESIGN §5), which is what ``process`` isolation is for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pykka
from loguru import logger

__all__ = ["DynamicSupervisor", "StartChild"]

_SHUTDOWN_MS = 5_000


@dataclass(frozen=True, slots=True)
class StartChild:
    """A child spec: start ``actor_class(*args, on_exit=..., **kwargs)``.

    The supervisor passes ``on_exit``, a callable the child must call from its
    ``on_stop`` with its own ref. ``cancel`` (optional) asks a busy child to finish
    early when the supervisor shuts down. Sent with ``ask``, the reply is the child's ref.
    """

    actor_class: type[pykka.Actor]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    cancel: Callable[[], object] | None = None


@dataclass(frozen=True, slots=True)
class _ChildExited:
    ref: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class _Children:
    pass


class DynamicSupervisor(pykka.ThreadingActor):
    """Starts children on demand and stops them, in reverse start order, on shutdown.

    ``shutdown_ms``: how long (milliseconds) the children together get to stop.
    Its children are never restarted (restart type ``temporary``).
    """

    use_daemon_thread = True

    def __init__(self, name: str, shutdown_ms: int = _SHUTDOWN_MS) -> None:
        super().__init__()
        self.name = name
        self._shutdown_ms = shutdown_ms
        self._children: dict[str, tuple[pykka.ActorRef[Any], StartChild]] = {}
        self.abandoned = 0

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, StartChild):
            return self._start(message)
        if isinstance(message, _ChildExited):
            self._children.pop(message.ref.actor_urn, None)
            return None
        if isinstance(message, _Children):
            return [ref for ref, _ in self._children.values()]
        logger.warning("{} ignored an unknown message {!r}", self.name, message)
        return None

    def _start(self, spec: StartChild) -> pykka.ActorRef[Any]:
        me = self.actor_ref

        def on_exit(ref: pykka.ActorRef[Any]) -> None:
            try:
                me.tell(_ChildExited(ref))
            except pykka.ActorDeadError:
                pass

        ref = spec.actor_class.start(*spec.args, on_exit=on_exit, **spec.kwargs)
        if ref.is_alive():
            self._children[ref.actor_urn] = (ref, spec)
        return ref

    def on_stop(self) -> None:
        children = list(self._children.values())[::-1]
        for ref, spec in children:
            if spec.cancel is not None:
                try:
                    spec.cancel()
                except Exception:
                    logger.exception("{}: cancel hook of {} raised", self.name, ref)
            ref.stop(block=False)
        until = time.monotonic() + self._shutdown_ms / 1000
        for ref, _ in children:
            if not ref.actor_stopped.wait(max(0.0, until - time.monotonic())):
                self.abandoned += 1
                logger.warning("{}: child {} did not stop within {} ms; abandoned", self.name, ref, self._shutdown_ms)
        self._children.clear()


def children(supervisor: pykka.ActorRef[DynamicSupervisor], timeout_s: float = 5.0) -> list[pykka.ActorRef[Any]]:
    """The supervisor's live children, in start order."""
    result: list[pykka.ActorRef[Any]] = supervisor.ask(_Children(), block=True, timeout=timeout_s)
    return result
