"""The worker processes of a :class:`~rho_actors.sandbox.pool.WorkerPool` and how they
are kept warm (DESIGN §5 "Starting a worker"; internal).

:class:`WarmWorkers` is the pool's half that owns its worker processes: it starts them
(:meth:`WarmWorkers._spawn`, each under its :class:`~rho_actors.sandbox.confine.enclosure.Enclosure`
when the pool confines), finds a call its worker (:meth:`WarmWorkers._take`: an idle one, a
start, or a wait for a place under the cap), notes each scope's demand, makes new
ones ready, loses, retires and forgets them. The pool's background thread, the keeper,
which keeps ``warm`` spares idle, replaces lost workers and retires workers idle too
long, is :mod:`rho_actors.sandbox.keeper`. The call's half (a place under the cap, delivery, the reply, the deadline) is
:mod:`rho_actors.sandbox.pool`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, Final, Literal, cast

from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.otp.pidfds import PidFd
from rho_actors.sandbox import wire
from rho_actors.sandbox.channel import DeadlineReached, Malformed
from rho_actors.sandbox.child import ChildSetup
from rho_actors.sandbox.confine.enclosure import ConfinePolicy, Enclosure
from rho_actors.sandbox.exit_stop import KILLED_REAP_S
from rho_actors.sandbox.preloads import ToolsAhead
from rho_actors.sandbox.processes import spawn
from rho_actors.sandbox.shipping import ShippedTools
from rho_actors.sandbox.slots import WorkerSlots
from rho_actors.sandbox.worker import WorkerConfig, worker_child
from rho_actors.sandbox.worker_handle import WorkerHandle

__all__ = ["CALL_SCOPE", "DELIVERY_ATTEMPTS", "NotStarted", "PoolStopped", "QueuedPastDeadline", "StartFailed",
           "WarmWorkers", "WorkerStart"]

CALL_SCOPE: Final = "call"
"""The scope of a worker used for one call only (``worker_scope="call"``)."""

_READY_TIMEOUT_S: Final = 30.0
"""How long a new worker may take to say ``READY`` (seconds)."""
_OVERDUE_FACTOR: Final = 3.0
_OVERDUE_FLOOR_S: Final = 1.0
"""A spare start under way is *overdue*, and a call stops waiting for it, once it has run
:data:`_OVERDUE_FACTOR` times as long as the slowest of the pool's latest starts took (at
least :data:`_OVERDUE_FLOOR_S`; none measured yet: never, the call's own half-way mark
rules alone). See :meth:`WarmWorkers._awaited_others_start`."""
class PoolStopped(Exception):
    """The pool is stopped (or, for a spare, the cap is full)."""


DELIVERY_ATTEMPTS: Final = 3
"""Workers tried for one call when each turns out dead before the call reaches it."""


class QueuedPastDeadline(Exception):
    """Every worker slot stayed busy until the call's deadline."""


class NotStarted(Exception):
    """No worker the call may use was idle by its ``start_by`` (its own start not yet
    ready)."""


class StartFailed(Exception):
    """Starting a worker for a call failed on its own (the message says why): no thread
    for its start, or each worker started for it failed before it was ready; the call is
    ``unavailable`` (``WorkerPool._start_failed``)."""


class WarmWorkers(ToolsAhead):
    """The worker processes of one pool (see the module doc); :class:`~rho_actors.sandbox.pool.WorkerPool`
    sets every attribute below in its ``__init__``."""

    _config: WorkerConfig
    _ctx: Any
    _warm: int
    _heap_bytes: int
    _confine: ConfinePolicy | None
    _scoped: bool
    _slots: WorkerSlots | None
    _idle_s: float
    _lock: threading.Lock
    _changed: threading.Condition
    _warmed: threading.Condition
    _all: set[WorkerHandle]
    _idle: list[WorkerHandle]
    _busy: set[WorkerHandle]
    _starting: int
    _spares_starting: set[WorkerHandle]
    _start_took: deque[float]
    _starts_for_calls: Counter[tuple[tuple[str, str], ...]]
    _calls_awaiting: Counter[tuple[tuple[str, str], ...]]
    _stopped: bool
    _peaks: dict[Hashable, tuple[int, float]]
    _counts: dict[str, int]
    _held: set[PidFd]
    _spawning: int
    _unreaped: set[WorkerHandle]
    _shipped: ShippedTools
    _preloads: OrderedDict[bytes, bytes]
    _preload_keys: dict[Hashable, bytes]
    _proven: set[bytes]
    _trying: set[bytes]
    _keeper_backoff: float

    def pids(self) -> list[int]:
        """The process ids of the worker processes alive now (each is also the id of the
        process group it leads)."""
        with self._lock:
            return sorted(w.pid for w in self._all)

    def wait_warm(self, timeout_s: float) -> bool:
        """Block until ``warm`` workers are idle (or the pool is stopped), at most
        ``timeout_s`` seconds; returns whether they are."""
        with self._lock:
            return self._warmed.wait_for(lambda: self._stopped or self._fresh() >= self._warm, timeout_s) and (
                not self._stopped
            )

    def retire_one_idle(self, spare: frozenset[Hashable] = frozenset()) -> bool:
        """Stop the longest idle worker (for the cap), not one kept for a session in
        ``spare``; whether there was one."""
        with self._lock:
            if self._stopped:
                return False
            worker = next((w for w in self._idle if w.session is None or w.session not in spare), None)
            if worker is None:
                return False
            self._idle.remove(worker)
            self._counts["retired"] += 1
        self._retire(worker)
        return True

    def retire_scopes(self, gone: Callable[[Hashable], bool]) -> int:
        """Retire every worker whose scope ``gone(scope)`` says is gone (its tool was
        unregistered or registered again): idle ones by the pool's background thread
        soon, busy ones when their call ends; they never serve another call. Returns
        how many workers it found."""
        with self._lock:
            found = [w for w in self._all if w.scope is not None and w.scope != CALL_SCOPE and gone(w.scope)]
            for worker in found:
                worker.doomed = True
            if found:
                self._changed.notify_all()
        return len(found)

    def _spawn(
        self, busy: bool, env_key: tuple[tuple[str, str], ...] = (), scope: Hashable = None,
        claim: list[bool] | None = None, held: list[WorkerHandle] | None = None,
    ) -> WorkerHandle:
        """:meth:`_spawn_counted`, counted in ``_spawning`` until its worker is entered
        among the workers not yet reaped (or its start failed and was cleaned up after):
        the pool's stop waits for each start under way, then kills and reaps its worker;
        none starts once the stop began (``PoolStopped``)."""
        with self._lock:
            stopped = self._stopped
            if not stopped:
                self._spawning += 1
        if stopped:
            if claim and self._slots is not None:
                self._slots.give_back(claim)
            raise PoolStopped
        ended = [False]
        try:
            return self._spawn_counted(busy, env_key, scope, claim, held, ended)
        finally:
            if not ended[0]:
                with self._lock:
                    self._spawn_ended_locked(None, ended)

    def _spawn_counted(
        self, busy: bool, env_key: tuple[tuple[str, str], ...], scope: Hashable, claim: list[bool] | None,
        held: list[WorkerHandle] | None, ended: list[bool],
    ) -> WorkerHandle:
        """Start a worker process (not waiting for it to be ready) and register it
        (``busy``: for a call of ``scope``, put in ``held`` as it is marked busy, as
        :meth:`_take_idle` does). ``claim``: the process slot its caller took (a one-item
        list, emptied as the worker takes the slot over; a start that fails gives it back,
        once: :meth:`WorkerSlots.give_back`); without (a spare of the keeper), with a cap:
        raises ``PoolStopped`` when the cap is full or a call waits for it. Whatever
        interrupts it before the pool holds the worker (a signal handler's
        ``KeyboardInterrupt`` in a caller's thread), its process is killed and reaped and
        its slot given back."""
        if claim is None:
            claim = []
            if self._slots is not None:  # a spare never takes a slot a call is waiting for
                if self._slots.waiting or not self._slots.try_acquire():
                    raise PoolStopped
                claim.append(True)
        enclosure = child = worker = None
        try:
            if self._confine is not None:
                enclosure = Enclosure(self._confine, self._heap_bytes or None, env=dict(env_key))
                setup = enclosure.setup
            else:
                setup = ChildSetup(self._heap_bytes, env=dict(os.environ))  # the host's, as it is now
            words = enclosure.memory_bound_words if enclosure is not None else None
            config = self._config if words is None else replace(self._config, bound=words)
            child = spawn(self._ctx, worker_child, config, setup, name="rho-worker", keep_peer=True)
            if enclosure is not None:
                enclosure.started(child.pid)
            worker = WorkerHandle(child.proc, child.channel, enclosure, None, env_key, child.server, child.held)
            if claim or self._slots is None:  # the worker's slot from now on: its close gives it back
                worker.slots = self._slots
                claim.clear()  # (after the line above: interrupted between them, the worker's close frees it)
            with self._lock:
                self._spawn_ended_locked(worker, ended)
                if not self._stopped:
                    self._all.add(worker)
                    self._held.add(worker.held)
                    self._counts["started"] += 1
                    if busy:
                        if held is not None:
                            held.append(worker)
                        if self._scoped:
                            worker.scope = scope
                        self._busy.add(worker)
                        self._note_demand_locked(worker.scope)
                    return worker
        except BaseException:
            if worker is None or not self._holds(worker, busy, held):
                self._unstarted(worker, child, enclosure, claim)
            raise
        worker.kill()  # the pool was stopped meanwhile: its stop waits for this reap
        worker.reap()
        worker.close()
        raise PoolStopped

    def _spawn_ended_locked(self, worker: WorkerHandle | None, ended: list[bool]) -> None:
        """A start under way ended (``worker``: the worker it started, entered among the
        workers not yet reaped, which the pool's stop kills and reaps too)."""
        self._spawning -= 1
        ended[0] = True
        if worker is not None:
            self._unreaped.difference_update([w for w in self._unreaped if w.reaped])
            self._unreaped.add(worker)
        self._changed.notify_all()

    def _reap_all(self, workers: list[WorkerHandle], until: float, timeout_s: float) -> None:
        """The stop's reap (by ``until``): ``workers`` (killed), then every other worker
        process not reaped yet, killed now: one being spawned as the stop began (waited
        for), one lost and being reaped by another thread (a call's, the keeper's). Those
        not reaped by ``until`` (each still a process, a zombie at least, until its fork
        server reaps it), named in one warning."""
        with self._lock:  # a start under way enters its worker, or cleans up after itself, then ends
            self._changed.wait_for(lambda: self._spawning == 0, max(0.0, until - time.monotonic()))
            spawning = self._spawning
            others = [w for w in self._unreaped if not w.reaped and w not in workers]
        for worker in others:
            worker.kill()
        left = [w.pid for w in [*workers, *others] if self._reap_by(w, until) is None]
        if left or spawning:
            logger.warning("worker pool: stopping it, worker processes {} were killed but not reaped within {:g} s "
                           "(each stays a process, a zombie at least, until its fork server reaps it){}", left,
                           max(timeout_s, KILLED_REAP_S),
                           f"; {spawning} worker starts still under way (their threads kill and reap them)"
                           if spawning else "")

    @staticmethod
    def _reap_by(worker: WorkerHandle, until: float) -> int | None:
        """``worker.reap`` by ``until``; ``None`` (not reaped) when it raised (logged)."""
        try:
            return worker.reap(max(0.0, until - time.monotonic()))
        except Exception:
            logger.exception("worker pool: reaping worker {} failed; the stop goes on", worker.pid)
            return None

    def _holds(self, worker: WorkerHandle, busy: bool, held: list[WorkerHandle] | None) -> bool:
        """Whether the pool holds ``worker`` (registered, and a busy one in its call's
        ``held``, which gives it back); if not, it is forgotten."""
        with self._lock:
            if worker in self._all and (not busy or held is None or worker in held):
                return True
            self._forget_locked(worker)
            return False

    def _unstarted(self, worker: WorkerHandle | None, child: Any, enclosure: Enclosure | None,
                   claim: list[bool]) -> None:
        """A start that failed or was interrupted before the pool held its worker: its
        process (``child``, or ``worker``'s) killed and reaped, its enclosure removed,
        its slot given back (``claim``'s, or its worker's), each once."""
        if worker is not None:
            if claim:
                worker.slots = None  # the claim's, given back below
            worker.kill()
            worker.reap()
            worker.close()
        else:
            if child is not None:
                child.discard()
            if enclosure is not None:
                enclosure.remove()
        if self._slots is not None:
            self._slots.give_back(claim)

    def _fresh(self) -> int:
        return sum(1 for w in self._idle if w.scope is None)

    def _wants(self, scope: Hashable) -> tuple[Hashable, ...]:
        """The scopes of idle workers a call of ``scope`` may take, best first."""
        return (scope, None) if self._scoped and scope != CALL_SCOPE else (None,)

    def _usable_locked(self, scope: Hashable, env_key: tuple[tuple[str, str], ...]) -> bool:
        """Whether an idle worker a call of ``scope`` may take is there now."""
        wants = self._wants(scope)
        return any((not self._scoped or w.scope in wants) and w.env_key == env_key and not w.doomed
                   for w in self._idle)

    def _take_idle(self, scope: Hashable, env_key: tuple[tuple[str, str], ...],
                   held: list[WorkerHandle] | None = None) -> WorkerHandle | None:
        """An idle worker this call may use, now busy (``None``: there is none); put in
        ``held`` as it leaves the idle set, under the lock: the caller's from then on, which
        gives it back (``WorkerPool._release(..., held=held)``) unless a reader takes its
        call, whatever interrupts it (an exception raised here after the take included)."""
        dead: list[WorkerHandle] = []
        scoped = self._scoped
        held = [] if held is None else held
        try:
            with self._lock:
                if self._stopped:
                    raise PoolStopped
                for want in self._wants(scope):
                    for worker in reversed(self._idle):
                        if (scoped and worker.scope != want) or worker.env_key != env_key or worker.doomed:
                            continue
                        self._idle.remove(worker)
                        held.append(worker)
                        if worker.healthy():
                            worker.pace(busy=True)
                            self._busy.add(worker)
                            if scoped:
                                worker.scope = scope
                                if want is None:
                                    self._changed.notify_all()  # a spare was used: start another
                            self._note_demand_locked(worker.scope)
                            return worker
                        held.remove(worker)
                        dead.append(worker)
        finally:
            for worker in dead:
                self._lose(worker, "died")
        return None

    def _note_demand_locked(self, scope: Hashable) -> None:
        """A worker of ``scope`` became busy: raise (or refresh) the scope's peak of
        busy workers, which lasts ``idle_s`` from when it was last reached."""
        if scope == CALL_SCOPE:
            return
        now = time.monotonic()
        busy = sum(1 for w in self._busy if w.scope == scope)
        peak, at = self._peaks.get(scope, (0, 0.0))
        if busy >= peak or now - at > self._idle_s:
            self._peaks[scope] = (busy, now)

    def _recent_peak_locked(self, scope: Hashable, now: float) -> int:
        peak, at = self._peaks.get(scope, (0, 0.0))
        return peak if now - at <= self._idle_s else 0

    def _retire(self, worker: WorkerHandle) -> None:
        """Kill, reap and close ``worker`` and forget it: closed and forgotten (its slot
        given back) even when its kill or reap raises (raised then)."""
        try:
            worker.kill()
            worker.reap()
        finally:
            worker.close()
            self._forget(worker)

    def _lose(self, worker: WorkerHandle, how: Literal["killed", "died"]) -> None:
        """A worker killed at a deadline (or for a bad reply), or found dead: kill its
        group, let the keeper start a replacement at once, then reap and close it (forgotten
        and closed even when a kill or reap raises)."""
        try:
            if how == "killed":
                worker.kill()
            else:
                worker.kill_tree()
        finally:
            with self._lock:
                if worker in self._all and not self._stopped:
                    self._counts[how] += 1
                self._forget_locked(worker)
                self._changed.notify_all()
            try:
                if worker.reap() is None:
                    worker.kill()
                    worker.reap()
            finally:
                worker.close()

    def _forget(self, worker: WorkerHandle) -> None:
        with self._lock:
            self._forget_locked(worker)
            self._changed.notify_all()

    def _forget_locked(self, worker: WorkerHandle) -> None:
        self._all.discard(worker)
        self._busy.discard(worker)
        self._held.discard(worker.held)
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)

    def _ready_or_lost(self, worker: WorkerHandle, wanted: bool = False) -> str | None:
        """:meth:`_await_ready`; why ``worker`` did not become ready (``None``: it did,
        or was stopped as surplus). Whatever else that raises is logged, and the worker,
        while the pool holds it neither idle nor busy, is stopped: no worker stays
        counted in the pool that no call can ever take."""
        try:
            if self._await_ready(worker, wanted):
                return None
            return f"worker {worker.pid} ended before it was ready (exit code {worker.exitcode})"
        except Exception as exc:
            logger.exception("worker pool: making worker {} ready failed; it is stopped", worker.pid)
            with self._lock:
                unready = worker in self._all and worker not in self._busy and worker not in self._idle
            if unready:  # (only this thread makes it idle: still so as it is lost)
                self._lose(worker, "killed")
            return f"making worker {worker.pid} ready failed: {describe_exception(exc)}"

    def _await_ready(self, worker: WorkerHandle, wanted: bool = False) -> bool:
        """Wait for a new worker's hello, send it the tools loaded ahead
        (:meth:`_load_into`; a worker ``wanted`` by a waiting call, or a spare while a
        call of its environment waits for one, only those already loaded by another
        worker) and make it idle (a spare, not ``wanted`` by a call: stop it when calls
        started enough workers of their own meanwhile); whether it became ready."""
        proved = idled = False
        try:
            ok = worker.channel.recv(time.monotonic() + _READY_TIMEOUT_S, wire.MAX_REPLY_BYTES) == (wire.READY, b"")
        except (DeadlineReached, EOFError, Malformed):
            ok = False
        if ok:
            with self._lock:
                self._start_took.append(time.monotonic() - worker.began)
        surplus = False
        while ok:
            wanted = wanted or self._calls_awaiting[cast(tuple[tuple[str, str], ...], worker.env_key)] > 0
            try:
                proved |= self._load_into(worker, tries=not wanted)
            except (DeadlineReached, EOFError, Malformed):
                ok = False
                break
            with self._lock:
                if self._next_load_locked(worker, tries=not wanted, peek=True) is not None:
                    continue  # a tool came meanwhile: load it first
                if worker in self._all and not self._stopped:
                    if wanted or self._fresh() < self._warm:
                        self._idle_locked(worker, since=time.monotonic())
                        idled = True
                        break
                    self._counts["retired"] += 1
                    surplus = True
            break
        if idled:
            if proved:
                self._spread()
            return True
        if surplus:
            self._retire(worker)
            return True
        if ok or self._stopped:  # stopped meanwhile: stop() kills it, its owner (here) closes it
            self._lose(worker, "killed")
            return True
        logger.warning("worker pool: worker {} did not become ready (exit code {})", worker.pid, worker.proc.exitcode)
        self._lose(worker, "died")
        return False

    # --- starts for calls, tools loaded ahead ---------------------------------------------------

    def _start_for_call(self, env_key: tuple[tuple[str, str], ...], start: WorkerStart) -> None:
        """Start a worker for a waiting call in a thread of its own (the call took its
        slot, ``start.claim``, and counts the start in ``_starts_for_calls`` here, which
        its end takes back): once ready it is idle, for whichever waiting call may take
        it first (the one it was started for, or another); ``start`` says when it failed.
        The thread takes the slot and the count over (``start.owner``) as it begins; a
        call interrupted before takes both back (:meth:`_take_back`)."""
        with self._lock:
            self._starts_for_calls[env_key] += 1
            start.counted = True

        def run() -> None:
            try:
                start.owner.pop()  # this thread's start from now on (its slot, its count)
            except IndexError:
                return  # the call that asked for it was interrupted first: it gave both back
            problem: str | None = "its start was interrupted"
            try:
                worker = self._spawn(busy=False, env_key=env_key, claim=start.claim)
            except PoolStopped:
                problem = "the worker pool is stopped"
            except Exception as exc:
                logger.exception("worker pool: a worker process could not be started")
                problem = describe_exception(exc)
            else:
                problem = self._ready_or_lost(worker, wanted=True)
            finally:  # the start ends once, whatever happened: its count, and its call told
                if problem is None:
                    start.done = True
                else:
                    start.failed(problem)
                with self._lock:
                    self._starts_for_calls[env_key] -= 1
                    self._warmed.notify_all()

        try:
            threading.Thread(target=run, name="rho-worker-start", daemon=True).start()
        except RuntimeError as exc:  # the host at its thread limit: no start, the call unavailable (_take_back)
            raise StartFailed(f"no thread could be started for its worker's start ({describe_exception(exc)})") from exc

    # --- a worker for a call ----------------------------------------------------------------

    def _take(
        self, scope: Hashable, env_key: tuple[tuple[str, str], ...], deadline: float, waits: bool = False,
        held: list[WorkerHandle] | None = None,
    ) -> WorkerHandle:
        """An idle worker of ``scope`` (a trusted pool: any), else a fresh spare started
        with the same ``env_key``, else a new worker. At the cap: an idle worker of
        another scope (of any pool sharing the cap) is retired for it, else the call
        waits for a slot or a worker it may use, until ``deadline`` (then raises
        ``QueuedPastDeadline``).

        ``waits`` (a call with a start bound, ``deadline`` its ``start_by``): a new
        worker is started in the background and the call takes the first worker it may
        use that becomes idle, the new one once ready or one another call freed
        meanwhile (raises ``NotStarted`` at ``deadline``, ``StartFailed`` when
        :data:`DELIVERY_ATTEMPTS` starts failed); without, the new worker is this
        call's, started here, its ``READY`` read with the reply. The worker is put in
        ``held`` as it is marked busy (see :meth:`_take_idle`)."""
        queued = False
        start: WorkerStart | None = None
        failures: list[str] = []
        hedge_at = time.monotonic() + max(0.0, deadline - time.monotonic()) / 2  # see _awaited_others_start
        if waits:
            with self._lock:
                self._calls_awaiting[env_key] += 1
        try:
            while True:
                worker = self._take_idle(scope, env_key, held)
                if worker is not None:
                    return worker
                if start is not None:
                    if start.done:  # its worker went idle and another call took it first: start one more
                        start = None
                        continue
                    with self._lock:
                        ready = self._warmed.wait_for(functools.partial(self._worth_a_look_locked, start, scope,
                                                                        env_key), max(0.0, deadline - time.monotonic()))
                    if start.problem is not None:
                        failures.append(start.problem)
                        if len(failures) >= DELIVERY_ATTEMPTS:
                            raise StartFailed("; ".join(failures))
                        start = None
                    elif not ready:
                        raise NotStarted
                    continue
                if waits and self._awaited_others_start(scope, env_key, deadline, hedge_at):
                    continue
                started = self._start_new(scope, env_key, waits, held)
                if isinstance(started, WorkerHandle):
                    return started
                if started is not None or self._slots is None:  # (None only at a full cap)
                    start = started
                    continue
                if not queued:
                    queued = True
                    with self._lock:
                        self._counts["queued"] += 1
                if self._slots.retire_idle():
                    continue
                if not self._slots.wait(deadline):
                    raise QueuedPastDeadline
        finally:
            if waits:
                with self._lock:
                    self._calls_awaiting[env_key] -= 1
                    self._warmed.notify_all()

    def _start_new(self, scope: Hashable, env_key: tuple[tuple[str, str], ...], waits: bool,
                   held: list[WorkerHandle] | None) -> WorkerHandle | WorkerStart | None:
        """With a process slot (``None``: the cap is full): this call's new worker,
        started here (busy, in ``held``), or (``waits``) the start of one in the
        background for any waiting call. Interrupted (a signal handler's
        ``KeyboardInterrupt``), it keeps nothing: :meth:`_take_back`."""
        start: WorkerStart | None = None
        claim: list[bool] = []  # the slot, this call's until a start has it (filled under the cap's lock)
        try:
            if self._slots is not None and not self._slots.try_acquire(claim):
                return None
            if not waits:
                return self._spawn(busy=True, env_key=env_key, scope=scope, claim=claim, held=held)
            start = WorkerStart(claim)
            self._start_for_call(env_key, start)
            return start
        except BaseException:
            self._take_back(env_key, start, claim)
            raise

    def _take_back(self, env_key: tuple[tuple[str, str], ...], start: WorkerStart | None,
                   claim: list[bool]) -> None:
        """A call interrupted as it started a worker takes back what its start had not
        taken over yet: the slot ``claim`` holds, and ``start``'s count unless its thread
        began (once, whichever comes first)."""
        if start is not None:
            try:
                start.owner.pop()
            except IndexError:
                return  # its thread began: the start, its slot and its count are its
            with self._lock:
                if start.counted:
                    start.counted = False
                    self._starts_for_calls[env_key] -= 1
                    self._warmed.notify_all()
        if self._slots is not None:
            self._slots.give_back(claim)

    def _awaited_others_start(self, scope: Hashable, env_key: tuple[tuple[str, str], ...], deadline: float,
                              hedge_at: float) -> bool:
        """For a call with a start bound that found no worker: while as many workers
        start for calls as calls wait for one, wait (raising ``NotStarted`` at
        ``deadline``) until one it may take is idle or a start ended; whether it waited.
        So a burst of short calls through a few workers starts no more of them than
        calls wait (the first waiting call a started worker may serve takes it). The
        keeper's spares being started count among those starts for a call of their
        environment (a spare has none: ``env_key`` ``()``), which any call may take: a
        call that comes while a spare starts takes it when ready (it started earlier
        than one the call would start now, and loads no untried tool while a call
        waits), not a second new worker beside it. A spare counts only until it is
        overdue (:data:`_OVERDUE_FACTOR`), and no start counts once the call's
        ``hedge_at``, half its start bound, has passed: a worker stopped (``SIGSTOP``) or
        stuck before ``READY`` (its own bound, 30 s, may be past the call's) would hold
        the call until its bound; it then starts its own in the time it has left."""
        with self._lock:
            if self._starts_awaited_locked(env_key, hedge_at) < self._calls_awaiting[env_key]:
                return False
            look = functools.partial(self._worth_a_look_locked, None, scope, env_key, hedge_at)
            until = min(deadline, self._counted_until_locked(hedge_at))
            if not self._warmed.wait_for(look, max(0.0, until - time.monotonic())) and time.monotonic() >= deadline:
                raise NotStarted
            return True

    def _overdue_s_locked(self) -> float:
        """How long a spare start may run before it is overdue (``inf``: none measured)."""
        return max(_OVERDUE_FLOOR_S, _OVERDUE_FACTOR * max(self._start_took)) if self._start_took else float("inf")

    def _counted_until_locked(self, hedge_at: float) -> float:
        """When the next start under way stops counting for a call of ``hedge_at``: its
        ``hedge_at``, or a spare's being overdue before it."""
        now, overdue_s = time.monotonic(), self._overdue_s_locked()
        return min([hedge_at, *(w.began + overdue_s for w in self._spares_starting if w.began + overdue_s > now)])

    def _starts_awaited_locked(self, env_key: tuple[tuple[str, str], ...], hedge_at: float | None = None) -> int:
        """The starts under way whose worker a call of ``env_key`` may take when ready:
        those for calls of it, and the keeper's spares not yet overdue for a call of no
        ``env``; none once ``hedge_at`` (a waiting call's) has passed."""
        now = time.monotonic()
        if hedge_at is not None and now >= hedge_at:
            return 0  # past half its start bound, a call counts on no start but its own
        spares = 0
        if not env_key:
            overdue_s = self._overdue_s_locked()
            spares = self._starting - sum(1 for w in self._spares_starting if now - w.began >= overdue_s)
        return self._starts_for_calls[env_key] + spares

    def _worth_a_look_locked(self, start: WorkerStart | None, scope: Hashable,
                             env_key: tuple[tuple[str, str], ...], hedge_at: float | None = None) -> bool:
        """Whether a call waiting for ``start`` (``None``: for a worker others started,
        until fewer start than calls wait) should look again: stopped, its start ended,
        or an idle worker it may take is there."""
        if start is None:
            return (self._stopped or self._usable_locked(scope, env_key)
                    or self._starts_awaited_locked(env_key, hedge_at) < self._calls_awaiting[env_key])
        return self._stopped or start.done or start.problem is not None or self._usable_locked(scope, env_key)


class WorkerStart:
    """A start asked for by a waiting call: ``done`` once its worker is idle (for any
    call to take), :meth:`failed` records why it failed (``problem``: ``None`` while it
    has not)."""

    __slots__ = ("claim", "counted", "done", "owner", "problem")

    def __init__(self, claim: list[bool]) -> None:
        self.claim = claim  # the process slot its call took (a one-item list; empty: no cap)
        self.owner = [True]  # popped by whoever owns the start: its thread as it begins, or its interrupted call
        self.counted = False  # counted in the pool's starts for calls
        self.done = False
        self.problem: str | None = None

    def failed(self, problem: str) -> None:
        self.problem = problem
