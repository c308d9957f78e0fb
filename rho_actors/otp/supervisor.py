"""OTP supervisors for pykka actors: child specs as plain data, restart strategies,
restart intensity with escalation, and ordered shutdown (DESIGN §6).

A :class:`Supervisor` starts its children from :class:`ChildSpec` values, in order, and
monitors them (:func:`rho_actors.monitor`). Each rule below is OTP's ``supervisor``
rule of the same name, except where a difference is stated.

- **Restart type** (OTP's ``restart``): ``permanent`` is always restarted, ``transient``
  only after an abnormal exit (any reason but ``"normal"``), ``temporary`` never (it is
  forgotten when it ends; its exits count for no restart intensity).
- **Strategy** (OTP's ``strategy``): ``one_for_one`` restarts only the failed child;
  ``one_for_all`` stops the others (in reverse start order) and starts all again in
  order; ``rest_for_one`` does that for the failed child and those started after it.
- **Restart intensity** (OTP's ``intensity``/``period``): each restart counts, and so
  does each restart whose start fails: a start that raises is tried again at once (OTP's
  ``try_again_restart``), within the same intensity. More than ``max_restarts`` restarts
  within ``max_seconds`` is the one way a supervisor gives up: it stops all its
  children and exits with reason :class:`RestartIntensityExceeded` (OTP:
  ``reached_max_restart_intensity``, exit ``shutdown``), which its own supervisor
  handles as a failure of that child (escalation, up to the root).
- **Start at init** (OTP's ``init``): a static child whose first start fails makes the
  supervisor's own start fail (:func:`rho_actors.start_link` raises); a dynamic child's
  (``start_child``) start error goes back to its caller and the child is not added.
- **Automatic shutdown** (OTP 24's ``auto_shutdown`` and ``significant``): with
  ``auto_shutdown="any_significant"`` the supervisor stops (reason ``"normal"``) when a
  ``significant`` child ends and is not restarted; with ``"all_significant"``, when
  the last of them has.
- **Shutdown** (OTP's ``shutdown``): children stop in reverse start order, each within
  its ``shutdown`` milliseconds (then it is abandoned and logged: a thread cannot be
  killed, DESIGN §5), or at once with ``"brutal_kill"`` (told to exit, not waited for).
  Dynamic children stop all at once (OTP's ``DynamicSupervisor``).
- **Dynamic children** (OTP's ``DynamicSupervisor``): :meth:`Supervisor.start_child`
  adds children at run time; a ``transient`` one that ends normally, or a ``temporary``
  one, is forgotten. An id held by a running child is refused (OTP's
  ``already_started``).
- **Failed starts**: a start that raises (a ``BaseException`` included: it is the
  child's failure, never the supervisor's), returns no live :class:`rho_actors.Actor`
  ref, or runs past its start timeout (:class:`StartChild`'s ``timeout_s``) is a failed
  start (OTP's ``start_error``).
- **Reports** (OTP's supervisor progress and error reports): ``started``,
  ``crashed`` (``child_terminated``), ``start_failed`` (``start_error``),
  ``restarted``, ``gave_up`` (``reached_max_restart_intensity``) and ``escalated``
  (a child supervisor gave up), as :class:`rho_actors.SupervisorEvent` values given to
  the ``report`` callback and logged. Starts of ``temporary`` children are not reported
  (a call's actor per call would flood the log; their ends are results, not failures).
- **Names** (Erlang's ``register/2``): a child with a ``name`` is registered on every
  start, in the supervisor's ``names`` (default: :data:`rho_actors.otp.names.NAMES`,
  read with :func:`rho_actors.whereis`); when the supervisor gives up, the name keeps
  its :class:`RestartIntensityExceeded` (:meth:`Names.lookup` says why).

Which failures restart a child: an exception in a ``tell`` handler, in ``on_start``, a
``BaseException`` anywhere, or :func:`rho_actors.kill`. An exception raised while
handling an ``ask`` goes back to the caller and the child lives on (pykka's rule; OTP's
``gen_server:call`` would crash the server).

A supervisor may have a :class:`~rho_actors.otp.starters.ChildStarter`: children of one spec started in their
callers' threads and supervised from then on, without a message round trip.

Example::

    sup = start_link(Supervisor, [
        ChildSpec("kv", StartChild(KvServer), restart="permanent", name="kv"),
        ChildSpec("cache", StartChild(Cache), restart="transient", shutdown=1_000),
    ], strategy="one_for_one", max_restarts=3, max_seconds=5)
    which_children(sup)   # [ChildInfo(id='kv', ...), ChildInfo(id='cache', ...)]
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import pykka
from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.events import SupervisorEvent, SupervisorEventKind, logs_at
from rho_actors.otp.actor import NORMAL, Actor, Down, kill, monitor, start_link, stop_soon
from rho_actors.otp.names import NAMES, Names
from rho_actors.otp.owned import owner_now, owning
from rho_actors.otp.threads import ThreadPool

__all__ = [
    "ChildInfo",
    "ChildSpec",
    "RestartIntensityExceeded",
    "StartChild",
    "Starter",
    "Supervisor",
    "count_children",
    "send_report",
    "start_adopted",
    "which_children",
]

_INFO = 20  # loguru's level number of INFO

RestartType = Literal["permanent", "transient", "temporary"]
Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
STRATEGIES: tuple[Strategy, ...] = ("one_for_one", "one_for_all", "rest_for_one")
RESTART_TYPES: tuple[RestartType, ...] = ("permanent", "transient", "temporary")
AutoShutdown = Literal["never", "any_significant", "all_significant"]
AUTO_SHUTDOWNS: tuple[AutoShutdown, ...] = ("never", "any_significant", "all_significant")


@dataclass(frozen=True, slots=True)
class StartChild:
    """How to start a child: ``actor_class.start(*args, **kwargs)``, returning once its
    ``on_start`` has run (:func:`rho_actors.otp.actor.start_link`); the class must be a
    :class:`rho_actors.Actor` (so it can be monitored). An ``on_start`` running past
    ``timeout_s`` seconds is a failed start (``pykka.Timeout``; the actor is killed once
    it returns), as OTP's start timeout. The supervisor waits for the start meanwhile."""

    actor_class: type[Actor]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0

    def __call__(self) -> pykka.ActorRef[Any]:
        return start_link(self.actor_class, *self.args, timeout_s=self.timeout_s, **self.kwargs)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """A child spec (OTP's ``child_spec``), plain data.

    ``id`` names the child within its supervisor; ``start`` is a :class:`StartChild` or
    any callable returning the ref of a started :class:`rho_actors.Actor`; ``restart`` is
    ``"permanent"``, ``"transient"`` or ``"temporary"``; ``shutdown`` is how long it gets
    to stop, in milliseconds, or ``"brutal_kill"``; ``type`` is ``"worker"`` or
    ``"supervisor"``; ``name``, when given, is registered for ``whereis`` on every start;
    ``significant`` (only for ``transient`` and ``temporary`` children) marks a child
    whose end stops a supervisor with ``auto_shutdown`` (OTP 24).
    """

    id: str
    start: Callable[[], pykka.ActorRef[Any]]
    restart: RestartType = "permanent"
    shutdown: int | Literal["brutal_kill"] = 5_000
    type: Literal["worker", "supervisor"] = "worker"
    name: str | None = None
    significant: bool = False

    def __post_init__(self) -> None:
        if self.restart not in RESTART_TYPES:
            raise ValueError(f"child {self.id!r}: restart must be one of {RESTART_TYPES}, got {self.restart!r}")
        if self.shutdown != "brutal_kill" and not (type(self.shutdown) is int and self.shutdown >= 0):
            raise ValueError(f"child {self.id!r}: shutdown must be milliseconds >= 0 or 'brutal_kill'")
        if self.type not in ("worker", "supervisor"):
            raise ValueError(f"child {self.id!r}: type must be 'worker' or 'supervisor', got {self.type!r}")
        if self.significant and self.restart == "permanent":
            raise ValueError(f"child {self.id!r}: a permanent child cannot be significant (OTP)")


@dataclass(frozen=True, slots=True)
class ChildInfo:
    """A child as :meth:`Supervisor.which_children` reports it. ``children`` is set only
    for a lazy subtree whose supervisor has not started yet
    (:class:`rho_actors.otp.lazy.LazySubtree`): then ``ref`` is ``None`` and ``children``
    are the subtree's children as its supervisor would report them."""

    id: str
    ref: pykka.ActorRef[Any] | None
    type: str
    restart: str
    restarts: int
    alive: bool
    children: tuple[ChildInfo, ...] | None = None


class RestartIntensityExceeded(Exception):
    """A supervisor's exit reason when its children restarted too often (more than
    ``max_restarts`` in ``max_seconds``): it gave up. The message names the supervisor,
    the intensity and the last child's failure."""


@dataclass(slots=True)
class ChildRecord:
    """A supervisor's record of one child (for subclasses such as
    :class:`rho_actors.otp.lazy.LazySupervisor`): its spec and its ref now."""

    key: int
    spec: ChildSpec
    dynamic: bool = False
    ref: pykka.ActorRef[Any] | None = None
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class _Retry:
    key: int
    reason: object


@dataclass(frozen=True, slots=True)
class _WhichChildren:
    pass


class Starter(Protocol):
    """What a ``starter=`` is to its :class:`Supervisor`, which binds itself to it on
    start and unbinds at its end (a :class:`rho_actors.otp.starters.StarterBinding`)."""

    _supervisor: Supervisor | None

    def _bind(self, supervisor: Supervisor | None) -> None: ...


class Supervisor(Actor):
    """Starts and supervises children (see the module doc).

    Arguments: ``children``, the static child specs, started in order; ``strategy``;
    ``max_restarts`` restarts within ``max_seconds`` seconds (the restart intensity;
    OTP's defaults are 1 in 5 s, this one's 3 in 5 s); ``auto_shutdown``
    (``"never"``, ``"any_significant"``, ``"all_significant"``); ``names``, where
    children with a ``name`` are registered (default: the process's
    :data:`rho_actors.otp.names.NAMES`); ``starter``, a :class:`~rho_actors.otp.starters.ChildStarter` whose
    children this supervisor takes over; ``thread_pool``, where its loop runs (see
    :attr:`rho_actors.Actor.thread_pool`; default: a thread of its own); ``report``, called with each
    :class:`rho_actors.SupervisorEvent` (in this supervisor's thread: keep it quick).
    ``label`` names it in logs and reports. ``crashed`` (``(child id, reason)``) starts
    it as if that static child had just crashed: the child is not started with the
    others but restarted by the strategy, counting one restart (a lazy subtree's
    supervisor woken by its child's crash: :mod:`rho_actors.otp.lazy`). Raises ``ValueError`` for an unknown
    strategy or auto_shutdown, and the first start error of a child (the supervisor
    does not start then).
    """

    def __init__(
        self,
        children: tuple[ChildSpec, ...] | list[ChildSpec] = (),
        *,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        auto_shutdown: AutoShutdown = "never",
        names: Names | None = None,
        starter: Starter | None = None,
        thread_pool: ThreadPool | None = None,
        report: Callable[[SupervisorEvent], None] | None = None,
        label: str = "supervisor",
        crashed: tuple[str, object] | None = None,
    ) -> None:
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if auto_shutdown not in AUTO_SHUTDOWNS:
            raise ValueError(f"auto_shutdown must be one of {AUTO_SHUTDOWNS}, got {auto_shutdown!r}")
        ids = [spec.id for spec in children]
        if len(set(ids)) != len(ids):
            raise ValueError(f"child ids must be unique, got {ids}")
        self.strategy = strategy
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self.auto_shutdown = auto_shutdown
        self.label = label
        self._names = names if names is not None else NAMES
        self._starter = starter
        self.thread_pool = thread_pool
        self._adopting = True  # false once stopping: no child may join the shutdown late
        self._report_to = report
        self._static = list(children)
        self._crashed = crashed
        self._lock = threading.Lock()
        self._children: dict[int, ChildRecord] = {}  # start order
        self._by_urn: dict[str, int] = {}
        self._keys = itertools.count()
        self._restart_times: collections.deque[float] = collections.deque()
        self.restarts = 0
        self._owner = owner_now()  # its system's owned processes (rho_actors.otp.owned): passed to its children

    # --- starting -----------------------------------------------------------------------

    def on_start(self) -> None:
        crashed: ChildRecord | None = None
        try:
            for spec in self._static:
                if self._crashed is not None and spec.id == self._crashed[0]:  # ran before this supervisor
                    crashed = ChildRecord(next(self._keys), spec)
                    with self._lock:
                        self._children[crashed.key] = crashed
                else:
                    self._add(spec)
        except BaseException:
            self._shutdown_children()
            raise
        if self._starter is not None:
            self._starter._bind(self)
        if crashed is not None and self._crashed is not None:
            self._report("crashed", crashed, self._crashed[1])
            self.actor_ref.tell(_Retry(crashed.key, self._crashed[1]))  # restarted as any crashed child

    def _add(self, spec: ChildSpec) -> ChildRecord:
        child = ChildRecord(next(self._keys), spec)
        with self._lock:
            self._children[child.key] = child
        self._launch(child)
        self._report_started(child)
        return child

    def _report_started(self, child: ChildRecord) -> None:
        if child.spec.restart != "temporary":
            self._report("started", child)

    def _report(self, kind: SupervisorEventKind, child: ChildRecord, reason: object = None) -> None:
        send_report(self._report_to, self.label, kind, child.spec.id, reason, child.restarts)

    def _launch(self, child: ChildRecord) -> None:
        try:
            with owning(self._owner):
                ref = child.spec.start()
        except Exception:
            raise
        except BaseException as exc:  # the child's failure (sys.exit in a start), not this supervisor's
            raise RuntimeError(f"child {child.spec.id!r}: its start raised {_reason_text(exc)}") from exc
        self._watch(child, ref)

    def adopt(self, ref: pykka.ActorRef[Any], spec: ChildSpec) -> None:
        """Supervise a ``temporary`` child started elsewhere (see
        :meth:`~rho_actors.otp.starters.ChildStarter.start`); safe from any thread. Raises
        ``pykka.ActorDeadError`` once this supervisor is stopping, ``ValueError`` for a
        spec that is not ``temporary`` or that is ``significant`` or named."""
        if spec.restart != "temporary" or spec.significant or spec.name is not None:
            raise ValueError(f"child {spec.id!r}: only an unnamed, temporary, insignificant child can be adopted")
        if not issubclass(ref.actor_class, Actor):
            raise TypeError(f"child {spec.id!r}: {ref.actor_class.__name__} is not a rho_actors.Actor")
        child = ChildRecord(next(self._keys), spec, dynamic=True, ref=ref)
        with self._lock:
            if not self._adopting or self.actor_stopped.is_set():
                raise pykka.ActorDeadError(f"{self.label} is stopping")
            self._children[child.key] = child
            self._by_urn[ref.actor_urn] = child.key
        monitor(ref, self._forget_temporary)

    def forget(self, ref: pykka.ActorRef[Any]) -> None:
        """Stop supervising an adopted child (no shutdown waits for it); safe from any
        thread."""
        self._forget_temporary(ref, None)

    def _watch(self, child: ChildRecord, ref: pykka.ActorRef[Any]) -> None:
        if not isinstance(ref, pykka.ActorRef):
            raise TypeError(
                f"child {child.spec.id!r}: its start returned {ref!r}, not the ref of a started rho_actors.Actor"
            )
        if not issubclass(ref.actor_class, Actor):
            ref.stop(block=False)
            raise TypeError(f"child {child.spec.id!r}: {ref.actor_class.__name__} is not a rho_actors.Actor")
        with self._lock:
            child.ref = ref
            self._by_urn[ref.actor_urn] = child.key
        # watched before anyone can find it by its name: a stop from a thread that did comes
        # with its real reason (never "noproc", which would be taken for a crash)
        if child.spec.restart == "temporary" and not child.spec.significant:
            # Forgotten when it ends: no message, so no wake-up of this supervisor per exit.
            monitor(ref, self._forget_temporary)
        else:
            monitor(ref, self.actor_ref)
        if child.spec.name is not None and self._names is not None:
            try:
                self._names.register(child.spec.name, ref)
            except ValueError:
                with self._lock:  # not this supervisor's child after all: its end is nobody's news
                    if child.ref is ref:
                        child.ref = None
                    self._by_urn.pop(ref.actor_urn, None)
                ref.stop(block=False)
                raise

    def _forget_temporary(self, ref: pykka.ActorRef[Any], _reason: object) -> None:
        with self._lock:
            key = self._by_urn.pop(ref.actor_urn, None)
            if key is not None:
                self._children.pop(key, None)

    def start_child(self, spec: ChildSpec) -> pykka.ActorRef[Any]:
        """Add and start a child at run time (OTP's ``start_child``); returns its ref.
        Raises ``ValueError`` when a running child has ``spec.id`` (OTP's
        ``already_started``), and the child's start error (the child is not added then,
        as in OTP)."""
        with self._lock:
            running = [c.ref for c in self._children.values()
                       if c.spec.id == spec.id and c.ref is not None and c.ref.is_alive()]
        if running:
            raise ValueError(f"child {spec.id!r} is already started (OTP's already_started): {running[0]}")
        return self._start_dynamic(spec)

    def _start_dynamic(self, spec: ChildSpec) -> pykka.ActorRef[Any]:
        child = ChildRecord(next(self._keys), spec, dynamic=True)
        self._launch(child)
        with self._lock:
            self._children[child.key] = child
        self._report_started(child)
        assert child.ref is not None
        return child.ref

    def terminate_child(self, child_id: str) -> bool:
        """Stop the child(ren) with this id within its shutdown and forget it; returns
        whether one was found."""
        with self._lock:
            found = [c for c in self._children.values() if c.spec.id == child_id]
            for child in found:
                del self._children[child.key]
        for child in found:
            self._stop_child(child)
        return bool(found)

    def which_children(self) -> list[ChildInfo]:
        """The children, in start order (OTP's ``which_children``)."""
        with self._lock:
            children = list(self._children.values())
        return [self._info(c) for c in children]

    def _info(self, c: ChildRecord) -> ChildInfo:
        alive = c.ref is not None and c.ref.is_alive()
        return ChildInfo(c.spec.id, c.ref, c.spec.type, c.spec.restart, c.restarts, alive)

    # --- failures -----------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Down):
            self._down(message.ref, message.reason)
        elif isinstance(message, _Retry):
            self._try_again(message.key, message.reason)
        elif isinstance(message, _WhichChildren):
            return self.which_children()
        else:
            logger.warning("{} ignored an unknown message {!r}", self.label, message)
        return None

    def _down(self, ref: pykka.ActorRef[Any], reason: object) -> None:
        with self._lock:
            key = self._by_urn.pop(ref.actor_urn, None)
            child = self._children.get(key) if key is not None else None
        if child is None or child.ref is not ref:
            return  # stopped by this supervisor, or already replaced
        child.ref = None
        if child.spec.restart == "temporary" or (reason == NORMAL and child.spec.restart == "transient"):
            logger.debug("{}: child {} ended ({}), not restarted", self.label, child.spec.id, _reason_text(reason))
            if child.dynamic or child.spec.restart == "temporary":  # forgotten, as in OTP
                with self._lock:
                    self._children.pop(child.key, None)
            if child.spec.significant:
                self._maybe_auto_shutdown()
            return
        escalated = child.spec.type == "supervisor" and isinstance(reason, RestartIntensityExceeded)
        self._report("escalated" if escalated else "crashed", child, reason)
        self._restart(child, reason)

    def _maybe_auto_shutdown(self) -> None:
        """OTP's ``auto_shutdown``: stop normally once a significant child (any, or the
        last) has ended without a restart."""
        if self.auto_shutdown == "never":
            return
        with self._lock:
            left = any(c.spec.significant and c.ref is not None for c in self._children.values())
        if self.auto_shutdown == "any_significant" or not left:
            logger.debug("{}: a significant child ended; shutting down (auto_shutdown)", self.label)
            self.actor_ref.stop(block=False)

    def _try_again(self, key: int, reason: object) -> None:
        with self._lock:
            child = self._children.get(key)
        if child is not None and child.ref is None:
            self._restart(child, reason)

    def _restart(self, child: ChildRecord, reason: object) -> None:
        """Restart ``child`` by the strategy; this counts as one restart. A start that
        raises is reported and tried again through the inbox (OTP's
        ``try_again_restart``), counting again; past the intensity the supervisor gives up."""
        now = time.monotonic()
        self._restart_times.append(now)
        while self._restart_times and self._restart_times[0] < now - self.max_seconds:
            self._restart_times.popleft()
        if len(self._restart_times) > self.max_restarts:
            self._give_up(child, reason)
        with self._lock:
            order = list(self._children.values())
        if self.strategy == "one_for_one" or child not in order:
            group = [child]
        elif self.strategy == "one_for_all":
            group = order
        else:  # rest_for_one
            group = order[order.index(child):]
        for other in reversed(group):
            if other is not child:
                self._stop_child(other)
        for member in group:
            if member.spec.restart == "temporary":  # stopped with the group, never restarted (OTP)
                with self._lock:
                    self._children.pop(member.key, None)
                continue
            member.restarts += 1
            self.restarts += 1
            try:
                self._launch(member)
            except Exception as exc:
                self._report("start_failed", member, exc)
                self.actor_ref.tell(_Retry(member.key, exc))
                return
            self._report("restarted", member)

    def _give_up(self, child: ChildRecord, reason: object) -> None:
        """Past the restart intensity: stop every child, mark their names, stop taking
        messages, then report and exit with :class:`RestartIntensityExceeded` (raised
        here). A host reacting to the ``gave_up`` report already sees the names say why
        and this supervisor not alive."""
        exc = RestartIntensityExceeded(
            f"{self.label}: more than {self.max_restarts} restarts in {self.max_seconds} s "
            f"(last: child {child.spec.id!r}, {_reason_text(reason)})"
        )
        with self._lock:
            named = [c.spec.name for c in self._children.values() if c.spec.name is not None]
        self._shutdown_children()
        for name in named:
            self._names.gave_up(name, exc)
        pykka.ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()  # is_alive() is false from here: a tell now fails fast
        self._report("gave_up", child, exc)
        raise exc

    # --- shutdown -----------------------------------------------------------------------

    def _stop_child(self, child: ChildRecord) -> None:
        self._await_stop(child, self._signal_stop(child))

    def _signal_stop(self, child: ChildRecord) -> threading.Event | None:
        """Ask a child to stop; returns an event set once it has ended (its ``on_stop``
        done), or None when there is nothing to wait for."""
        ref, child.ref = child.ref, None
        if ref is None:
            return None
        with self._lock:
            self._by_urn.pop(ref.actor_urn, None)
        if child.spec.shutdown == "brutal_kill":
            kill(ref, "shutdown")
            return None
        ended = threading.Event()
        monitor(ref, lambda _ref, _reason: ended.set())
        stop_soon(ref)  # a waking child with no thread for its stop is ended here
        return ended

    def _await_stop(self, child: ChildRecord, ended: threading.Event | None, since: float | None = None) -> None:
        if ended is None or child.spec.shutdown == "brutal_kill":
            return
        left = child.spec.shutdown / 1000 - (time.monotonic() - since if since is not None else 0.0)
        if not ended.wait(max(0.0, left)):
            logger.warning("{}: child {} did not stop within {} ms; abandoned", self.label, child.spec.id,
                           child.spec.shutdown)

    def _shutdown_children(self) -> None:
        """Dynamic children all at once (they are independent, as in OTP's
        DynamicSupervisor), then static children one by one, in reverse start order."""
        with self._lock:
            children = list(self._children.values())[::-1]
        since = time.monotonic()
        dynamic = [(c, self._signal_stop(c)) for c in children if c.dynamic]
        for child, ended in dynamic:
            self._await_stop(child, ended, since)
        for child in children:
            if not child.dynamic:
                self._stop_child(child)

    def on_stop(self) -> None:
        self._release_starter()
        self._shutdown_children()

    def on_failure(self, *exc_info: Any) -> None:
        """A supervisor that fails (it gave up, or a bug) stops all its children before
        it exits, as in OTP."""
        self._release_starter()
        self._shutdown_children()

    def _release_starter(self) -> None:
        with self._lock:
            self._adopting = False
        if self._starter is not None and self._starter._supervisor is self:
            self._starter._bind(None)


def send_report(report_to: Callable[[SupervisorEvent], None] | None, label: str, kind: SupervisorEventKind,
                child_id: str, reason: object = None, restarts: int = 0) -> None:
    """Log one supervisor report and give it to ``report_to`` (whose failure is logged,
    never raised): the reports of the supervisor labelled ``label``."""
    text = None if reason is None else _reason_text(reason)
    if kind in ("started", "restarted"):
        if logs_at(_INFO, __name__):  # a session's start reports one: mostly unwanted (rho_actors' logs are off)
            logger.info("{}: child {} {}", label, child_id, kind)
    elif kind in ("gave_up", "escalated"):
        logger.error("{}: {} (child {}): {}", label, kind.replace("_", " "), child_id, text)
    else:
        logger.warning("{}: child {} {}: {}", label, child_id, kind.replace("_", " "), text)
    if report_to is not None:
        try:
            report_to(SupervisorEvent(kind, label, child_id, text, restarts))
        except BaseException:  # a host's callback must not fail the supervisor
            logger.exception("{}: the report callback raised", label)


def _reason_text(reason: object) -> str:
    return describe_exception(reason) if isinstance(reason, BaseException) else str(reason)


def which_children(supervisor: pykka.ActorRef[Any], timeout_s: float = 10.0) -> list[ChildInfo]:
    """The children of the :class:`Supervisor` behind ``supervisor``, in start order
    (OTP's ``supervisor:which_children/1``). Raises ``pykka.ActorDeadError`` when it has
    stopped and ``pykka.Timeout`` past ``timeout_s`` seconds."""
    children: list[ChildInfo] = supervisor.ask(_WhichChildren(), block=True, timeout=timeout_s)
    return children


def count_children(supervisor: pykka.ActorRef[Any], timeout_s: float = 10.0) -> dict[str, int]:
    """OTP's ``supervisor:count_children/1``: ``{"specs", "active", "supervisors",
    "workers"}`` of the :class:`Supervisor` behind ``supervisor``. Raises as
    :func:`which_children`."""
    children = which_children(supervisor, timeout_s)
    return {
        "specs": len(children),
        "active": sum(c.alive for c in children),
        "supervisors": sum(c.type == "supervisor" for c in children),
        "workers": sum(c.type == "worker" for c in children),
    }


def start_adopted(parent: Any, subtree: ChildSpec, timeout_s: float = 10.0) -> pykka.ActorRef[Any]:
    """Start ``subtree`` (a ``temporary`` supervisor's spec with one child) in the calling
    thread, hand it to ``parent`` (a proxy of a dynamic :class:`Supervisor`) to supervise,
    and return the ref of its child. Started here, then adopted: a subtree whose start is
    slow holds up no sibling's (the parent's thread never waits for it; OTP starts a
    child in the supervisor's process). Raises ``ValueError`` when ``parent`` already has
    a live child of that id (OTP's ``already_started``), the child's start error (a
    ``RuntimeError`` for a ``BaseException``), and ``RuntimeError`` when ``parent`` is
    stopping. ``timeout_s`` bounds each ask of ``parent`` (seconds)."""
    children: list[ChildInfo] = parent.which_children().get(timeout=timeout_s)
    if any(c.id == subtree.id and c.alive for c in children):
        raise ValueError(f"child {subtree.id!r} is already started under {parent.label.get(timeout=timeout_s)!r} "
                         "(OTP's already_started)")
    try:
        sup = subtree.start()
    except Exception:
        raise
    except BaseException as exc:  # the child's failure (sys.exit in its start), not the caller's
        raise RuntimeError(f"child {subtree.id!r}: its start raised {describe_exception(exc)}") from exc
    try:
        parent.adopt(sup, subtree).get(timeout=timeout_s)
    except (pykka.ActorDeadError, pykka.Timeout) as exc:
        sup.stop(block=False)
        raise RuntimeError(f"child {subtree.id!r} was not started: its supervisor is stopping") from exc
    [started] = which_children(sup, timeout_s)
    assert started.ref is not None
    return started.ref
