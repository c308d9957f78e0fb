"""The warm worker processes of ``process`` isolation (DESIGN §5; internal,
re-exported by :mod:`rho_actors.sandbox`).

:class:`WorkerPool` keeps warm worker processes and runs ``tool.run(args, ctx)`` in one
of them: at the call's deadline the worker's whole process group is killed
(``SIGKILL``) and replaced in the background, so a deadline holds even against C code
that holds the GIL; a crash, an exit or running out of memory is an error result and
never touches the caller or a sibling call. The worker's side is
:mod:`rho_actors.sandbox.worker`.

A pool made with a :class:`~rho_actors.sandbox.confine.enclosure.ConfinePolicy` confines each
worker (DESIGN §5 "Confinement"): an unprivileged uid, Landlock, a scrubbed
environment, a cgroup (or an RSS sampler) bounding its whole tree, a private folder.
Its workers are scoped: a worker that ran a call of scope ``S`` (one (registration,
session) pair, or one call) only ever serves scope ``S`` again; fresh spares are kept warm.
Pools follow demand: a burst's workers stay idle up to the recent peak of busy ones
(per scope) and are retired after ``idle_s`` idle. All pools of a system share one
:class:`WorkerSlots` cap on worker processes, shared fairly among sessions; a call beyond
it waits its turn (its deadline holds).

A call is written to its worker from the thread that starts it (:meth:`WorkerPool.try_start`
without waiting, :meth:`WorkerPool.start` waiting for a place or a worker); no thread waits
per call: the pool's one reader (:mod:`rho_actors.sandbox.replies`) waits for every open
call's reply, deadline and worker's end at once, and gives each its one result. This
module is the pool's entry points (a call run, started, the pool stopped, its counts);
a call's delivery to its worker and its answer are :mod:`rho_actors.sandbox.delivery`,
how it takes its worker :mod:`rho_actors.sandbox.taking`, the worker processes
:mod:`rho_actors.sandbox.warm_workers`.

Replies come back in the pool's result codec (:mod:`rho_actors.sandbox.wire`; DESIGN
§5): ``"plain"`` by default (plain data checked field by field), ``"pickle"`` for trusted
tools only; a frame that breaks the protocol gets the worker killed and the call a
``crashed`` result naming the violation.

Example::

    pool = WorkerPool(warm=2)
    result = pool.run(MyTool, {"x": 1}, {"session_id": "s1", "call_id": "c1"},
                      deadline=time.monotonic() + 5.0, max_output_chars=100_000)
    pool.stop()
"""

from __future__ import annotations

import contextvars
import threading
import time
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from loguru import logger

from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception
from rho_actors.otp.pidfds import PidFd
from rho_actors.otp.threads import ThreadPool
from rho_actors.sandbox import wire
from rho_actors.sandbox.confine.enclosure import ConfinePolicy
from rho_actors.sandbox.delivery import CallDelivery
from rho_actors.sandbox.exit_stop import KILLED_REAP_S, stopped_at_exit
from rho_actors.sandbox.keeper import WarmKeeper, keeper_failures
from rho_actors.sandbox.processes import (
    context,
    hold_servers,
    kill_groups,
    release_servers,
)
from rho_actors.sandbox.reads import DEFAULT_HEAP_BYTES
from rho_actors.sandbox.replies import Replies, Waiter
from rho_actors.sandbox.sending import Sending, start_ms
from rho_actors.sandbox.shipping import ShippedTools, Unshippable
from rho_actors.sandbox.slots import Grant, WorkerSlots
from rho_actors.sandbox.warm_workers import CALL_SCOPE, PoolStopped
from rho_actors.sandbox.wire import WorkerCall
from rho_actors.sandbox.worker import WorkerConfig
from rho_actors.sandbox.worker_handle import WorkerHandle
from rho_actors.tool import ToolResult

__all__ = ["CALL_SCOPE", "KILLED_REAP_S", "WorkerPool", "WorkerSlots"]


class WorkerPool(WarmKeeper, CallDelivery):
    """Warm worker processes for ``process`` isolation (DESIGN §5). Thread-safe: call
    :meth:`run` from any number of threads at once.

    ``warm`` idle workers are started ahead of need, each leading its own process group
    under ``RLIMIT_AS`` = ``heap_bytes`` (bytes; 0 for no bound), with ``start_method``
    ``"forkserver"`` (or ``"spawn"``). A call takes an idle worker or, when none is
    idle, starts one (calls queue only at the ``slots`` cap, each taking a
    worker it may use as soon as one is idle; a call with a start bound takes the
    first worker it may use that becomes idle, the one started for it or one freed
    meanwhile); afterwards the worker goes back to the
    idle set while fewer than ``warm`` or than the recent peak of busy workers (of its
    scope; a peak lasts ``idle_s`` seconds from when it was last reached) are idle, else
    it is stopped; idle workers beyond ``warm`` are retired after ``idle_s`` seconds
    idle. A worker killed at a deadline or found dead is replaced in the background. ``codec``
    is how results come back: ``"plain"`` (plain data only; required for untrusted
    code) or ``"pickle"`` (trusted tools only: decoding a pickle runs code).

    With ``confine`` (a :class:`~rho_actors.sandbox.confine.enclosure.ConfinePolicy`) every
    worker is confined, ``heap_bytes`` bounds its whole tree, and workers are scoped (see
    :meth:`run`): ``warm`` fresh spares are kept, idle workers per scope as above (at
    least 1), each retired after ``idle_s`` seconds idle.

    Raises ``ValueError`` for a negative ``warm``, a bad ``start_method`` or ``codec``, or
    ``codec="pickle"`` with a ``confine`` policy that confines (untrusted code).

    A call with a ``start_by`` (:class:`~rho_actors.sandbox.wire.WorkerCall`) waits for
    its place, a free worker or a new one's ``READY`` until then (a call that got none is
    ``unavailable``, naming its start bound: ``start_by`` less its ``started``; a system's
    is its ``start_timeout_ms``), and its tool's deadline is ``timeout_ms`` from when its
    worker has it (never past the call's ``deadline``).
    """

    def __init__(
        self, warm: int = 2, *, heap_bytes: int = DEFAULT_HEAP_BYTES, start_method: str = "forkserver",
        codec: str = "plain", confine: ConfinePolicy | None = None, slots: WorkerSlots | None = None,
        idle_s: float = 30.0, threads: ThreadPool | None = None,
    ) -> None:
        if warm < 0:
            raise ValueError(f"warm must be >= 0, not {warm}")
        if codec not in wire.CODECS:
            raise ValueError(f"codec must be one of {', '.join(wire.CODECS)}, not {codec!r}")
        if codec != "plain" and confine is not None and not confine.tree_only:
            raise ValueError(f"a confined pool runs untrusted code: its codec must be 'plain', not {codec!r}")
        self._codec = wire.CODECS[codec]
        trusted = confine is None or confine.tree_only
        self._setting = "ActorSystem(process_heap_bytes=...)" if trusted else "UntrustedReads(heap_bytes=...)"
        self._config = WorkerConfig(codec, heap_bytes, setting=self._setting)
        self._ctx = context(start_method)
        self._warm = warm
        self._heap_bytes = heap_bytes
        self._confine = confine
        self._scoped = confine is not None and not confine.tree_only
        self._slots = slots
        self._idle_s = idle_s
        if slots is not None:
            slots.join(self)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # the keeper waits here: a worker lost, or stop
        self._warmed = threading.Condition(self._lock)  # wait_warm waits here: a worker became idle
        self._all: set[WorkerHandle] = set()
        self._idle: list[WorkerHandle] = []  # every idle worker, oldest first
        self._scopes: set[Hashable] = set()
        self._busy: set[WorkerHandle] = set()
        self._starting = 0
        self._spawning, self._unreaped = 0, set()  # being spawned now; started and not known reaped yet
        self._spares_starting: set[WorkerHandle] = set()  # the keeper's spares spawned, not yet ready or lost
        self._start_took: deque[float] = deque(maxlen=8)  # seconds the latest starts took, spawn to READY
        self._starts_for_calls: Counter[tuple[tuple[str, str], ...]] = Counter()  # env_key -> workers starting
        self._calls_awaiting: Counter[tuple[tuple[str, str], ...]] = Counter()  # env_key -> calls waiting for one
        self._stopped = False
        self._peaks: dict[Hashable, tuple[int, float]] = {}  # scope -> (most busy at once, when last reached)
        self._shipped = ShippedTools()
        self._preloads: OrderedDict[bytes, bytes] = OrderedDict()  # digest -> tool bytes, loaded ahead (preload)
        self._preload_keys: dict[Hashable, bytes] = {}  # preload's key -> its digest (unload)
        self._proven: set[bytes] = set()  # loaded ahead by a worker at least once
        self._trying: set[bytes] = set()  # being loaded ahead by a worker for the first time
        self._keeper_backoff, self._failed_starts = 0.0, keeper_failures()  # no start before (one failed)
        self._counts = {"started": 0, "killed": 0, "died": 0, "retired": 0, "queued": 0, "loaded": 0, "shipped": 0}
        hold_servers()
        self._holding = True
        self._held: set[PidFd] = set()  # each worker's pidfd, for the finalizer's kill (kill_groups)
        self._finalizer = weakref.finalize(self, kill_groups, self._held)
        self._threads = threads
        self._replies = Replies(self._finish, self._start_reader)
        self._keeper = threading.Thread(target=self._keep_warm, name="rho-worker-pool", daemon=True)
        self._keeper.start()
        stopped_at_exit(self)

    def _start_reader(self, job: Callable[[], None]) -> None:
        """Run the reader's ``job`` on one of ``threads`` (else a thread of its own)."""
        if self._threads is not None:
            self._threads.submit(job, "rho_actors-replies")
        else:
            threading.Thread(target=job, name="rho_actors-replies", daemon=True).start()

    # --- public ---------------------------------------------------------------------------

    def run(
        self,
        tool: Any,
        args: Mapping[str, Any],
        ctx: Mapping[str, Any],
        deadline: float,
        max_output_chars: int,
        *,
        name: str | None = None,
        started: float | None = None,
        cancel: CancelToken | None = None,
        scope: Hashable = None,
        env: Mapping[str, str] | None = None,
        version: object = None,
        context: contextvars.Context | None = None,
    ) -> ToolResult:
        """Run ``tool.run(args, ctx)`` in a worker process and return its result: the call
        made by :meth:`WorkerCall.of <rho_actors.sandbox.wire.WorkerCall.of>` from these
        parts (``call_id`` from ``ctx``; ``deadline`` and ``started``, default now, are
        ``time.monotonic()`` instants; ``name`` by default the tool's ``__name__`` or type
        name; ``context``, the ``contextvars`` whose plain values travel), then
        :meth:`run_call`. Blocks; never raises for anything the tool does."""
        call = WorkerCall.of(tool, args, ctx, deadline, max_output_chars, name=name, started=started, cancel=cancel,
                             version=version, context=context)
        return self.run_call(call, scope=scope, env=env)

    def run_call(self, call: WorkerCall, *, scope: Hashable = None, env: Mapping[str, str] | None = None) -> ToolResult:
        """Run one call (:class:`~rho_actors.sandbox.wire.WorkerCall`) in a worker process
        and return its result. Blocks. Setting ``call.cancel`` kills the worker running the
        call (the result is then ``cancelled``); a call whose ``cancel`` is set before it
        reaches a worker does not run.

        ``call.max_output_chars`` caps the result's text (it is encoded and capped in the
        worker); the result's ``duration_ms`` counts from ``call.started``. In the worker,
        ``ctx`` is what :func:`~rho_actors.sandbox.wire.call_request` cuts from
        ``call.ctx`` (``session_id``, ``call_id``, ``data_dir``, ``withheld``,
        ``traceparent``, ``deps`` when picklable; an untrusted call's registered ``deps``
        and its worker's private folder), rebuilt by
        :func:`~rho_actors.sandbox.worker.serve_request` with ``deadline`` and
        ``cancel``, a :class:`CancelToken` never set: at the deadline the worker is killed
        instead. The plain values of ``call.context`` are set again in the worker, on the
        ``ContextVar`` objects of that name its loaded modules hold at top level, for the
        call. An ``async def run`` runs under ``asyncio.run`` with a ``wait_for`` to the
        deadline.

        The tool travels with cloudpickle, pickled once per object (an ``@tool`` of a plain
        function once per object and ``call.version``, compared by identity; any other
        instance on every call; see :class:`~rho_actors.sandbox.shipping.ShippedTools`);
        what ``run`` does to it in the worker stays there (the worker may serve again).

        ``scope`` (confined pools): the worker serves only calls of this scope from now
        on (the system passes ``(tool name, registration serial, session id)``);
        :data:`CALL_SCOPE` uses a fresh worker for this call alone; :meth:`retire_scopes`
        retires a scope's workers. ``env``: variables added to a confined worker's
        scrubbed environment (a worker started with them serves only calls that pass the
        same). With a shared cap, the call first waits its turn in ``ctx["session_id"]``'s
        fair share (see :class:`WorkerSlots`).

        Never raises for anything the tool does: the result is an error with kind
        ``timeout`` (the deadline passed: the worker's process group was killed),
        ``crashed`` (the worker died of a signal, named), ``exited`` (the worker exited,
        code named, 0 included; or the tool raised ``SystemExit``/``KeyboardInterrupt``:
        the worker survives), ``memory`` (past ``heap_bytes``), ``raised`` (the tool
        raised or returned ``Error``, or could not be pickled here, or its result could
        not be pickled there) or ``cancelled`` (the pool was stopped, or ``cancel`` was
        set).
        """
        box: list[ToolResult] = []
        answered = threading.Event()

        def done(result: ToolResult) -> None:
            if not box:
                box.append(result)
                answered.set()

        self.start(call, done, scope=scope, env=env, here=True)
        answered.wait()  # set by now: this thread waited for the reply (or the call never reached a worker)
        return box[0]

    def try_start(self, call: WorkerCall, done: Callable[[ToolResult], None], *, scope: Hashable = None,
                  env: Mapping[str, str] | None = None, waiter: Waiter | None = None) -> bool:
        """Start ``call`` as :meth:`start` does, from this thread and without waiting,
        when an idle worker it may use and its place under the cap are there now: its
        ``CALL`` frame is written from this thread (what the pipe does not take at once,
        by the pool's reader) and ``done(result)`` is called once, later, from the thread
        that has the outcome. ``waiter``: the call is held for it (:meth:`Waiter.hold
        <rho_actors.sandbox.replies.Waiter.hold>`: made by this thread, not closed), whose
        thread then reads its reply (:meth:`Waiter.serve
        <rho_actors.sandbox.replies.Waiter.serve>`) instead of the pool's reader. Returns
        ``False``, having started nothing and called nothing, when the call would have to
        wait (for a place, a worker, a start) or would fail before it reaches a worker:
        then :meth:`start` it (on a thread that may block), which gives it its result
        either way. Never blocks on other calls."""
        cancel, now = call.cancel, time.monotonic()
        if self._stopped or (cancel is not None and cancel.cancelled) or now >= (
                call.start_by if call.start_by is not None else call.deadline):
            return False
        env_key = tuple(sorted(env.items())) if env else ()
        with self._lock:  # a look first: no place taken for a call that finds no worker
            if not self._usable_locked(scope, env_key):
                return False
        try:
            digest, tool_bytes = self._shipped.ship(call.tool, call.version)
        except Unshippable:
            return False
        session = call.ctx.get("session_id")
        grant = Grant(session, now, left=self._slots is not None)  # held once granted (try_enter marks it)
        sending: Sending | None = None
        try:
            if self._slots is not None and not self._slots.try_enter(session, grant):
                return False
            sending = Sending(call, wire.call_request(digest, call), tool_bytes, scope, env_key, grant, done,
                               waiter=waiter)
            worker = self._take_idle(scope, env_key, sending.held)
            if worker is None or self._open_on(sending, worker) is not None:
                self._leave(grant)
                return False
        except PoolStopped:
            self._leave(grant)
            return False
        except BaseException as exc:  # this thread interrupted before the call was anyone's: answered, then raised
            if sending is not None:
                self._abandon(sending, exc)
            else:  # its place, if granted (maybe just as it was interrupted), goes back
                self._leave(grant)
                done(self._failure(call, "start_interrupted", problem=describe_exception(exc)))
            raise
        return True

    def start(self, call: WorkerCall, done: Callable[[ToolResult], None], *, scope: Hashable = None,
              env: Mapping[str, str] | None = None, here: bool = False) -> None:
        """Start ``call`` (see :meth:`run_call`, which is this with ``here``): blocks until
        its place under the cap and a worker are had (or the call fails before), writes
        its ``CALL`` frame and returns; ``done(result)`` is called once with the call's
        result, from this thread when it never reached a worker, else from the pool's
        reader (:class:`~rho_actors.sandbox.replies.Replies`) or the thread that reader
        hands the outcome to. ``here``: this thread, which has nothing else to do, waits
        for the reply itself (no reader woken for it) and calls ``done`` before it
        returns. Never raises for anything the tool does."""
        deadline, timeout_ms, cancel = call.deadline, call.timeout_ms, call.cancel
        start_by = call.start_by if call.start_by is not None else deadline

        def failed(key: str, **fields: Any) -> None:
            done(self._failure(call, key, **fields))

        if self._stopped:
            return failed("pool_stopped")
        if cancel is not None and cancel.cancelled:
            return failed("cancelled", reason=cancel.reason)
        if time.monotonic() >= deadline:
            return failed("timeout", timeout_ms=timeout_ms, consequence="it did not start")
        try:
            digest, tool_bytes = self._shipped.ship(call.tool, call.version)
        except Unshippable as exc:
            return failed("unshippable", problem=str(exc))
        request = wire.call_request(digest, call)
        session = call.ctx.get("session_id")
        entered = True
        grant = Grant(session, time.monotonic(), left=self._slots is not None)  # held once granted (enter marks it)
        sending: Sending | None = None
        try:
            if self._slots is not None:
                poke = self._slots.poke  # one bound method: the very object remove_callback looks for
                if cancel is not None:
                    cancel.add_inline_callback(poke)  # a call waiting its turn stops waiting
                try:
                    entered = self._slots.enter(session, start_by,
                                                (lambda: cancel.cancelled) if cancel is not None else None, grant)
                finally:  # its wait is over: a token that outlives the call keeps nothing of it
                    if cancel is not None:
                        cancel.remove_callback(poke)
            if entered:
                grant.at = time.monotonic()
                sending = Sending(call, request, tool_bytes, scope, tuple(sorted((env or {}).items())), grant, done,
                                   here)
                self._deliver(sending)
                return None
        except BaseException as exc:  # interrupted (a signal handler's KeyboardInterrupt): answered, then raised
            if sending is not None:
                self._abandon(sending, exc)  # (nothing when a reader has it, or it has its result)
            else:
                self._leave(grant)  # its place, if granted (maybe just as it was interrupted), goes back
                failed("start_interrupted", problem=describe_exception(exc))
            raise
        if self._slots is not None:
            if cancel is not None and cancel.cancelled:
                return failed("cancelled", reason=cancel.reason)
            held = self._slots.shares().get(str(session), 0)
            if call.start_by is not None:
                return failed("no_worker_in_time", start_ms=start_ms(call), timeout_ms=timeout_ms,
                              why=f"the system's {self._slots.running} running worker(s) were in use, its session "
                                  f"holding {held} of its share of {self._slots.per_session}")
            return failed("queued_past_share", timeout_ms=timeout_ms, cap=self._slots.running,
                          share=self._slots.per_session, held=held)
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Kill every worker's process group and reap the workers, waiting up to
        ``timeout_s`` seconds in all (at least :data:`KILLED_REAP_S`): each worker's
        cgroup and private folder go before this returns, an idle one's here, a busy or
        starting one's by the thread that owns it, waited for. Every worker process not yet
        reaped is killed and waited for until its fork server reaped it: the pool's, one a
        call or the keeper is letting go of, one being spawned (waited for; none is spawned
        once the stop began); one not reaped by then is named in a warning. Calls still running get a
        ``cancelled`` result; later calls too. Idempotent. A pool still running when the
        interpreter exits is stopped then (:mod:`~rho_actors.sandbox.exit_stop`)."""
        until = time.monotonic() + timeout_s
        with self._lock:
            self._stopped = True
            stopped_at_exit(self, False)
            workers = list(self._all)
            idle, self._idle = self._idle, []
            self._changed.notify_all()
            self._warmed.notify_all()
        self._replies.stop()  # its reader ends once each open call has its outcome (their workers killed now)
        for worker in workers:
            worker.kill()
        until = max(until, time.monotonic() + KILLED_REAP_S)  # a killed process's end is the kernel's, prompt
        self._reap_all(workers, until, timeout_s)
        for worker in idle:  # busy and starting workers are closed by the threads that own them
            worker.close()
        for worker in workers:  # (a host exiting after stop() would leave their cgroups and folders)
            if not worker.wait_closed(until - time.monotonic()):
                logger.warning("worker pool: worker {} was not closed by its owner within the stop's {} s: its "
                               "cgroup and private folder are left to the next start's sweep", worker.pid, timeout_s)
        with self._lock:
            for worker in workers:
                self._forget_locked(worker)
            holding, self._holding = self._holding, False
        if self._keeper is not threading.current_thread():
            self._keeper.join(max(0.0, until - time.monotonic()))
        if holding:
            release_servers()

    def stats(self) -> dict[str, int]:
        """Counts: ``alive`` (worker processes now), ``idle``, ``busy``, ``starting``
        (being started in the background); since the pool started: ``started``,
        ``killed`` (at a deadline, or for a bad reply), ``died`` (crashed, exited or
        out of memory on their own) and ``retired`` (stopped when surplus, or after
        running out of memory, or idle too long); ``queued``, calls that waited for the
        cap; ``loaded``, tools sent to workers ahead of their calls (:meth:`preload`);
        ``shipped``, calls whose worker did not hold their tool (it went with the call);
        ``scopes``, scopes with an idle worker now; workers stopped by :meth:`stop` are
        not counted."""
        with self._lock:
            return {
                "alive": len(self._all),
                "idle": len(self._idle),
                "busy": len(self._busy),
                "starting": self._starting,
                "scopes": len({w.scope for w in self._idle if w.scope is not None}),
                **self._counts,
            }

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
