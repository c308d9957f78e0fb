"""``process`` isolation: a call runs in a warm worker process (DESIGN §5).

The call goes to one of the system's two :class:`rho_actors.sandbox.WorkerPool`\\ s:
written to an idle worker from the host's own thread when one is there and the cap has
room (:meth:`WorkerPool.try_start`), else by a call thread (a reused thread of the
system's pool, as a ``thread`` call's: no actor per call) that waits for its place and
its worker (:meth:`WorkerPool.start`); its reply is read by the pool's one reader, or by
the host's thread that will wait for it alone (``run_turn`` of a one-call turn: the
call's ``waiter``) (DESIGN §5 "A call's path"). The pool owns the deadline: at it,
the worker's whole process tree is killed and the result is a ``timeout`` error; a call
the pool has not answered :data:`BACKSTOP_S` after its deadline (still on its way to a
worker: a worker starting under load) is answered ``timeout`` then, and stopped.
Cancelling the call (its loop stopping, or the host cancelling its turn) kills the
worker the same way.
Trusted tools share the other pool, whose workers keep the host's identity, environment
and files but have their process tree contained (:data:`TREE_ONLY`: a subreaper, a
parent-death signal, a cgroup bounding the whole tree to the heap bound, the tree killed
as one) unless the system runs with ``confinement=False`` (then a process group and
``RLIMIT_AS`` only); untrusted tools run in the confined pool, in
workers scoped to one (tool, session) pair, or to one call (``worker_scope="call"``),
with only the ``deps`` the host registered for them. The confined pool decodes its
workers' replies as plain data only; the trusted pool unpickles them, so a trusted
tool's ``Details`` may hold any picklable object. Both pools share the system's cap
on worker processes. The pools start on the first call and are stopped, killing every
worker's tree, when the system's ``workers`` actor stops.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, ClassVar

import pykka
from loguru import logger

from rho_actors.events import IsolationEvent, ToolSetChanged
from rho_actors.isolation.base import Isolation, IsolationServices, worker_call
from rho_actors.isolation.call import Answer, CallSpec, run_on_call_thread
from rho_actors.otp.threads import ThreadPool
from rho_actors.otp.timers import Timer
from rho_actors.results import STOPPED, failure
from rho_actors.sandbox import (
    CALL_SCOPE,
    TOOL_CACHE_SIZE,
    TREE_ONLY,
    ConfinePolicy,
    WorkerCall,
    WorkerPool,
    WorkerSlots,
)
from rho_actors.telemetry import TRACEPARENT, attached
from rho_actors.tool import ToolResult

__all__ = ["BACKSTOP_S", "ProcessIsolation"]

_CALL_THREAD = "rho_actors-process-call"
"""A process call's thread, named so while it runs its call (not a ``thread`` call's:
:func:`rho_actors.isolation.thread.on_call_thread` is false there)."""

BACKSTOP_S = 1.0
"""How long after a call's deadline its backstop answers ``timeout`` if the pool has
not (seconds; see :class:`_Backstop`)."""


_Target = tuple[WorkerPool, WorkerCall, Hashable, Mapping[str, str] | None]
"""Where a call runs: its pool, the call for it, its scope, its worker's added environment."""


class _Done:
    """A process call's end, given by whichever thread has its result (its pool's reader,
    mostly): counted ended once (``ended``), then settled in its :class:`Answer` (a
    result after the first is handed on ``late``). Never raises (a failed reply is logged)."""

    __slots__ = ("_once", "answer", "ended")

    def __init__(self, ended: Callable[[], None], answer: Answer) -> None:
        self.ended, self.answer = ended, answer
        self._once: list[None] = [None]

    def end(self) -> None:
        """Count the call ended (once: a ``list.pop``, atomic from any thread)."""
        try:
            self._once.pop()
        except IndexError:
            return
        self.ended()

    def __call__(self, result: ToolResult) -> None:
        self.end()
        try:
            self.answer.settle(result)
        except BaseException:
            logger.exception("reply of call {} failed", self.answer.spec.call_id)


class _Running:
    __slots__ = ("call",)

    def __init__(self, call: CallSpec) -> None:
        self.call = call

    def cancel(self, reason: str) -> None:
        """Set the call's token, which kills the worker running the call (see
        :meth:`WorkerPool.run`); a call not yet in a worker does not start."""
        self.call.cancel.cancel(reason)


class _Backstop(Timer):
    """The deadline's backstop, :data:`BACKSTOP_S` after it: the pool answers a call's
    deadline itself (killing its worker), but a call still on its way to a worker
    (shipping its tool, waiting for a worker to start under load) is not yet in its
    hands. If the call is still unanswered then, the backstop claims its answer for a
    ``timeout``, sets its token (the worker, once it has one, is killed; a call not yet in
    a worker does not start) and delivers the timeout from a thread of its own (rare: the
    timer thread must stay quick; from the timer thread when no thread can be started);
    what the pool answers later is ``late``."""

    __slots__ = ("answer",)

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.spec.deadline + BACKSTOP_S)
        self.answer: Answer | None = answer

    def dropped(self) -> None:
        self.answer = None  # it stays in the heap until due: hold nothing

    def fire(self) -> None:
        answer = self.answer
        if answer is None or not answer.claim():
            return  # the pool answered
        answer.spec.cancel.cancel("timeout")
        result = answer.timeout(STOPPED)
        try:
            threading.Thread(target=answer.deliver, args=(result,), name="rho_actors-backstop", daemon=True).start()
        except RuntimeError:  # no thread can be started (the host at its thread limit): here, late but never lost
            answer.deliver(result)


def _load_ahead(pool: WorkerPool, tools: list[tuple[Any, Any]], live: Callable[[int], bool]) -> None:
    """Load each ``(tool, entry)`` ahead into ``pool``'s workers (:meth:`WorkerPool.preload`,
    by the entry's serial), unless ``live(serial)`` says it was unregistered meanwhile (then,
    or if it is by the time it was pickled, it is unloaded)."""
    for tool, entry in tools:
        if live(entry.serial):
            pool.preload(tool, entry, key=entry.serial)
            if not live(entry.serial):  # unregistered while it was pickled: its unload came first
                pool.unload([entry.serial])


class ProcessIsolation(Isolation):
    """Runs each call in a worker process of a lazily started :class:`WorkerPool`."""

    name: ClassVar[str] = "process"

    def __init__(self, services: IsolationServices) -> None:
        super().__init__(services)
        self._lock = threading.Lock()
        self._pool: WorkerPool | None = None
        self._confined: WorkerPool | None = None
        self._stopping: list[WorkerPool] = []  # pools a shutdown is stopping now
        self._slots = WorkerSlots(services.max_workers, services.max_workers_per_session,
                                  services.max_running_workers)
        self._open = False
        self._loaded_ahead: set[int] = set()  # the serials of the trusted registrations loaded ahead
        self.start_bound_s = services.start_timeout_ms / 1000
        self._threads = services.threads if services.threads is not None else ThreadPool(name="rho_actors-call-idle")
        self._live = 0  # call threads running a call now
        self._draining = False  # a shutdown waits for them: each one ending tells it
        self._live_lock = threading.Lock()
        self._live_changed = threading.Condition(self._live_lock)
        if services.events is not None:
            services.events.subscribe(self._tool_set_changed, only=(ToolSetChanged,))

    @property
    def slots(self) -> WorkerSlots:
        """The system's cap on worker processes (declaration reads take places under it too)."""
        return self._slots

    def _tool_set_changed(self, event: object) -> None:
        """Warm the trusted pool once a trusted ``process`` tool is registered (its
        keeper starts ``warm_workers`` in the background, and every trusted tool is
        loaded ahead into its workers: :meth:`WorkerPool.preload`; the untrusted pool's
        confined spares start at its first call, as they cost a confined start each,
        and hold no tool ahead: a spare serves any scope) and retire
        the untrusted workers of registrations that are gone (in the registry's thread:
        only marks them; the pool's own thread stops them)."""
        if not isinstance(event, ToolSetChanged) or self.services.tools is None:
            return
        trusted = [e for e in self.services.tools.current.entries.values() if e.isolation == self.name
                   and not e.untrusted]
        with self._lock:
            pool = self._pool
            unregistered = self._loaded_ahead - {e.serial for e in trusted}
        if pool is not None and unregistered:  # unregistered (or registered again): no new worker loads it
            pool.unload(unregistered)
        if trusted:
            with contextlib.suppress(RuntimeError):  # not open (stopping, restarting): the first call starts it
                pool = self.pool()
                # held by every warm worker before its first call (version: as a call ships it); pickled in a
                # thread of its own, never the registry's (a tool may take long to pickle); each registration
                # once, the latest that a worker holds at most
                with self._lock:
                    new = [e for e in trusted if e.serial not in self._loaded_ahead][-TOOL_CACHE_SIZE:]
                    self._loaded_ahead = {e.serial for e in trusted}
                if new:
                    threading.Thread(target=_load_ahead, args=(pool, [(e.tool, e) for e in new], self._loads_ahead),
                                     name="rho_actors-load-ahead", daemon=True).start()
        else:
            with self._lock:
                self._loaded_ahead = set()
        with self._lock:
            confined = self._confined
        if confined is None:
            return
        live = {(name, e.serial) for name, e in self.services.tools.current.entries.items() if e.untrusted}

        def gone(scope: Hashable) -> bool:
            return isinstance(scope, tuple) and len(scope) == 3 and (scope[0], scope[1]) not in live

        confined.retire_scopes(gone)

    def _loads_ahead(self, serial: int) -> bool:
        """Whether the trusted registration ``serial`` is (still) to be loaded ahead."""
        with self._lock:
            return serial in self._loaded_ahead

    def start(self, call: CallSpec) -> _Running:
        s = self.services
        if s.calls.closed:
            raise pykka.ActorDeadError("the system is stopping")
        answer = Answer(call)
        answer.timer = backstop = _Backstop(answer)
        try:
            s.timers.schedule(backstop)
        except RuntimeError:  # the timers are stopped: the system is stopping
            raise pykka.ActorDeadError("the system is stopping") from None
        with self._live_lock:
            self._live += 1
        done = _Done(self._ended, answer)
        if self._started_here(call, done):  # written to an idle worker from this thread: its pool's reader answers
            return _Running(call)
        try:  # else a call thread waits for its place or its worker, then writes it
            self._threads.submit(functools.partial(self._call_thread, call, answer, done), _CALL_THREAD,
                                 may_take_over=True)
        except RuntimeError as exc:  # no thread could be started (the host at its thread limit): not started
            if answer.claim():  # else its backstop answered it meanwhile
                backstop.cancel()
            self._ended()
            raise pykka.ActorDeadError(f"no thread could be started for the call ({exc})") from None
        return _Running(call)

    def _started_here(self, call: CallSpec, done: Callable[[ToolResult], None]) -> bool:
        """Start the call from this thread, without waiting (:meth:`WorkerPool.try_start`);
        whether it was (else nothing was done)."""
        try:
            target = self._target(call)
            if isinstance(target, ToolResult):
                return False  # its failure is given on a call thread
            pool, worker_call_, scope, env = target
            if TRACEPARENT not in call.ctx:  # the caller waiting for it alone may read its reply (call.waiter)
                return pool.try_start(worker_call_, done, scope=scope, env=env, waiter=call.waiter)
            with attached(call.ctx, call.dispatched, call.name):
                return pool.try_start(worker_call_, done, scope=scope, env=env, waiter=call.waiter)
        except Exception:  # whatever it was, a call thread tries again and answers
            logger.exception("call {} could not be started from its caller's thread", call.call_id)
            return False

    def _call_thread(self, call: CallSpec, answer: Answer, done: _Done) -> None:
        """A call thread's one job: wait for the call's place and worker, write the call and
        wait for its reply (:meth:`WorkerPool.start`, ``here``), in the call's copy of
        the submitter's context with its span current; a call that never reached a worker
        is answered here (:func:`~rho_actors.isolation.call.run_on_call_thread`)."""
        def start(spec: CallSpec) -> ToolResult | None:
            target = self._target(spec)
            if isinstance(target, ToolResult):
                return target
            pool, worker_call_, scope, env = target
            # this thread waited for the worker: it waits for the reply too (no reader woken for it)
            pool.start(worker_call_, done, scope=scope, env=env, here=True)
            return None

        run_on_call_thread(call, start, done.end, self._threads, answer)

    def _ended(self) -> None:
        with self._live_lock:
            self._live -= 1
            if self._draining:
                self._live_changed.notify_all()

    def running_calls(self) -> int:
        """How many calls are running now (in a worker, or on their way to one)."""
        return self._live

    def _target(self, call: CallSpec) -> _Target | ToolResult:
        """Where the call runs: its pool, the call for it, its scope and the environment
        of its worker; or why it does not run."""
        tools = self.services.tools
        entry = tools.current.entries.get(call.name) if tools is not None else None
        if tools is not None and (entry is None or entry.tool is not call.tool):
            # unregistered or replaced since the loop dispatched it: whether it was trusted is
            # no longer known, so it does not run (never in the trusted pool by default)
            return failure("unavailable_changed", call.call_id, call.name)
        untrusted = entry is not None and entry.untrusted
        try:
            pool = self.pool(confined=untrusted)
        except RuntimeError as err:
            return failure("pool_closed", call.call_id, call.name, problem=str(err))
        start_by = call.dispatched + self.start_bound_s  # then its tool's timeout_ms, from when a worker has it
        if not untrusted or entry is None:
            return pool, worker_call(call, version=entry, start_by=start_by), None, None
        # scoped by the registration, not the name: a tool registered again (new code under the same
        # name) never gets a worker the old code ran in (and whatever it left there)
        session = call.ctx.get("session_id")
        scope = CALL_SCOPE if entry.worker_scope == "call" else (call.name, entry.serial, session)
        # only what the host registered for this tool, never the session's deps (nor its folder)
        return pool, worker_call(call, version=entry, deps=entry.deps, start_by=start_by), scope, entry.env

    def check_options(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
        """``process`` isolation takes no ``resources``; its memory bound is the
        system's. Raises ``ValueError`` naming the setting to use instead."""
        if options:
            hint = ""
            if "memory" in options:
                hint = (": a trusted process tool's memory bound is ActorSystem(process_heap_bytes=...), an "
                        "untrusted tool's UntrustedReads(heap_bytes=...)")
            raise ValueError(f"isolation 'process' takes no resources, got {sorted(options)}{hint}")
        return options

    def pool(self, confined: bool = False) -> WorkerPool:
        """The running pool (``confined``: the untrusted tools' one), started on first
        use. Raises ``RuntimeError`` while the isolation is not open (its system is
        stopping, or its actor restarting)."""
        with self._lock:
            if not self._open:
                raise RuntimeError("the worker pool is not running (the system is stopping, or it is restarting)")
            s = self.services
            if confined:
                if self._confined is None:
                    self._confined = WorkerPool(  # replies decoded as plain data only
                        s.warm_workers, heap_bytes=s.heap_bytes, start_method=s.start_method, codec="plain",
                        confine=s.confine or ConfinePolicy(), slots=self._slots, idle_s=s.worker_idle_s,
                        threads=self._threads,
                    )
                    missing, bus = (s.confine.missing if s.confine is not None else ()), s.events
                    if bus is not None:  # never a silent downgrade
                        for text in missing:
                            bus.emit(IsolationEvent("confinement_missing", "*", text))
                return self._confined
            if self._pool is None:
                contain = s.confine is None or s.confine.confine
                self._pool = WorkerPool(  # trusted tools only: replies unpickled, any Details kept
                    s.warm_workers, heap_bytes=s.process_heap_bytes, start_method=s.start_method, slots=self._slots,
                    confine=TREE_ONLY if contain else None, codec="pickle", idle_s=s.worker_idle_s,
                    threads=self._threads,
                )
            return self._pool

    def open(self) -> None:
        with self._lock:
            self._open = True

    def shutdown(self, timeout_s: float) -> None:
        """Stop the pools (killing every worker's tree: the calls still running get
        ``cancelled``), then give their call threads what is left of ``timeout_s``
        seconds to reply. A shutdown called while another one stops the pools stops them
        too (a pool's stop is idempotent): it returns once their workers are gone."""
        until = time.monotonic() + timeout_s
        with self._lock:
            pools = [p for p in (self._pool, self._confined) if p is not None]
            self._pool, self._confined, self._open = None, None, False
            self._stopping.extend(pools)
            pools = list(self._stopping)  # a shutdown meanwhile (the system's own, past its timeout) stops them too
        for pool in pools:
            pool.stop(timeout_s)
        with self._lock:
            self._stopping = [p for p in self._stopping if p not in pools]
        with self._live_changed:
            self._draining = True
            if not self._live_changed.wait_for(lambda: self._live <= 0, max(0.0, until - time.monotonic())):
                logger.warning("{} process call threads still running at the stop are abandoned", self._live)

    def stats(self) -> dict[str, Any]:
        """The pools' counters as ``workers_<name>`` (trusted) and
        ``untrusted_workers_<name>`` (see :meth:`WorkerPool.stats`), none before first
        use; ``workers_cap`` and ``workers_peak``, the system's cap on worker processes
        (running or idle) and the most alive at once; ``workers_running_cap``, the most
        calls running in them at once; ``workers_per_session``, one session's share of
        that, ``workers_by_session`` (session id -> its calls holding a worker now),
        ``workers_waiting`` (calls waiting their turn now), ``workers_queued`` (calls
        that waited, ever) and ``workers_waited_out`` (calls that waited their whole
        deadline, ever)."""
        with self._lock:
            pool, confined = self._pool, self._confined
        slots = self._slots
        out: dict[str, Any] = {
            "workers_cap": slots.limit, "workers_running_cap": slots.running, "workers_peak": slots.peak,
            "workers_per_session": slots.per_session,
            "workers_by_session": slots.shares(), "workers_waiting": slots.waiting_calls(),
            "workers_queued": slots.queued, "workers_waited_out": slots.waited_out,
        }
        if pool is not None:
            out.update({f"workers_{k}": v for k, v in pool.stats().items()})
        if confined is not None:
            out.update({f"untrusted_workers_{k}": v for k, v in confined.stats().items()})
        return out

    def pids(self) -> list[int]:
        """The pools' worker processes alive now ([] before their first use)."""
        with self._lock:
            pools = [p for p in (self._pool, self._confined) if p is not None]
        return [pid for pool in pools for pid in pool.pids()]
