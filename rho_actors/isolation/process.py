"""``process`` isolation: a call runs in a warm worker process (DESIGN §5).

The call's CallActor hands it to the system's :class:`rho_actors.sandbox.WorkerPool`
and waits; the pool owns the deadline: at it, the worker's process group is killed and
the result is a ``timeout`` error. The pool starts on the first call (a system that runs
no ``process`` call starts no process) and is stopped, killing every worker's process
group, when the system's ``workers`` actor stops.
"""

from __future__ import annotations

import threading
from typing import ClassVar

from rho_actors.call import CallSpec, RunCall
from rho_actors.isolation.base import Isolation, IsolationServices
from rho_actors.results import failure
from rho_actors.sandbox import WorkerPool
from rho_actors.tool import ToolResult

__all__ = ["ProcessIsolation"]


class _Running:
    __slots__ = ("call",)

    def __init__(self, call: CallSpec) -> None:
        self.call = call

    def cancel(self, reason: str) -> None:
        """Set the call's token; the worker finishes (or is killed at the deadline)."""
        self.call.cancel.cancel(reason)


class ProcessIsolation(Isolation):
    """Runs each call in a worker process of a lazily started :class:`WorkerPool`."""

    name: ClassVar[str] = "process"

    def __init__(self, services: IsolationServices) -> None:
        super().__init__(services)
        self._lock = threading.Lock()
        self._pool: WorkerPool | None = None
        self._open = False

    def start(self, call: CallSpec) -> _Running:
        self.services.calls.start().tell(RunCall(call, self._run))
        return _Running(call)

    def _run(self, call: CallSpec) -> ToolResult:
        """The runner, in the CallActor's thread: the call in a worker, until its result."""
        try:
            pool = self.pool()
        except RuntimeError as err:
            return failure("pool_closed", call.call_id, call.name, problem=str(err))
        return pool.run(
            call.tool, call.args, call.ctx, call.deadline, call.max_output_chars, name=call.name,
            started=call.dispatched,
        )

    def pool(self) -> WorkerPool:
        """The running pool, started on first use. Raises ``RuntimeError`` while the
        isolation is not open (its system is stopping, or its actor restarting)."""
        with self._lock:
            if not self._open:
                raise RuntimeError("the worker pool is not running (the system is stopping, or it is restarting)")
            if self._pool is None:
                s = self.services
                self._pool = WorkerPool(s.warm_workers, heap_bytes=s.heap_bytes, start_method=s.start_method)
            return self._pool

    def open(self) -> None:
        with self._lock:
            self._open = True

    def shutdown(self, timeout_s: float) -> None:
        with self._lock:
            pool, self._pool, self._open = self._pool, None, False
        if pool is not None:
            pool.stop(timeout_s)

    def stats(self) -> dict[str, int]:
        """The pool's counters as ``workers_<name>`` (see :meth:`WorkerPool.stats`),
        none before its first use."""
        with self._lock:
            pool = self._pool
        return {f"workers_{k}": v for k, v in pool.stats().items()} if pool is not None else {}
