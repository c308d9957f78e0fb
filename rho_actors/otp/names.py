"""Named actors: Erlang's ``register/2`` and ``whereis/1``, plus why a name is gone.

A :class:`Names` maps a name to the live ref of a named actor. A supervisor registers a
child's name (its spec's ``name``) on every start, so :meth:`Names.whereis` follows
restarts and a caller holding an old ref gets ``pykka.ActorDeadError`` at once, never a
hang. A name is freed when its actor ends (Erlang: a name dies with its process);
:meth:`Names.exit_reason` keeps why, and :meth:`Names.lookup` raises
:class:`NotRunningError` naming it (restarting, stopped, or given up by its supervisor).

Each :class:`rho_actors.ActorSystem` has its own :class:`Names`. A :class:`Supervisor`
started without ``names=`` registers in :data:`NAMES`, this process's own registry (as
Erlang's node-local one), read with :func:`whereis`.

Example::

    sup = start_link(Supervisor, [ChildSpec("db", StartChild(Db), name="db")])
    whereis("db").ask("ping")
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from rho_actors.encoding import describe_exception
from rho_actors.otp.actor import NORMAL, monitor

__all__ = ["NAMES", "Names", "NotRunningError", "whereis"]

_ENDED_KEPT = 4096  # why names ended, kept for the most recent ones


class NotRunningError(pykka.ActorDeadError):
    """The actor behind a name is not running; the message says why, and ``reason`` is
    its last exit reason (``None`` when the name was never held, or is being restarted).
    A ``pykka.ActorDeadError``, so code catching that keeps working."""

    def __init__(self, message: str, reason: object = None) -> None:
        super().__init__(message)
        self.reason = reason


class Names:
    """Named actors of one system: name -> live ref (Erlang's ``register/whereis``).

    A name is freed when its actor ends, so :meth:`whereis` never returns a dead ref for
    long; one that ended an instant ago raises ``pykka.ActorDeadError`` when used.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)  # notified when a name is registered or given up
        self._refs: dict[str, pykka.ActorRef[Any]] = {}
        self._ended: dict[str, object] = {}  # name -> exit reason of its last holder
        self._given_up: set[str] = set()  # names whose supervisor gave up on their actor

    def register(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        """Give ``ref`` (a :class:`rho_actors.Actor`'s) the name, replacing a dead holder.
        Raises ``ValueError`` when a live actor holds it."""
        with self._lock:
            held = self._refs.get(name)
            if held is not None and held.is_alive() and held.actor_urn != ref.actor_urn:
                raise ValueError(f"the name {name!r} is held by {held}")
            self._refs[name] = ref
            self._ended.pop(name, None)
            self._given_up.discard(name)
            self._registered.notify_all()
        monitor(ref, lambda r, reason: self._release(name, r, reason))

    def _release(self, name: str, ref: pykka.ActorRef[Any], reason: object) -> None:
        with self._lock:
            if self._refs.get(name) is ref:
                del self._refs[name]
                if name not in self._given_up:
                    self._remember(name, reason)

    def _remember(self, name: str, reason: object) -> None:
        self._ended.pop(name, None)
        self._ended[name] = reason
        while len(self._ended) > _ENDED_KEPT:
            self._given_up.discard(oldest := next(iter(self._ended)))
            del self._ended[oldest]

    def gave_up(self, name: str, reason: BaseException) -> None:
        """Record that the supervisor of the actor named ``name`` gave up on it (its
        ``reason``, a :class:`rho_actors.RestartIntensityExceeded`): until the name is
        registered again, :meth:`exit_reason` is ``reason`` and :meth:`lookup` raises
        naming it."""
        with self._lock:
            if name not in self._refs or not self._refs[name].is_alive():
                self._refs.pop(name, None)
                self._remember(name, reason)
                self._given_up.add(name)
                self._registered.notify_all()

    def whereis(self, name: str) -> pykka.ActorRef[Any] | None:
        """The live ref holding ``name``, or ``None``."""
        with self._lock:
            ref = self._refs.get(name)
        return ref if ref is not None and ref.is_alive() else None

    def await_name(
        self, name: str, timeout_s: float, abandon: Callable[[], bool] = lambda: False, *,
        unless_stopped: bool = False,
    ) -> pykka.ActorRef[Any] | None:
        """The live ref holding ``name``, waiting up to ``timeout_s`` seconds for its
        supervisor to restart it; ``None`` if none came by then, its supervisor gave up on
        it, ``abandon()`` became true (checked every 50 ms: the system stopped; called
        under this registry's lock, so it must not use this registry) or, with
        ``unless_stopped``, its last holder was stopped (exit reason ``"normal"``)."""
        until = time.monotonic() + timeout_s
        with self._registered:
            while True:
                ref = self._refs.get(name)
                if ref is not None and ref.is_alive():
                    return ref
                left = until - time.monotonic()
                stopped = unless_stopped and self._ended.get(name) == NORMAL
                if left <= 0 or name in self._given_up or stopped or abandon():
                    return None
                self._registered.wait(min(left, 0.05))

    def exit_reason(self, name: str) -> object:
        """``None`` while an actor holds ``name`` (or none ever did); else the exit reason
        of its last holder: :data:`rho_actors.NORMAL` after a stop, what killed it while
        it is being restarted, and its supervisor's :class:`rho_actors.RestartIntensityExceeded`
        once that supervisor gave up on it."""
        with self._lock:
            if name in self._refs and self._refs[name].is_alive():
                return None
            return self._ended.get(name)

    def lookup(self, name: str, what: str | None = None) -> pykka.ActorRef[Any]:
        """The live ref holding ``name``; raises :class:`NotRunningError` naming why
        there is none (``what`` names the actor in the message, default ``name``)."""
        ref = self.whereis(name)
        if ref is not None:
            return ref
        with self._lock:
            reason = self._ended.get(name)
            given_up = name in self._given_up
        what = what or f"the actor named {name!r}"
        if reason is None:
            raise NotRunningError(f"{what} is not running")
        if given_up:
            raise NotRunningError(f"{what} is not running: its supervisor gave up on it ({_text(reason)})", reason)
        if reason == NORMAL:
            raise NotRunningError(f"{what} is not running: it was stopped", reason)
        raise NotRunningError(f"{what} is not running: it exited ({_text(reason)}) and may be restarting", reason)

    def deliver(self, name: str, message: Any, patience_s: float = 10.0, stop: threading.Event | None = None) -> bool:
        """Hand ``message`` to the actor holding ``name`` and wait until it has handled it
        (an ``ask``), following a restart: a delivery that meets a dead or missing actor
        is tried again until ``patience_s`` seconds pass or ``stop`` is set. Returns
        whether it was handled. A ``tell`` could be lost in the inbox of an actor that is
        ending (pykka drops those); an ``ask`` is answered either way. Blocks: call it
        from a thread that may wait."""
        until = time.monotonic() + patience_s
        while not (stop is not None and stop.is_set()) and time.monotonic() < until:
            ref = self.whereis(name)
            if ref is not None:
                try:
                    ref.ask(message, timeout=max(0.0, until - time.monotonic()))
                    return True
                except pykka.ActorDeadError:
                    pass
                except pykka.Timeout:
                    return False
            time.sleep(0.01)  # the supervisor is restarting it
        return False

    def names(self) -> list[str]:
        """The names held now, sorted."""
        with self._lock:
            return sorted(self._refs)


def _text(reason: object) -> str:
    return describe_exception(reason) if isinstance(reason, BaseException) else str(reason)


NAMES = Names()
"""This process's own registry: where a :class:`rho_actors.Supervisor` started without
``names=`` registers its named children (Erlang's node-local registry)."""


def whereis(name: str) -> pykka.ActorRef[Any] | None:
    """The live ref registered as ``name`` in :data:`NAMES`, or ``None`` (Erlang's
    ``whereis/1``). An :class:`rho_actors.ActorSystem` has its own registry: use
    :meth:`rho_actors.ActorSystem.whereis` for its actors."""
    return NAMES.whereis(name)
