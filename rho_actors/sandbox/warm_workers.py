"""The worker processes of a :class:`~rho_actors.sandbox.pool.WorkerPool` and how they
are kept warm (DESIGN §5 "Starting a worker"; internal).

:class:`WarmWorkers` is the pool's half that owns its worker processes: it starts them
(:meth:`WarmWorkers._spawn`, each under its :class:`~rho_actors.sandbox.confine.enclosure.Enclosure`
when the pool confines), hands a call an idle one (:meth:`WarmWorkers._take_idle`), notes each
scope's demand, makes new ones ready, loses, retires and forgets them. How a call that
finds no idle worker gets one (a start, or a wait for a place under the cap) is
:mod:`rho_actors.sandbox.taking`. The pool's background thread, the keeper,
which keeps ``warm`` spares idle, replaces lost workers and retires workers idle too
long, is :mod:`rho_actors.sandbox.keeper`. The call's half (a place under the cap, delivery, the reply, the deadline) is
:mod:`rho_actors.sandbox.pool` with :mod:`rho_actors.sandbox.delivery`.
"""

from __future__ import annotations

import contextlib
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

__all__ = ["CALL_SCOPE", "PoolStopped", "WarmWorkers"]

CALL_SCOPE: Final = "call"
"""The scope of a worker used for one call only (``worker_scope="call"``)."""

_READY_TIMEOUT_S: Final = 30.0
"""How long a new worker may take to say ``READY`` (seconds)."""


class PoolStopped(Exception):
    """The pool is stopped (or, for a spare, the cap is full)."""


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
