"""Actors with OTP exit semantics: exit reasons, monitors, ``kill`` and names.

pykka gives threads with inboxes; OTP's supervision needs three more things, built here
on pykka 4's actor loop:

- **Exit reasons.** Every :class:`Actor` ends with a reason: :data:`NORMAL` when it was
  stopped, else what killed it. An exception in a ``tell`` handler or in ``on_start``
  kills the actor (as in pykka); an exception in an ``ask`` handler goes back to the
  caller and the actor lives on (as in pykka). A ``BaseException`` (``SystemExit``,
  ``KeyboardInterrupt``...) kills *only this actor* (pykka would stop every actor in the
  process): an ``ask`` caller then gets :class:`ActorExit`.
- **Monitors** (Erlang's ``monitor/2``): :func:`monitor` calls back once when the actor
  ends, with its reason (at once, when it has already ended).
- **Names** (``register/2`` and ``whereis/1``): :class:`Names` maps a name to the live
  ref of a named actor; a supervisor re-registers the name on each restart, so a caller
  holding an old ref gets ``pykka.ActorDeadError`` at once, never a hang.

Example::

    class Counter(Actor):
        def __init__(self):
            super().__init__()
            self.n = 0
        def on_receive(self, message):
            self.n += 1
            return self.n

    ref = Counter.start()
    monitor(ref, lambda ref, reason: print("down:", reason))
    kill(ref)          # prints "down: killed"
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka
from loguru import logger

from rho_actors.encoding import describe_exception

__all__ = ["KILLED", "NORMAL", "Actor", "ActorExit", "Down", "Monitor", "Names", "kill", "monitor", "start_link"]

NORMAL = "normal"
"""The exit reason of an actor that was stopped (``ref.stop()``): not a failure."""

KILLED = "killed"
"""The exit reason :func:`kill` gives by default."""

DownCallback = Callable[[pykka.ActorRef[Any], object], None]


class ActorExit(Exception):
    """The actor exited while handling this message (a ``BaseException`` or
    :func:`kill`); ``reason`` is its exit reason."""

    def __init__(self, message: str, reason: object) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Down:
    """The message a monitoring actor gets when the monitored one ends (Erlang's
    ``{'DOWN', Ref, process, Pid, Reason}``)."""

    ref: pykka.ActorRef[Any]
    reason: object


@dataclass(frozen=True, slots=True)
class _Kill:
    reason: object


@dataclass(frozen=True, slots=True)
class _Ping:
    pass


def start_link(actor_class: type[Actor], *args: Any, timeout_s: float = 30.0, **kwargs: Any) -> pykka.ActorRef[Any]:
    """Start an actor and return once its ``on_start`` has run (OTP's ``start_link``
    returns after ``init``). Raises ``RuntimeError`` with the exit reason when it
    failed to start, and ``pykka.Timeout`` past ``timeout_s`` seconds."""
    ref = actor_class.start(*args, **kwargs)
    try:
        ref.ask(_Ping(), timeout=timeout_s)
    except pykka.ActorDeadError:
        ref.actor_stopped.wait(timeout_s)
        raise RuntimeError(f"{actor_class.__name__} failed to start: {_exit_reason_of(ref)}") from None
    return ref


def _exit_reason_of(ref: pykka.ActorRef[Any]) -> object:
    with _lock:
        return _exits.get(ref.actor_urn, "unknown")


class Monitor:
    """A monitor made by :func:`monitor`; :meth:`demonitor` removes it."""

    __slots__ = ("_callback", "_urn")

    def __init__(self, urn: str, callback: DownCallback) -> None:
        self._urn = urn
        self._callback = callback

    def demonitor(self) -> None:
        """Remove this monitor: no report comes after this call."""
        with _lock:
            callbacks = _monitors.get(self._urn)
            if callbacks is not None and self in callbacks:
                callbacks.remove(self)


_lock = threading.Lock()
_monitors: dict[str, list[Monitor]] = {}  # by actor urn, for live actors only
_exits: dict[str, object] = {}  # the last few exit reasons, for start errors
_EXITS_KEPT = 256


def monitor(ref: pykka.ActorRef[Any], notify: DownCallback | pykka.ActorRef[Any]) -> Monitor:
    """Report once when the :class:`Actor` behind ``ref`` ends, with its exit reason:
    ``notify`` is an actor's ref, which is told :class:`Down`, or a callback
    ``notify(ref, reason)``, called from the ending actor's thread (keep it quick). An
    actor that has already ended is reported at once, with reason ``"noproc"``.

    Raises ``TypeError`` when ``ref`` is not the ref of an :class:`Actor`.
    """
    if not issubclass(ref.actor_class, Actor):
        raise TypeError(f"{ref} is not a rho_actors.Actor: it cannot be monitored")
    callback = _teller(notify) if isinstance(notify, pykka.ActorRef) else notify
    handle = Monitor(ref.actor_urn, callback)
    with _lock:
        callbacks = _monitors.get(ref.actor_urn) if ref.is_alive() else None
        if callbacks is not None:
            callbacks.append(handle)
            return handle
    callback(ref, "noproc")
    return handle


def _teller(watcher: pykka.ActorRef[Any]) -> DownCallback:
    def tell_down(ref: pykka.ActorRef[Any], reason: object) -> None:
        try:
            watcher.tell(Down(ref, reason))
        except pykka.ActorDeadError:
            pass

    return tell_down


def kill(ref: pykka.ActorRef[Any], reason: object = KILLED) -> None:
    """Make the actor exit with ``reason`` (abnormal: its supervisor restarts it by its
    restart type) once it reaches this message. A thread cannot be interrupted, so a
    busy actor exits when its current message is done. No-op for a dead actor."""
    try:
        ref.tell(_Kill(reason))
    except pykka.ActorDeadError:
        pass


class Actor(pykka.ThreadingActor):
    """A pykka actor with an exit reason and monitors (see the module doc).

    ``exit_reason`` is ``None`` while it runs. Its thread is a daemon thread, so an
    actor stuck in a handler cannot keep the process alive.
    """

    use_daemon_thread = True

    @staticmethod
    def _create_actor_inbox() -> Any:
        # A C-level queue: puts and gets cost a fraction of queue.Queue's Python-level
        # locking, on every message of the call path.
        return queue.SimpleQueue()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exit_reason: object = None
        self._exit_cause: object = None
        self._stopped_once = False
        with _lock:
            _monitors[self.actor_urn] = []

    def _handle_receive(self, message: Any) -> Any:
        if isinstance(message, _Ping):
            return True
        if isinstance(message, _Kill):
            self._exit_cause = message.reason
            self._stop()
            raise ActorExit(f"{self} was killed ({message.reason})", message.reason)
        try:
            return super()._handle_receive(message)
        except Exception:
            raise
        except BaseException as exc:  # only this actor ends; pykka would stop them all
            self._exit_cause = exc
            self._stop()
            raise ActorExit(f"{self} exited: {describe_exception(exc)}", exc) from None

    def _stop(self) -> None:
        """End the actor (pykka's, made idempotent): ``on_stop`` runs once, and whatever
        it raises, a ``BaseException`` included, is recorded as the exit cause instead of
        escaping into pykka (which would stop every actor)."""
        if self._stopped_once:
            return
        self._stopped_once = True
        pykka.ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()
        try:
            self.on_stop()
        except BaseException as exc:
            if self._exit_cause is None:
                self._exit_cause = exc
            logger.opt(exception=exc).error("on_stop of {} raised", self)

    def _handle_failure(self, *exc_info: Any) -> None:
        if self._exit_cause is None:
            self._exit_cause = exc_info[1]
        if isinstance(exc_info[1], ActorExit):  # already ended on purpose: no error trace
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            return
        super()._handle_failure(*exc_info)

    def _actor_loop(self) -> None:
        try:
            super()._actor_loop()
        except BaseException as exc:  # a BaseException in on_start or on_stop
            if self._exit_cause is None:
                self._exit_cause = exc
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            self._actor_loop_teardown()
        finally:
            self.exit_reason = self._exit_cause if self._exit_cause is not None else NORMAL
            with _lock:
                callbacks = _monitors.pop(self.actor_urn, [])
                if self.exit_reason != NORMAL:
                    _exits[self.actor_urn] = self.exit_reason
                    while len(_exits) > _EXITS_KEPT:
                        del _exits[next(iter(_exits))]
            for handle in callbacks:
                try:
                    handle._callback(self.actor_ref, self.exit_reason)
                except Exception:
                    logger.exception("monitor callback for {} raised", self)


class Names:
    """Named actors of one system: name -> live ref (Erlang's ``register/whereis``).

    A name is freed when its actor ends, so :meth:`whereis` never returns a dead ref for
    long; one that ended an instant ago raises ``pykka.ActorDeadError`` when used.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: dict[str, pykka.ActorRef[Any]] = {}

    def register(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        """Give ``ref`` the name (replacing a dead holder). Raises ``ValueError`` when a
        live actor holds it."""
        with self._lock:
            held = self._refs.get(name)
            if held is not None and held.is_alive() and held.actor_urn != ref.actor_urn:
                raise ValueError(f"the name {name!r} is held by {held}")
            self._refs[name] = ref
        monitor(ref, lambda r, _reason: self._release(name, r))

    def _release(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        with self._lock:
            if self._refs.get(name) is ref:
                del self._refs[name]

    def whereis(self, name: str) -> pykka.ActorRef[Any] | None:
        """The live ref holding ``name``, or ``None``."""
        with self._lock:
            ref = self._refs.get(name)
        return ref if ref is not None and ref.is_alive() else None

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
