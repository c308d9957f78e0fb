"""Lazy subtrees: a subtree whose supervisor starts only when its child first needs a
restart (DESIGN §6 "Sessions").

A session is a subtree of one supervisor over one ``transient``, ``significant`` child
(its LoopActor) under ``auto_shutdown="any_significant"``: until that child crashes,
the supervisor has nothing to do. A :class:`LazySupervisor` (the system's ``sessions``)
therefore starts such a :class:`LazySubtree`'s child alone, in the caller's thread, and
supervises it itself, standing for the subtree's supervisor:

- the child is registered under its name and reported ``started`` with the subtree's
  label, as its own supervisor would;
- a normal end (a ``transient`` child not restarted: the subtree's ``auto_shutdown``)
  forgets the subtree, in the ending thread: no supervisor wakes up;
- an abnormal end wakes the subtree up: its supervisor is started then (in the
  ``LazySupervisor``'s thread, as OTP restarts in the supervisor) with the crash
  (``Supervisor(crashed=...)``), reports it, restarts the child by its spec and counts
  the restart within its own intensity; from then on the subtree is an ordinary one;
- a stop of the ``LazySupervisor`` stops the child within the subtree's ``shutdown``;
- :meth:`Supervisor.which_children` shows the subtree as a ``supervisor`` child whose
  ``children`` are its child (:class:`rho_actors.otp.supervisor.ChildInfo`), so a tree
  reads the same before and after the wake-up.

Fault isolation is the subtree's: a child crashing more often than the intensity allows
gives up that subtree only, and its name says why (:meth:`Names.lookup`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka
from loguru import logger

from rho_actors.otp.actor import NORMAL, end_unstarted, monitor, on_actor_thread, stop_soon
from rho_actors.otp.owned import owning
from rho_actors.otp.starters import StarterBinding
from rho_actors.otp.supervisor import (
    ChildInfo,
    ChildRecord,
    ChildSpec,
    RestartIntensityExceeded,
    StartChild,
    Supervisor,
    send_report,
)

__all__ = ["LazyStarter", "LazySubtree", "LazySupervisor", "SessionSubtrees"]


@dataclass(frozen=True, slots=True)
class LazySubtree:
    """A subtree that may start lazily: ``spec`` is its supervisor's child spec (a
    ``temporary`` ``supervisor`` child whose ``start`` is a :class:`StartChild` of a
    :class:`Supervisor` with ``auto_shutdown="any_significant"`` and the default
    ``one_for_one`` strategy, over ``child`` alone); ``child`` is that one child (named,
    ``transient`` and ``significant``). Raises ``ValueError`` naming what does not fit."""

    spec: ChildSpec
    child: ChildSpec

    def __post_init__(self) -> None:
        start, child = self.spec.start, self.child
        if not (isinstance(start, StartChild) and issubclass(start.actor_class, Supervisor)):
            raise ValueError(f"lazy subtree {self.spec.id!r}: its start must be a StartChild of a Supervisor")
        if self.spec.restart != "temporary" or self.spec.type != "supervisor":
            raise ValueError(f"lazy subtree {self.spec.id!r}: it must be a temporary supervisor child")
        if start.kwargs.get("children") != [child] or start.kwargs.get("auto_shutdown") != "any_significant":
            raise ValueError(f"lazy subtree {self.spec.id!r}: its supervisor must have child {child.id!r} alone, "
                             "with auto_shutdown='any_significant'")
        if start.kwargs.get("strategy", "one_for_one") != "one_for_one":
            raise ValueError(f"lazy subtree {self.spec.id!r}: its strategy must be one_for_one")
        if child.restart != "transient" or not child.significant or child.name is None:
            raise ValueError(f"lazy subtree {self.spec.id!r}: its child must be named, transient and significant")

    @property
    def label(self) -> str:
        """The subtree supervisor's label (its reports' ``supervisor``)."""
        return str(self.spec.start.kwargs.get("label", "supervisor"))  # type: ignore[attr-defined]


class SessionSubtrees:
    """Makes each session's :class:`LazySubtree` (DESIGN §6 "Sessions"): a ``temporary``
    ``supervisor`` child ``session_id`` (shutdown ``shutdown_ms``), a :class:`Supervisor`
    labelled ``session:<id>`` (``supervisor_kwargs`` beside its ``children`` and label,
    ``auto_shutdown="any_significant"``), over the session's ``loop`` child: ``transient``,
    ``significant``, named. The first is made with the checked constructors; every other
    is made as it, its fields set through their slots: a frozen dataclass's ``__init__``
    sets each through ``object.__setattr__`` and checks values known good here (~55k
    instructions of a session's start, against ~12k)."""

    __slots__ = ("_kwargs", "_shutdown_ms")

    def __init__(self, supervisor_kwargs: dict[str, Any], shutdown_ms: int) -> None:
        self._kwargs = {**supervisor_kwargs, "auto_shutdown": "any_significant"}
        self._shutdown_ms = shutdown_ms
        checked = self.checked("s", _never_started, "loop:s")  # what make() makes, by the constructors' rules
        if self.make("s", checked.child.start, "loop:s") != checked:
            raise RuntimeError("SessionSubtrees: the subtree made through the slots differs from the constructors'")

    def checked(self, session_id: str, start: Callable[[], pykka.ActorRef[Any]], name: str) -> LazySubtree:
        """:meth:`make`'s subtree, made by the constructors (each value checked)."""
        loop = ChildSpec("loop", start, restart="transient", significant=True, name=name)
        kwargs = {**self._kwargs, "label": f"session:{session_id}", "children": [loop]}
        session = ChildSpec(session_id, StartChild(Supervisor, kwargs=kwargs), restart="temporary",
                            type="supervisor", shutdown=self._shutdown_ms)
        return LazySubtree(session, loop)

    def make(self, session_id: str, start: Callable[[], pykka.ActorRef[Any]], name: str) -> LazySubtree:
        """The subtree of session ``session_id`` (a checked id) whose loop is started by ``start``
        and named ``name``."""
        loop = _slotted(ChildSpec, "loop", start, "transient", _SPEC_SHUTDOWN, "worker", name, True)
        kwargs = {**self._kwargs, "label": f"session:{session_id}", "children": [loop]}
        supervisor = _slotted(StartChild, Supervisor, (), kwargs, _START_TIMEOUT_S)
        spec = _slotted(ChildSpec, session_id, supervisor, "temporary", self._shutdown_ms, "supervisor", None, False)
        subtree: LazySubtree = _slotted(LazySubtree, spec, loop)
        return subtree


def _never_started() -> pykka.ActorRef[Any]:
    raise RuntimeError("SessionSubtrees' own check starts nothing")


_SLOTS = {cls: tuple(cls.__dict__[f.name].__set__ for f in dataclasses.fields(cls))
          for cls in (ChildSpec, StartChild, LazySubtree)}
_SPEC_SHUTDOWN = ChildSpec.__dataclass_fields__["shutdown"].default  # a child spec's and a start's defaults
_START_TIMEOUT_S = StartChild.__dataclass_fields__["timeout_s"].default


def _slotted(cls: type[Any], *values: Any) -> Any:
    """An instance of the frozen, slotted dataclass ``cls`` with ``values`` (each field's, in order)."""
    made = object.__new__(cls)
    for setter, value in zip(_SLOTS[cls], values, strict=True):
        setter(made, value)
    return made


@dataclass(frozen=True, slots=True)
class _Wake:
    key: int
    ref: pykka.ActorRef[Any]
    reason: object


class LazyStarter(StarterBinding):
    """Starts lazy subtrees under the bound :class:`LazySupervisor` from any thread,
    without a message (``starter=`` of :class:`LazySupervisor`); it outlives a restart of
    that supervisor (the new one binds to it)."""

    def start(self, subtree: LazySubtree) -> pykka.ActorRef[Any]:
        """Start ``subtree``'s child now, in this thread, supervised lazily; returns its
        ref. Raises ``ValueError`` when a live subtree has its id (OTP's
        ``already_started``) or a live actor holds the child's name, the child's start
        error, and ``pykka.ActorDeadError`` when no supervisor is running (waiting up to
        ``rebind_s`` seconds for one being restarted)."""
        supervisor = self.running_supervisor("lazy subtrees")
        assert isinstance(supervisor, LazySupervisor)
        return supervisor.start_lazy(subtree)

    def holds(self, subtree_id: str) -> bool:
        """Whether the bound supervisor holds a subtree of that id now (running, or
        restarting its child); never waits, never raises."""
        supervisor = self._supervisor
        return isinstance(supervisor, LazySupervisor) and subtree_id in supervisor._ids

    def stop(self, subtree_id: str, timeout_s: float | None = None) -> bool:
        """Stop the subtree ``subtree_id`` now, in this thread, and forget it (OTP's
        ``terminate_child``: never restarted, whatever crash races it); returns whether
        one was running. Waits for it within its ``shutdown`` (and ``timeout_s``
        seconds, when given). Raises ``pykka.ActorDeadError`` as :meth:`start` does."""
        supervisor = self.running_supervisor("lazy subtrees")
        assert isinstance(supervisor, LazySupervisor)
        return supervisor.stop_subtree(subtree_id, timeout_s)


class LazySupervisor(Supervisor):
    """A :class:`Supervisor` of dynamic children that also starts :class:`LazySubtree`
    values (see the module doc) through its ``starter`` (a :class:`LazyStarter`). Its
    other arguments are :class:`Supervisor`'s."""

    def __init__(self, *args: Any, starter: LazyStarter | None = None, **kwargs: Any) -> None:
        super().__init__(*args, starter=starter, **kwargs)  # bound on start, unbound at the end, as any starter
        self._lazy: dict[int, LazySubtree] = {}  # key -> subtree whose supervisor has not started
        self._ids: dict[str, int] = {}  # id -> key of every subtree started here (lazy or woken)
        self._waking: dict[int, threading.Event] = {}  # key -> set once its supervisor's start is over
        self._starting: set[int] = set()  # keys of subtrees whose child is starting (start_lazy)
        self._early: dict[int, tuple[object]] = {}  # key -> the exit reason of a child that ended as it started

    def start_lazy(self, subtree: LazySubtree) -> pykka.ActorRef[Any]:
        """Start ``subtree`` lazily (see :meth:`LazyStarter.start`, which calls this from
        any thread; raises as it does, and ``pykka.ActorDeadError`` once stopping)."""
        key = next(self._keys)
        sid = subtree.spec.id
        with self._lock:
            if not self._adopting or self.actor_stopped.is_set():
                raise pykka.ActorDeadError(f"{self.label} is stopping")
            held = self._ids.get(sid)
            if held is not None and self._gone(held, subtree.child.name):
                self._drop(held)  # its supervisor ended (it gave up, or shut down): forgotten now
                held = None
            if held is not None:
                raise ValueError(f"child {sid!r} is already started (OTP's already_started)")
            self._ids[sid] = key  # reserved while its child starts
            self._starting.add(key)
        try:
            with owning(self._owner):
                ref = subtree.child.start()
            # watched before anyone can find it by its name (its end comes with its real
            # reason, never "noproc", which a stop from another thread would be taken for)
            monitor(ref, lambda r, reason: self._lazy_down(key, r, reason))
            try:
                self._names.register(subtree.child.name, ref)  # type: ignore[arg-type]
            except ValueError:
                stop_soon(ref)
                raise
        except BaseException:
            with self._lock:
                self._ids.pop(sid, None)
                self._starting.discard(key)
                self._early.pop(key, None)
            raise
        child = ChildRecord(key, subtree.spec, dynamic=True, ref=ref)
        with self._lock:
            stopping = not self._adopting
            self._starting.discard(key)
            early = self._early.pop(key, None)  # it ended already: found by its name and stopped or killed
            if not stopping:
                self._children[key] = child
                self._by_urn[ref.actor_urn] = key
                self._lazy[key] = subtree
            else:
                self._ids.pop(sid, None)
        if stopping:
            stop_soon(ref)
            raise pykka.ActorDeadError(f"{self.label} is stopping")
        send_report(self._report_to, subtree.label, "started", subtree.child.id)
        if early is not None:
            self._lazy_down(key, ref, early[0])
        return ref

    def _gone(self, key: int, name: str | None) -> bool:
        """Whether the subtree of ``key`` has ended but is not forgotten yet (under the
        lock): its supervisor gave up (its child's ``name`` says so from then on, while
        the supervisor may still be starting) or has ended (its monitor has not run yet)."""
        child = self._children.get(key)
        if child is None or key in self._lazy:
            return False
        if name is not None and isinstance(self._names.exit_reason(name), RestartIntensityExceeded):
            return True
        return key not in self._waking and child.ref is not None and not child.ref.is_alive()

    def stop_subtree(self, subtree_id: str, timeout_s: float | None = None) -> bool:
        """Stop and forget the subtree ``subtree_id`` (see :meth:`LazyStarter.stop`);
        safe from any thread."""
        with self._lock:
            key = self._ids.get(subtree_id)
            child = self._children.pop(key, None) if key is not None else None
            if key is None or child is None:
                return False
            del self._ids[subtree_id]
            self._lazy.pop(key, None)
            waking = self._waking.get(key)
        shutdown = child.spec.shutdown
        bound = None if shutdown == "brutal_kill" else shutdown / 1000
        if timeout_s is not None:
            bound = timeout_s if bound is None else min(bound, timeout_s)
        if waking is not None:  # its supervisor is being started: it is stopped once it runs
            waking.wait(bound)
        own = child.ref is not None and on_actor_thread(child.ref)  # from its supervisor's report, say
        if not own and self._ended_here(child):
            return True
        ended = self._signal_stop(child)
        if own:
            return True  # it stops once the handler or callback this thread runs returns
        if ended is not None and not ended.wait(bound):
            logger.warning("{}: subtree {} did not stop within {} s; abandoned", self.label, subtree_id, bound)
        return True

    def _ended_here(self, child: ChildRecord) -> bool:
        """End ``child``'s actor in this thread if its loop never took one (a session's
        LoopActor that got no message: :func:`~rho_actors.otp.actor.end_unstarted`), as
        :meth:`_signal_stop` would have it stopped (no longer known by its urn first, so
        its end is nobody's crash); returns whether it did."""
        ref = child.ref
        if ref is None:
            return False
        child.ref = None
        with self._lock:
            self._by_urn.pop(ref.actor_urn, None)
        if end_unstarted(ref):
            return True
        child.ref = ref  # it took a thread meanwhile: stopped as any child is
        return False

    def _lazy_down(self, key: int, ref: pykka.ActorRef[Any], reason: object) -> None:
        """A lazy subtree's child ended (in its thread): a normal end ends the subtree
        here; a crash wakes the subtree's supervisor up in this supervisor's thread."""
        with self._lock:
            child = self._children.get(key)
            if child is None and key in self._starting:  # its start is not over: it takes this up
                self._early[key] = (reason,)
                return
            if child is None or child.ref is not ref or key not in self._lazy:
                return  # stopped by this supervisor (shutdown, terminate_child)
            if reason == NORMAL:
                self._drop(key)
                return
        try:
            self.actor_ref.tell(_Wake(key, ref, reason))
        except pykka.ActorDeadError:
            pass  # stopping: nothing is restarted

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Wake):
            self._wake(message)
            return None
        return super().on_receive(message)

    def _wake(self, wake: _Wake) -> None:
        with self._lock:
            child = self._children.get(wake.key)
            subtree = self._lazy.pop(wake.key, None)
            if child is None or subtree is None or child.ref is not wake.ref or not self._adopting:
                return
            self._by_urn.pop(wake.ref.actor_urn, None)
            child.ref = None
            waking = self._waking[wake.key] = threading.Event()
        try:
            self._start_woken(wake, child, subtree)
        finally:
            with self._lock:
                self._waking.pop(wake.key, None)
            waking.set()

    def _start_woken(self, wake: _Wake, child: ChildRecord, subtree: LazySubtree) -> None:
        start = subtree.spec.start
        assert isinstance(start, StartChild)
        woken = dataclasses.replace(start, kwargs={**start.kwargs, "crashed": (subtree.child.id, wake.reason)})
        try:
            sup = woken()
        except Exception as exc:  # it gave up at once (an intensity of 0), or could not start
            logger.debug("{}: subtree {} ended: {}", self.label, subtree.spec.id, exc)
            with self._lock:
                if self._children.get(wake.key) is child:
                    self._drop(wake.key)
            return
        with self._lock:
            child.ref = sup  # a stop_subtree that took the record meanwhile stops it once woken is set
            kept = self._children.get(wake.key) is child
            if kept:
                self._by_urn[sup.actor_urn] = wake.key
        if kept:
            monitor(sup, self._forget_temporary)
        else:  # stopped meanwhile (stop_subtree, which also waits for this end)
            sup.stop(block=False)

    def _drop(self, key: int) -> None:
        """Forget the subtree of ``key`` (under the lock)."""
        child = self._children.pop(key, None)
        self._lazy.pop(key, None)
        if child is not None:
            if child.ref is not None:
                self._by_urn.pop(child.ref.actor_urn, None)
            if self._ids.get(child.spec.id) == key:
                del self._ids[child.spec.id]

    def _forget_temporary(self, ref: pykka.ActorRef[Any], _reason: object) -> None:
        with self._lock:
            key = self._by_urn.get(ref.actor_urn)
            if key is not None:
                self._drop(key)

    def terminate_child(self, child_id: str) -> bool:
        return self.stop_subtree(child_id) or super().terminate_child(child_id)

    def _info(self, c: ChildRecord) -> ChildInfo:
        subtree = self._lazy.get(c.key)
        if subtree is None:
            return super()._info(c)
        alive = c.ref is not None and c.ref.is_alive()
        inner = ChildInfo(subtree.child.id, c.ref, subtree.child.type, subtree.child.restart, 0, alive)
        # the subtree stands until it is forgotten: a crashed child is about to be restarted by it,
        # as a woken subtree's supervisor is alive while it restarts its child
        return ChildInfo(c.spec.id, None, c.spec.type, c.spec.restart, 0, True, children=(inner,))
