"""The keeper of a :class:`~rho_actors.sandbox.pool.WorkerPool`: its background thread,
which keeps ``warm`` spare workers idle, replaces lost ones and retires workers idle too
long (DESIGN §5 "Starting a worker"; internal).

:class:`WarmKeeper` is the pool's worker processes (:class:`~rho_actors.sandbox.warm_workers.WarmWorkers`)
with that thread's loop. Every spare it starts is counted in ``_starting`` until its
start ended, and ends exactly once (:meth:`WarmKeeper._started_one`), whatever fails on
the way: a spawn, the start of the thread that waits for the worker's ``READY`` (the
host at its thread limit: ``RuntimeError: can't start new thread``), or the wait
itself. Whatever the loop meets that it did not expect is logged and waited out, never
the end of the thread: a keeper that died would leave the pool without spares for good,
and calls counting on a start it had counted. Failures in a row are a
:class:`~rho_actors.otp.failure_runs.FailureRun`: the keeper waits :data:`KEEPER_BACKOFF_S`
after the first, twice as long after each next one, at most :data:`KEEPER_BACKOFF_MAX_S`,
and logs the 1st, 2nd, 4th, 8th... (a keeper at the host's thread limit started and
killed a worker and logged a traceback twice a second, for ever); a worker ready again
ends the run. A start refused because the pool is stopped or its cap full is no failure:
the keeper looks again after :data:`KEEPER_BACKOFF_S`.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from loguru import logger

from rho_actors.otp.failure_runs import FailureRun
from rho_actors.sandbox.warm_workers import PoolStopped, WarmWorkers
from rho_actors.sandbox.worker_handle import WorkerHandle

__all__ = ["KEEPER_BACKOFF_MAX_S", "KEEPER_BACKOFF_S", "WarmKeeper", "keeper_failures"]

KEEPER_BACKOFF_S: Final = 0.5
"""How long the keeper starts no worker after a first start failed, or after anything it
did not expect (seconds); doubled for each failure in a row."""
KEEPER_BACKOFF_MAX_S: Final = 30.0
"""The longest the keeper waits after failures in a row (seconds)."""


def keeper_failures() -> FailureRun:
    """A pool's run of keeper failures (:data:`KEEPER_BACKOFF_S` doubled up to :data:`KEEPER_BACKOFF_MAX_S`)."""
    return FailureRun("worker pool keeper", KEEPER_BACKOFF_S, KEEPER_BACKOFF_MAX_S)


class WarmKeeper(WarmWorkers):
    """A pool's worker processes and the keeper thread's loop (:meth:`_keep_warm`, the
    module doc)."""

    _failed_starts: FailureRun

    def _deficit(self) -> int:
        if self._scoped:  # spares: fresh idle workers
            return self._warm - self._fresh() - self._starting
        return self._warm - len(self._all) - self._starting

    def _retire_stale(self) -> None:
        """Retire idle workers idle for longer than ``idle_s``: every scoped one, and
        unscoped ones beyond ``warm`` (oldest first); forget peaks older than that."""
        now = time.monotonic()
        with self._lock:
            stale = [w for w in self._idle if w.doomed or (w.scope is not None and now - w.idle_since > self._idle_s)]
            unscoped = [w for w in self._idle if w.scope is None]
            surplus = len(unscoped) - self._warm
            stale.extend(w for w in unscoped[:max(0, surplus)] if now - w.idle_since > self._idle_s)
            for worker in stale:
                self._idle.remove(worker)
                self._counts["retired"] += 1
            for scope, (_, at) in list(self._peaks.items()):
                if now - at > self._idle_s:
                    del self._peaks[scope]
        for worker in stale:  # each one's retirement, whatever another's raised: the keeper goes on
            try:
                self._retire(worker)
            except Exception:
                logger.exception("worker pool: retiring worker {} failed; the pool goes on", worker.pid)

    def _keep_warm(self) -> None:
        """The background thread: keep ``warm`` workers alive, replacing lost ones, and
        retire workers idle too long. Each new worker is made ready (its ``READY`` read,
        the tools loaded ahead sent to it) in a thread of its own
        (:meth:`_ready_spare`), so that a worker slow to start or to load a tool delays
        no other; a start that failed holds the next starts back (:data:`KEEPER_BACKOFF_S`,
        doubled per failure in a row), and so does anything else the loop raises (logged
        as the module doc says): the thread ends only at the pool's stop."""
        tick = max(0.05, min(self._idle_s / 2, 5.0))
        while True:
            try:
                if not self._keep_warm_once(tick):
                    return
            except Exception:
                count, pause = self._failed_starts.failed()
                if FailureRun.logged(count):
                    logger.exception("worker pool: the keeper met an unexpected error; it goes on in {:g} s{}", pause,
                                     FailureRun.so_far(count))
                with self._lock:
                    self._keeper_backoff = time.monotonic() + pause

    def _keep_warm_once(self, tick: float) -> bool:
        """One round of the keeper: retire stale workers, wait (at most ``tick``) for a
        deficit of spares, start them; ``False`` once the pool is stopped."""
        self._retire_stale()
        with self._lock:
            while not self._stopped:
                wait = self._keeper_backoff - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                if self._deficit() > 0:
                    break
                self._changed.wait(tick)
                break
            if self._stopped:
                return False
            if self._deficit() <= 0 or self._keeper_backoff > time.monotonic():
                return True
            left = self._deficit()
            self._starting += left
        try:
            while left:
                left -= 1
                self._start_spare()
        finally:  # whatever interrupted the round: the starts it counted and never made end here
            for _ in range(left):
                self._started_one(failed=True)
        return True

    def _start_spare(self) -> None:
        """Start one spare (counted in ``_starting``) and the thread that makes it ready;
        its start ends exactly once: here when either fails, else in that thread. A
        worker whose thread could not be started (the host at its thread limit) is
        stopped at once (nothing would ever read its ``READY``)."""
        try:
            worker = self._spawn(busy=False)
        except PoolStopped:  # stopped, or the cap is full: wait for a change
            self._started_one(failed=True, refused=True)
            return
        except Exception:
            self._log_failure("worker pool: a worker process could not be started")
            self._started_one(failed=True)
            return
        with self._lock:
            self._spares_starting.add(worker)
        try:
            threading.Thread(target=self._ready_spare, args=(worker,), name="rho-worker-ready", daemon=True).start()
        except Exception:
            self._log_failure(f"worker pool: no thread could be started to wait for worker {worker.pid}; it is "
                              "stopped, and the keeper tries again later")
            with self._lock:
                self._spares_starting.discard(worker)
            try:
                self._retire(worker)
            finally:
                self._started_one(failed=True)

    def _ready_spare(self, worker: WorkerHandle) -> None:
        """A spare the keeper started: :meth:`_ready_or_lost`, then its start ended."""
        problem: str | None = "its start was interrupted"
        try:
            problem = self._ready_or_lost(worker)
        finally:
            with self._lock:
                self._spares_starting.discard(worker)
            self._started_one(failed=problem is not None)

    def _log_failure(self, text: str) -> None:
        """Log ``text`` with the exception being handled when the failure it is part of is
        one of its run to log (the module doc)."""
        if self._failed_starts.next_logged():
            logger.opt(depth=1).exception("{}{}", text, FailureRun.so_far(self._failed_starts.count + 1))

    def _started_one(self, failed: bool, refused: bool = False) -> None:
        """One of the keeper's starts ended (``failed``: the next starts wait, the longer
        the more failed in a row; ``refused``, by a stopped or full pool: no failure, the
        next look in :data:`KEEPER_BACKOFF_S`); a call waiting for it looks again
        (:meth:`~rho_actors.sandbox.taking.WorkerTaking._awaited_others_start`)."""
        if not failed:  # (told before a call waiting for it looks again)
            self._failed_starts.passed()
        pause = KEEPER_BACKOFF_S if refused else self._failed_starts.failed()[1] if failed else 0.0
        with self._lock:
            self._starting -= 1
            if failed:
                self._keeper_backoff = max(self._keeper_backoff, time.monotonic() + pause)
            self._changed.notify_all()
            self._warmed.notify_all()
