"""How a call of a :class:`~rho_actors.sandbox.pool.WorkerPool` takes its worker
(DESIGN §5 "Starting a worker"; internal).

:class:`WorkerTaking` is the pool's part that finds a call its worker
(:meth:`WorkerTaking._take`): an idle one it may use, else a start (this call's own,
started in its thread; or, for a call with a start bound, one in the background
(:meth:`WorkerTaking._start_for_call`) whose worker the first waiting call it fits
takes), else a wait for a place under the cap. A call with a start bound that finds
starts under way for as many calls as wait waits for them rather than start one more,
until a spare start is overdue or half its start bound has passed. The worker
processes themselves (starting, readying, losing, retiring) are
:mod:`rho_actors.sandbox.warm_workers`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Hashable
from typing import Final

from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.sandbox.warm_workers import PoolStopped, WarmWorkers
from rho_actors.sandbox.worker_handle import WorkerHandle

__all__ = ["DELIVERY_ATTEMPTS", "NotStarted", "QueuedPastDeadline", "StartFailed", "WorkerStart", "WorkerTaking"]

_OVERDUE_FACTOR: Final = 3.0
_OVERDUE_FLOOR_S: Final = 1.0
"""A spare start under way is *overdue*, and a call stops waiting for it, once it has run
:data:`_OVERDUE_FACTOR` times as long as the slowest of the pool's latest starts took (at
least :data:`_OVERDUE_FLOOR_S`; none measured yet: never, the call's own half-way mark
rules alone). See :meth:`WorkerTaking._awaited_others_start`."""


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


class WorkerTaking(WarmWorkers):
    """A pool's worker processes and how a call takes one (see the module doc)."""

    # --- starts for calls -------------------------------------------------------------------

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
