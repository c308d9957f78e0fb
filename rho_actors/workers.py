"""The WorkerPool actor: the supervised owner of the worker processes of ``process``
isolation (DESIGN §5, §6: permanent).

The processes themselves are a :class:`rho_actors.sandbox.WorkerPool`, started lazily on
the first ``process`` call (a system that runs no such call starts no process). The
actor stops the pool, killing every worker's process group, when it stops; restarted by
its supervisor, it starts from an empty pool.
"""

from __future__ import annotations

import threading
from typing import Any

from rho_actors.actor import Actor

__all__ = ["Workers", "WorkerPoolActor"]


class Workers:
    """The system's handle on the current worker pool, shared with the CallActors.

    ``warm`` idle workers are kept; each is bound to ``heap_bytes`` bytes of address
    space; ``start_method`` is ``"forkserver"`` or ``"spawn"``.
    """

    def __init__(self, warm: int = 2, heap_bytes: int = 256 * 2**20, start_method: str = "forkserver") -> None:
        self.warm, self.heap_bytes, self.start_method = warm, heap_bytes, start_method
        self._lock = threading.Lock()
        self._pool: Any = None
        self._open = False

    def pool(self) -> Any:
        """The running :class:`rho_actors.sandbox.WorkerPool`, started on first use.
        Raises ``RuntimeError`` while the WorkerPool actor is not running."""
        with self._lock:
            if not self._open:
                raise RuntimeError("the worker pool is not running (the system is stopping, or it is restarting)")
            if self._pool is None:
                from rho_actors.sandbox import WorkerPool

                self._pool = WorkerPool(self.warm, heap_bytes=self.heap_bytes, start_method=self.start_method)
            return self._pool

    def stats(self) -> dict[str, int]:
        """The pool's counters (see :meth:`rho_actors.sandbox.WorkerPool.stats`), or {}
        before its first use."""
        with self._lock:
            pool = self._pool
        return pool.stats() if pool is not None else {}

    def pids(self) -> list[int]:
        """The process ids of the pool's worker processes alive now ([] before its first use)."""
        with self._lock:
            pool = self._pool
        return pool.pids() if pool is not None else []

    def _open_pool(self) -> None:
        with self._lock:
            self._open = True

    def _close_pool(self, timeout_s: float) -> None:
        with self._lock:
            pool, self._pool, self._open = self._pool, None, False
        if pool is not None:
            pool.stop(timeout_s)


class WorkerPoolActor(Actor):
    """Opens :class:`Workers` on start and stops its pool on stop (within ``timeout_s``
    seconds): no worker process, and no descendant of one, outlives it."""

    def __init__(self, workers: Workers, timeout_s: float = 5.0) -> None:
        super().__init__()
        self._workers = workers
        self._timeout_s = timeout_s

    def on_start(self) -> None:
        self._workers._open_pool()

    def on_stop(self) -> None:
        self._workers._close_pool(self._timeout_s)

    def on_failure(self, *exc_info: Any) -> None:
        self._workers._close_pool(self._timeout_s)

    def stats(self) -> dict[str, int]:
        return self._workers.stats()
