"""Actors with OTP exit semantics: exit reasons, monitors, ``kill`` and exit hooks.

pykka gives threads with inboxes; OTP's supervision needs more, built here on pykka 4's
actor loop. This is the only module of rho_actors that touches pykka's private names;
every other actor uses the public hooks below.

- **Exit reasons** (OTP: the ``Reason`` of ``exit/1``). Every :class:`Actor` ends with a
  reason: :data:`NORMAL` when it was stopped, else what killed it. An exception in a
  ``tell`` handler or in ``on_start`` kills the actor (OTP: a crash in ``handle_cast`` or
  ``init``); an exception in an ``ask`` handler goes back to the caller and the actor
  lives on (pykka's rule; OTP's ``gen_server:call`` would crash the server). A
  ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``...) kills *only this actor*
  (pykka would stop every actor in the process): an ``ask`` caller then gets
  :class:`ActorExit`.
- **Monitors** (Erlang's ``monitor/2``): :func:`monitor` calls back once when the actor
  ends, with its reason (at once, with ``"noproc"``, when it has already ended).
- **kill** (Erlang's ``exit(Pid, Reason)``): :func:`kill` makes the actor exit with a
  reason once it reaches that message (a thread cannot be interrupted).
- **Pooled threads**: an actor whose :attr:`Actor.thread_pool` is set runs its loop on a
  thread borrowed from that :class:`rho_actors.otp.threads.ThreadPool` and given back
  when it ends, instead of a new thread: still a fresh actor (state, inbox, identity).
- **A thread only when there is work**: an actor whose :attr:`Actor.starts_on_first_message`
  is set takes its thread (and runs ``on_start``) at its first message, not at its start;
  :func:`stop` of one that has had none ends it in the stopping thread, with every hook
  run as a stop's would be, so an actor that only lives and is stopped wakes no thread.
- **Exit hooks**: :meth:`Actor.on_undelivered` sees each message still in the inbox when
  the actor ends (OTP drops them silently; a hook can answer them), and
  :meth:`Actor.on_exit` runs last in the actor's thread, once it has ended, been
  unregistered and its monitors told.

Names (``register/2``, ``whereis/1``) are in :mod:`rho_actors.otp.names`.

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

import contextvars
import importlib
import itertools
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

import pykka
from loguru import logger
from pykka._envelope import Envelope
from pykka.messages import _ActorStop

from rho_actors.encoding import describe_exception

if TYPE_CHECKING:
    from rho_actors.otp.threads import ThreadPool

__all__ = ["KILLED", "NORMAL", "Actor", "ActorExit", "Down", "Monitor", "StopFlag", "end_unstarted", "kill", "new_urn",
           "monitor", "on_actor_thread", "start_link", "stop"]

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
    returns after ``init``). Raises ``RuntimeError`` naming the exit reason when it
    failed to start (chained from it when it is an exception), and ``pykka.Timeout``
    when ``on_start`` runs past ``timeout_s`` seconds: then, as OTP kills an ``init``
    past its start timeout, the actor is killed (a thread cannot be interrupted: it
    exits, reason :data:`KILLED`, as soon as ``on_start`` returns, never running
    unsupervised)."""
    ref = actor_class.start(*args, **kwargs)
    try:
        ref.ask(_Ping(), timeout=timeout_s)
    except pykka.Timeout:
        kill(ref)
        raise pykka.Timeout(
            f"{actor_class.__name__} did not start within {timeout_s} s (its on_start is still running; "
            "it is killed once that returns)"
        ) from None
    except pykka.ActorDeadError:
        ref.actor_stopped.wait(timeout_s)
        reason = _exit_reason_of(ref)
        text = describe_exception(reason) if isinstance(reason, BaseException) else str(reason)
        cause = reason if isinstance(reason, BaseException) else None
        raise RuntimeError(f"{actor_class.__name__} failed to start: {text}") from cause
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


def new_urn() -> str:
    """A new actor urn, ``urn:uuid:`` and a random (version 4) UUID, as pykka's
    ``uuid.uuid4().urn``, made from 16 random bytes without a ``uuid.UUID`` (whose
    construction and formatting were ~5 % of a session's start and stop)."""
    h = os.urandom(16).hex()
    return f"urn:uuid:{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def monitor(ref: pykka.ActorRef[Any], notify: DownCallback | pykka.ActorRef[Any]) -> Monitor:
    """Report once when the :class:`Actor` behind ``ref`` ends, with its exit reason:
    ``notify`` is an actor's ref, which is told :class:`Down`, or a callback
    ``notify(ref, reason)``, called from the ending actor's thread (keep it quick). An
    actor that has already ended is reported at once, with reason ``"noproc"``; one that
    is stopping (its ``on_stop`` running) is reported when it has ended, with its reason.

    Raises ``TypeError`` when ``ref`` is not the ref of an :class:`Actor`.
    """
    if Actor not in ref.actor_class.__mro__:  # (issubclass: an ABC's frame on every session's start, twice)
        raise TypeError(f"{ref} is not a rho_actors.Actor: it cannot be monitored")
    callback = _teller(notify) if isinstance(notify, pykka.ActorRef) else notify
    handle = Monitor(ref.actor_urn, callback)
    actor = ref._actor_weakref()
    with _lock:
        # The actor takes its monitors once (under this lock) when it has fully ended, so
        # an entry made before is always taken and reported: also while it is stopping
        # (``is_alive()`` false from the start of its stop, its ``on_stop`` still running).
        if actor is not None and not actor._monitors_taken:
            _monitors.setdefault(ref.actor_urn, []).append(handle)
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


def on_actor_thread(ref: pykka.ActorRef[Any]) -> bool:
    """Whether the calling thread is the one running the :class:`Actor` behind ``ref``
    (in one of its handlers or hooks, or a callback they call): such a caller must not
    wait for that actor to handle a message."""
    actor = ref._actor_weakref()
    return actor is not None and getattr(actor, "_thread_ident", None) == threading.get_ident()


def kill(ref: pykka.ActorRef[Any], reason: object = KILLED) -> None:
    """Make the actor exit with ``reason`` (abnormal: its supervisor restarts it by its
    restart type) once it reaches this message. A thread cannot be interrupted, so a
    busy actor exits when its current message is done. No-op for a dead actor. An actor
    whose loop has not started and finds no thread to start on (the host at its thread
    limit) is ended in this thread, with ``reason``."""
    try:
        ref.tell(_Kill(reason))
    except pykka.ActorDeadError:
        pass
    except RuntimeError:  # a waking actor with no thread to start on (the host at its limit): ended here
        end_unstarted(ref)


def stop_soon(ref: pykka.ActorRef[Any]) -> None:
    """Tell the actor behind ``ref`` to stop, not waiting (``ref.stop(block=False)``);
    an actor whose loop has not started and finds no thread to start on (the host at
    its thread limit) is ended in this thread instead, as :func:`stop` does. No-op for a
    dead actor."""
    try:
        ref.stop(block=False)
    except pykka.ActorDeadError:
        pass
    except RuntimeError:  # the stop is queued first: run before the end's own
        end_unstarted(ref)


def stop(ref: pykka.ActorRef[Any], timeout_s: float | None = None) -> bool:
    """Stop the actor behind ``ref`` (a normal exit) and wait until it has stopped, at
    most ``timeout_s`` seconds (``None``: no bound), as ``ref.stop()`` does; returns
    whether it was running. An actor whose loop has not started
    (:attr:`Actor.starts_on_first_message`, no message yet) is ended in this thread, in
    a context of its own: ``on_start``, any message that arrived meanwhile, the stop,
    ``on_stop``, the undelivered messages, the monitors and ``on_exit``, in that order,
    as its own thread would run them. Raises ``pykka.Timeout`` past ``timeout_s``."""
    if end_unstarted(ref):
        return True
    try:
        return bool(ref.stop(timeout=timeout_s))
    except pykka.ActorDeadError:
        return False


def end_unstarted(ref: pykka.ActorRef[Any]) -> bool:
    """End the actor behind ``ref`` in this thread when its loop has not started
    (:attr:`Actor.starts_on_first_message`, no message yet), every hook in order as
    :func:`stop` does; returns whether it did (``False``: it has a thread, or has ended:
    nothing was done)."""
    inbox = ref.actor_inbox
    return isinstance(inbox, _WakingInbox) and ref.is_alive() and inbox.end_here()


class _WakingInbox:
    """The inbox of an actor that takes its thread at its first message: a
    ``SimpleQueue`` whose first ``put`` starts the actor's loop (once, whoever puts).
    It holds the actor until then (a pykka actor is otherwise held by its thread only).
    A ``put`` whose start raises an ``Exception`` (no thread could be started) raises that
    error with its message queued and the actor still unstarted (any other exception, an
    interrupt, leaves it taken as started: its thread may run). A ``put`` that returns has its message
    run by the actor's loop: one that finds a start under way waits for its outcome
    (and starts the loop itself when that start failed)."""

    __slots__ = ("_actor", "_claim", "_queue", "started")

    def __init__(self, actor: Actor) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._actor: Actor | None = actor
        self._claim = threading.Lock()  # held through a start: its outcome is known to the next
        self.started = False  # set once the loop has a thread, or is run by end_here

    def put(self, envelope: Any, block: bool = True, timeout: float | None = None) -> None:
        self._queue.put(envelope)
        if self.started:
            return
        with self._claim:
            actor = self._actor
            if self.started or actor is None:
                return
            try:
                actor._start_loop_now()
            except Exception:  # no thread could be started: the message queued, the actor unstarted
                raise
            except BaseException:  # an interrupt (Ctrl-C) in the start: its thread may run, never a second
                self._actor, self.started = None, True
                raise
            self._actor, self.started = None, True  # from now on its loop holds it

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return self._queue.get(block, timeout)

    def empty(self) -> bool:
        return self._queue.empty()

    def end_here(self) -> bool:
        """Run the actor's loop to its end in this thread, a stop queued last, when it
        has not started; returns whether it did."""
        with self._claim:
            actor = self._actor
            if self.started or actor is None:
                return False
            self._actor, self.started = None, True
        self._queue.put(Envelope(_ActorStop()))
        if threading.current_thread() is not threading.main_thread():
            contextvars.Context().run(actor._actor_loop)
            return True
        # Python runs signal handlers in the main thread only: one that raises (Ctrl-C's
        # KeyboardInterrupt) inside the actor's hooks would be taken for its crash and lost
        # to the host. Its handler runs once the actor has ended instead, here.
        caught: list[tuple[int, Any]] = []
        held: dict[int, Callable[[int, Any], Any]] = {}
        for signum in _ASYNC_SIGNALS:
            handler = _getsignal(signum)
            if callable(handler):
                held[signum] = handler
                _setsignal(signum, lambda number, frame: caught.append((number, frame)))
        try:
            contextvars.Context().run(actor._actor_loop)
        finally:
            for signum, handler in held.items():
                _setsignal(signum, handler)
            for number, frame in caught:
                held[number](number, frame)
        return True


_ASYNC_SIGNALS = tuple(int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM,
                                        signal.SIGUSR1, signal.SIGUSR2))
# The C functions that signal.getsignal/signal.signal wrap: the same handlers, without an
# enum looked up (and failed, for a Python handler) per signal: ~45 µs of the 7 look-ups
# and a swap, against ~4 µs, on every loop's stop.
try:
    _C_SIGNAL: Any = importlib.import_module("_signal")
    _getsignal: Callable[[int], Any] = _C_SIGNAL.getsignal
    _setsignal: Callable[[int, Any], Any] = _C_SIGNAL.signal
except (ImportError, AttributeError):  # another interpreter: the wrappers
    _getsignal, _setsignal = signal.getsignal, signal.signal


# pykka's registry of live actors, kept without its debug log lines: pykka's start and
# unregister format the actor's text for them on every start and stop (three f-strings of
# the ref, ~2 % of a session's start and stop), logged or not.
_REGISTRY: Any = pykka.ActorRegistry
_REGISTRY_PLAIN = isinstance(getattr(_REGISTRY, "_actor_refs", None), list) and hasattr(_REGISTRY, "_actor_refs_lock")


def _register(ref: pykka.ActorRef[Any]) -> None:
    if not _REGISTRY_PLAIN:  # another pykka: its own
        _REGISTRY.register(ref)
        return
    with _REGISTRY._actor_refs_lock:
        _REGISTRY._actor_refs.append(ref)


def _unregister(ref: pykka.ActorRef[Any]) -> None:
    if not _REGISTRY_PLAIN:
        _REGISTRY.unregister(ref)
        return
    with _REGISTRY._actor_refs_lock:
        refs = _REGISTRY._actor_refs
        if ref in refs:
            refs.remove(ref)


class StopFlag:
    """``threading.Event``'s interface (``is_set``, ``set``, ``clear``, ``wait``) for an
    actor's ``actor_stopped``: a plain flag until a thread waits on it, then backed by
    an Event made for that wait. Safe from any thread."""

    __slots__ = ("_event", "_flag")

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        event = self._event
        if event is not None:
            event.set()

    def clear(self) -> None:
        self._flag = False
        event = self._event
        if event is not None:
            event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or ``timeout`` seconds pass (``None``: no bound); returns
        whether it is set."""
        if self._flag:
            return True
        with _lock:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self._flag:  # set before the event existed
            event.set()
        return event.wait(timeout)


class Actor(pykka.ThreadingActor):
    """A pykka actor with an exit reason, monitors and exit hooks (see the module doc).

    ``exit_reason`` is ``None`` while it runs. Its thread is a daemon thread, so an
    actor stuck in a handler cannot keep the process alive. Subclasses use pykka's
    public hooks (``on_start``, ``on_receive``, ``on_stop``, ``on_failure``) and the two
    below; none overrides pykka's loop.
    """

    use_daemon_thread = True

    thread_pool: ThreadPool | None = None
    """Where the actor's loop runs: ``None`` (the default) for a new thread of its own;
    else a thread of this pool, borrowed at start and given back once the actor has
    ended. Set it on a subclass, or on the instance in ``__init__``."""

    takes_over_thread: ClassVar[bool] = False
    """Whether a start inside :meth:`ThreadPool.hand_over` may run this actor on the
    handing thread once that thread's job returns (only for actors that no one starting
    them waits for, such as CallActors)."""

    starts_on_first_message: ClassVar[bool] = False
    """Whether the actor's loop takes its thread (and runs ``on_start``) at the actor's
    first message instead of at its start, and :func:`stop` of an actor that has had
    none ends it in the stopping thread: for actors that mostly just live (a session's
    LoopActor, whose turns run in the host's thread). Its messages pay one more Python
    call each."""

    _thread_numbers: ClassVar[itertools.count[int]] = itertools.count()

    @staticmethod
    def _create_actor_inbox() -> Any:
        # A C-level queue: puts and gets cost a fraction of queue.Queue's Python-level
        # locking, on every message of the call path.
        return queue.SimpleQueue()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # pykka's Actor.__init__, with a stop flag whose Event (a Condition and a Lock) is
        # made only when someone waits on it: one of each per CallActor otherwise.
        self.actor_urn = new_urn()
        self.actor_inbox = _WakingInbox(self) if self.starts_on_first_message else self._create_actor_inbox()
        self.actor_stopped = StopFlag()  # type: ignore[assignment]
        self._actor_ref = pykka.ActorRef(self)
        self.exit_reason: object = None
        self._exit_cause: object = None
        self._thread_ident: int | None = None  # the thread running its loop, once it runs
        self._stopped_once = False
        self._monitors_taken = False  # set once, under the monitors' lock, when it has fully ended

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> pykka.ActorRef[Self]:
        """Start an actor, as pykka's ``Actor.start`` does: made with the arguments (its
        ``__init__`` runs in this thread), registered in ``pykka.ActorRegistry``, its loop
        started (at its first message when :attr:`starts_on_first_message`); returns its ref."""
        obj = cls(*args, **kwargs)
        ref = obj._actor_ref  # (pykka's actor_ref property, without its frame)
        _register(ref)
        obj._start_actor_loop()
        return ref

    def _start_actor_loop(self) -> None:
        if not self.starts_on_first_message:
            self._start_loop_now()

    def _start_loop_now(self) -> None:
        pool = self.thread_pool
        if pool is None:
            super()._start_actor_loop()
        else:
            pool.submit(self._actor_loop, f"{type(self).__name__}-{next(self._thread_numbers)}",
                        may_take_over=self.takes_over_thread)

    def on_undelivered(self, message: Any) -> bool:
        """Called in the actor's thread once it has ended, for each message still in its
        inbox (in arrival order); returns whether it handled the message. An unhandled
        ``ask`` gets ``pykka.ActorDeadError`` (pykka's rule; OTP drops messages to a dead
        process). Default: ``False``. What it raises is logged and counts as ``False``."""
        return False

    def on_exit(self, reason: object) -> None:
        """Called last in the actor's thread, once it has fully ended: unregistered,
        ``exit_reason`` set to ``reason``, its monitors told. A reply sent from here
        reaches a caller whose next message to a registry or supervisor already sees
        this actor gone. Default: nothing. What it raises is logged."""

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
        _unregister(self._actor_ref)
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
            _unregister(self._actor_ref)
            self.actor_stopped.set()
            return
        super()._handle_failure(*exc_info)

    def _actor_loop(self) -> None:
        self._thread_ident = threading.get_ident()
        try:
            super()._actor_loop()
        except BaseException as exc:  # a BaseException in on_start or on_stop
            if self._exit_cause is None:
                self._exit_cause = exc
            _unregister(self._actor_ref)
            self.actor_stopped.set()
            self._actor_loop_teardown()
        finally:
            self._ended()

    def _actor_loop_teardown(self) -> None:
        kept = []
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            handled = False
            if not isinstance(envelope.message, (_Ping, _Kill)):
                try:
                    handled = self.on_undelivered(envelope.message)
                except Exception:
                    logger.exception("on_undelivered of {} raised", self)
            if not handled:
                kept.append(envelope)
        for envelope in kept:
            self.actor_inbox.put(envelope)
        super()._actor_loop_teardown()

    def _ended(self) -> None:
        """Set the exit reason, tell the monitors, then run :meth:`on_exit`."""
        self.exit_reason = self._exit_cause if self._exit_cause is not None else NORMAL
        with _lock:
            self._monitors_taken = True
            callbacks = _monitors.pop(self.actor_urn, [])
            if self.exit_reason != NORMAL:
                _exits[self.actor_urn] = self.exit_reason
                while len(_exits) > _EXITS_KEPT:
                    del _exits[next(iter(_exits))]
        for handle in callbacks:
            try:
                handle._callback(self._actor_ref, self.exit_reason)
            except BaseException:  # the next monitors (a supervisor's) must still be told
                logger.exception("monitor callback for {} raised", self)
        try:
            self.on_exit(self.exit_reason)
        except BaseException:
            logger.exception("on_exit of {} raised", self)

