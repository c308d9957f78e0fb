"""OTP supervisors for pykka actors: child specs as plain data, restart strategies,
restart intensity with escalation, and ordered shutdown (DESIGN §6).

A :class:`Supervisor` starts its children from :class:`ChildSpec` values, in order, and
monitors them (:func:`rho_actors.actor.monitor`). When a child ends:

- its **restart type** says whether to restart it: ``permanent`` always, ``transient``
  only after an abnormal exit (any reason but ``"normal"``), ``temporary`` never (the
  child is forgotten);
- the **strategy** says what else restarts with it: ``one_for_one`` (only it),
  ``one_for_all`` (every child: the others are stopped, in reverse start order, then all
  started again in order), ``rest_for_one`` (it and the children started after it);
- the **restart intensity**: more than ``max_restarts`` restarts within ``max_seconds``
  makes the supervisor stop all its children and exit with reason
  :class:`RestartIntensityExceeded`, which its own supervisor handles as a child's
  failure (escalation up to the root).

Shutdown stops children in reverse start order, each within its ``shutdown``
milliseconds (then it is abandoned and logged: a thread cannot be killed, DESIGN §5) or
at once with ``"brutal_kill"`` (told to exit and not waited for).

Children may be added at run time with :meth:`Supervisor.start_child` (OTP's
``DynamicSupervisor``). A supervisor may keep spares (:class:`Spares`): children of one
spec started ahead of need, taken without a message round trip; each still does one job.

Example::

    sup = Supervisor.start([
        ChildSpec("kv", StartChild(KvServer), restart="permanent", name="kv"),
        ChildSpec("cache", StartChild(Cache), restart="transient", shutdown=1_000),
    ], strategy="one_for_one", max_restarts=3, max_seconds=5)
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pykka
from loguru import logger

from rho_actors.actor import NORMAL, Actor, Down, Names, kill, monitor, start_link

__all__ = [
    "ChildInfo",
    "ChildSpec",
    "RestartIntensityExceeded",
    "Spares",
    "StartChild",
    "Supervisor",
]

RestartType = Literal["permanent", "transient", "temporary"]
Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
STRATEGIES: tuple[Strategy, ...] = ("one_for_one", "one_for_all", "rest_for_one")
RESTART_TYPES: tuple[RestartType, ...] = ("permanent", "transient", "temporary")


@dataclass(frozen=True, slots=True)
class StartChild:
    """How to start a child: ``actor_class.start(*args, **kwargs)``, returning once its
    ``on_start`` has run (:func:`rho_actors.actor.start_link`); the class must be a
    :class:`rho_actors.Actor` (so it can be monitored)."""

    actor_class: type[Actor]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> pykka.ActorRef[Any]:
        return start_link(self.actor_class, *self.args, **self.kwargs)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """A child spec (OTP's ``child_spec``), plain data.

    ``id`` names the child within its supervisor; ``start`` is a :class:`StartChild` or
    any callable returning the ref of a started :class:`rho_actors.Actor`; ``restart`` is
    ``"permanent"``, ``"transient"`` or ``"temporary"``; ``shutdown`` is how long it gets
    to stop, in milliseconds, or ``"brutal_kill"``; ``type`` is ``"worker"`` or
    ``"supervisor"``; ``name``, when given, is registered for ``whereis`` on every start.
    """

    id: str
    start: Callable[[], pykka.ActorRef[Any]]
    restart: RestartType = "permanent"
    shutdown: int | Literal["brutal_kill"] = 5_000
    type: Literal["worker", "supervisor"] = "worker"
    name: str | None = None

    def __post_init__(self) -> None:
        if self.restart not in RESTART_TYPES:
            raise ValueError(f"child {self.id!r}: restart must be one of {RESTART_TYPES}, got {self.restart!r}")
        if self.shutdown != "brutal_kill" and not (type(self.shutdown) is int and self.shutdown >= 0):
            raise ValueError(f"child {self.id!r}: shutdown must be milliseconds >= 0 or 'brutal_kill'")
        if self.type not in ("worker", "supervisor"):
            raise ValueError(f"child {self.id!r}: type must be 'worker' or 'supervisor', got {self.type!r}")


@dataclass(frozen=True, slots=True)
class ChildInfo:
    """A child as :meth:`Supervisor.which_children` reports it."""

    id: str
    ref: pykka.ActorRef[Any] | None
    type: str
    restart: str
    restarts: int
    alive: bool


class RestartIntensityExceeded(Exception):
    """A supervisor's exit reason when its children restarted too often."""


@dataclass(slots=True)
class _Child:
    key: int
    spec: ChildSpec
    dynamic: bool = False
    ref: pykka.ActorRef[Any] | None = None
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class _Replenish:
    pass


@dataclass(frozen=True, slots=True)
class _Forget:
    ref: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class _Adopt:
    ref: pykka.ActorRef[Any]
    spec: ChildSpec


class Spares:
    """Children of one spec started ahead of need by a supervisor (``spare=`` in
    :class:`Supervisor`); :meth:`take` is safe from any thread. The pool outlives a
    restart of its supervisor: the new one binds to it."""

    def __init__(self, spec: ChildSpec, count: int, rebind_s: float = 1.0) -> None:
        self.spec = spec
        self.count = count
        self._idle: collections.deque[pykka.ActorRef[Any]] = collections.deque()
        self._supervisor: pykka.ActorRef[Supervisor] | None = None
        self._bound = threading.Condition()
        self._rebind_s = rebind_s
        self.closed = False

    def _bind(self, supervisor: pykka.ActorRef[Supervisor] | None) -> None:
        with self._bound:
            self._supervisor = supervisor
            self._bound.notify_all()

    def close(self) -> None:
        """No more children: :meth:`take` fails at once from now on (the system stops)."""
        self.closed = True
        self._bind(None)

    def _running_supervisor(self) -> pykka.ActorRef[Supervisor]:
        """The supervisor, waiting up to ``rebind_s`` seconds while it is restarted."""
        with self._bound:
            self._bound.wait_for(
                lambda: self.closed or (self._supervisor is not None and self._supervisor.is_alive()), self._rebind_s
            )
            supervisor = self._supervisor
        if self.closed:
            raise pykka.ActorDeadError("the system is stopping")
        if supervisor is None or not supervisor.is_alive():
            raise pykka.ActorDeadError(f"the supervisor of the spares is not running (waited {self._rebind_s} s)")
        return supervisor

    def take(self) -> pykka.ActorRef[Any]:
        """A started child for one job: a spare when one is idle, else one started now
        in this thread and handed to the supervisor (waiting up to ``rebind_s`` seconds
        for a supervisor being restarted). Call :meth:`replenish` later, off the hot
        path. Raises ``pykka.ActorDeadError`` naming why when there is no supervisor."""
        while True:
            try:
                ref = self._idle.popleft()
            except IndexError:
                break
            if ref.is_alive():
                return ref
        supervisor = self._running_supervisor()
        # Started in the caller's thread and handed over: a burst of calls from many
        # loops is not serialised through the supervisor's one thread.
        started = self.spec.start()
        try:
            supervisor.tell(_Adopt(started, self.spec))
        except pykka.ActorDeadError:
            started.stop(block=False)
            raise
        return started

    def replenish(self) -> None:
        """Ask the supervisor to start spares up to :attr:`count` again (asynchronously)."""
        if self._supervisor is not None:
            try:
                self._supervisor.tell(_Replenish())
            except pykka.ActorDeadError:
                pass

    def abandon(self, ref: pykka.ActorRef[Any]) -> None:
        """Stop supervising a child that was given up on (a call past its deadline): no
        shutdown waits for it."""
        if self._supervisor is not None:
            try:
                self._supervisor.tell(_Forget(ref))
            except pykka.ActorDeadError:
                pass

    def __len__(self) -> int:
        return len(self._idle)


class Supervisor(Actor):
    """Starts and supervises children (see the module doc).

    Arguments: ``children``, the static child specs, started in order; ``strategy``;
    ``max_restarts`` restarts within ``max_seconds`` seconds (the restart intensity);
    ``names``, where children with a ``name`` are registered; ``spares``, a
    :class:`Spares` pool this supervisor keeps filled. ``label`` names it in logs.
    Raises ``ValueError`` for an unknown strategy and the first start error of a child
    (the supervisor does not start then).
    """

    def __init__(
        self,
        children: tuple[ChildSpec, ...] | list[ChildSpec] = (),
        *,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        names: Names | None = None,
        spares: Spares | None = None,
        label: str = "supervisor",
    ) -> None:
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        ids = [spec.id for spec in children]
        if len(set(ids)) != len(ids):
            raise ValueError(f"child ids must be unique, got {ids}")
        self.strategy = strategy
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self.label = label
        self._names = names
        self._spares = spares
        self._static = list(children)
        self._lock = threading.Lock()
        self._children: dict[int, _Child] = {}  # start order
        self._by_urn: dict[str, int] = {}
        self._keys = itertools.count()
        self._restart_times: collections.deque[float] = collections.deque()
        self.restarts = 0

    # --- starting -----------------------------------------------------------------------

    def on_start(self) -> None:
        try:
            for spec in self._static:
                self._add(spec)
        except BaseException:
            self._shutdown_children()
            raise
        if self._spares is not None:
            self._spares._idle.clear()
            self._spares._bind(self.actor_ref)
            self._fill_spares()

    def _add(self, spec: ChildSpec) -> _Child:
        child = _Child(next(self._keys), spec)
        with self._lock:
            self._children[child.key] = child
        self._launch(child)
        return child

    def _launch(self, child: _Child) -> None:
        self._watch(child, child.spec.start())

    def _adopt(self, ref: pykka.ActorRef[Any], spec: ChildSpec) -> None:
        """Supervise a child started elsewhere (see :meth:`Spares.take`)."""
        child = _Child(next(self._keys), spec, dynamic=True)
        with self._lock:
            self._children[child.key] = child
        self._watch(child, ref)

    def _watch(self, child: _Child, ref: pykka.ActorRef[Any]) -> None:
        if not issubclass(ref.actor_class, Actor):
            ref.stop(block=False)
            raise TypeError(f"child {child.spec.id!r}: {ref.actor_class.__name__} is not a rho_actors.Actor")
        if child.spec.name is not None and self._names is not None:
            try:
                self._names.register(child.spec.name, ref)
            except ValueError:
                ref.stop(block=False)
                raise
        with self._lock:
            child.ref = ref
            self._by_urn[ref.actor_urn] = child.key
        if child.spec.restart == "temporary":
            # Forgotten when it ends: no message, so no wake-up of this supervisor per exit.
            monitor(ref, self._forget_temporary)
        else:
            monitor(ref, self.actor_ref)

    def _forget_temporary(self, ref: pykka.ActorRef[Any], _reason: object) -> None:
        with self._lock:
            key = self._by_urn.pop(ref.actor_urn, None)
            if key is not None:
                self._children.pop(key, None)

    def _fill_spares(self) -> None:
        assert self._spares is not None
        while len(self._spares) < self._spares.count:
            self._spares._idle.append(self.start_child(self._spares.spec))

    def start_child(self, spec: ChildSpec) -> pykka.ActorRef[Any]:
        """Add and start a child at run time; returns its ref. Raises the child's start
        error (the child is not added then)."""
        child = _Child(next(self._keys), spec, dynamic=True)
        self._launch(child)
        with self._lock:
            self._children[child.key] = child
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
        """The children, in start order."""
        with self._lock:
            children = list(self._children.values())
        return [
            ChildInfo(c.spec.id, c.ref, c.spec.type, c.spec.restart, c.restarts, c.ref is not None and c.ref.is_alive())
            for c in children
        ]

    # --- failures -----------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Down):
            self._down(message.ref, message.reason)
        elif isinstance(message, _Replenish):
            if self._spares is not None:
                self._fill_spares()
        elif isinstance(message, _Forget):
            self._forget_temporary(message.ref, None)
        elif isinstance(message, _Adopt):
            self._adopt(message.ref, message.spec)
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
        if reason == NORMAL and child.spec.restart == "transient":
            logger.debug("{}: transient child {} ended normally", self.label, child.spec.id)
            if child.dynamic:  # as OTP's DynamicSupervisor: a child not restarted is forgotten
                with self._lock:
                    self._children.pop(child.key, None)
            return
        logger.warning("{}: child {} ended ({}); strategy {}", self.label, child.spec.id, _reason_text(reason),
                       self.strategy)
        now = time.monotonic()
        self._restart_times.append(now)
        while self._restart_times and self._restart_times[0] < now - self.max_seconds:
            self._restart_times.popleft()
        if len(self._restart_times) > self.max_restarts:
            self._shutdown_children()
            raise RestartIntensityExceeded(
                f"{self.label}: more than {self.max_restarts} restarts in {self.max_seconds} s "
                f"(last: child {child.spec.id!r}, {_reason_text(reason)})"
            )
        with self._lock:
            order = list(self._children.values())
        if self.strategy == "one_for_one":
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
            self._launch(member)  # a start that fails fails this supervisor (see on_failure)

    # --- shutdown -----------------------------------------------------------------------

    def _stop_child(self, child: _Child) -> None:
        self._await_stop(child, self._signal_stop(child))

    def _signal_stop(self, child: _Child) -> threading.Event | None:
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
        try:
            ref.stop(block=False)
        except pykka.ActorDeadError:
            pass
        return ended

    def _await_stop(self, child: _Child, ended: threading.Event | None, since: float | None = None) -> None:
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
        self._release_spares()
        self._shutdown_children()

    def on_failure(self, *exc_info: Any) -> None:
        """A supervisor that fails (a child could not be restarted, or the restart
        intensity was exceeded) stops all its children before it exits, as in OTP."""
        self._release_spares()
        self._shutdown_children()

    def _release_spares(self) -> None:
        if self._spares is not None and self._spares._supervisor is self.actor_ref:
            self._spares._bind(None)


def _reason_text(reason: object) -> str:
    if isinstance(reason, BaseException):
        from rho_actors.encoding import describe_exception

        return describe_exception(reason)
    return str(reason)
