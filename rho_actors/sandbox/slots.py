"""The cap on worker processes of a whole system (internal; DESIGN §5).

Every :class:`~rho_actors.sandbox.pool.WorkerPool` of a system takes a slot of one
:class:`WorkerSlots` before it starts a worker process and frees it once the process is
reaped, so the system never has more than ``limit`` worker processes alive.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Protocol

__all__ = ["WorkerSlots"]


class _Retiring(Protocol):
    def retire_one_idle(self) -> bool:
        """Stop one idle worker; whether there was one."""


class WorkerSlots:
    """The cap on worker processes of a whole system (alive ones: idle, busy or
    starting; a slot is freed once its process is reaped). A call that needs a worker
    beyond it takes an idle worker it may use, else retires an idle worker of any pool
    sharing the cap, else waits (:meth:`wait`), until its deadline. ``limit`` >= 1.
    ``peak`` is the most ever alive at once."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the worker cap must be >= 1, not {limit}")
        self.limit = limit
        self.alive = 0
        self.peak = 0
        self.waiting = 0
        self._cond = threading.Condition()
        self._pools: weakref.WeakSet[_Retiring] = weakref.WeakSet()

    def join(self, pool: _Retiring) -> None:
        """Let this cap retire ``pool``'s idle workers when it is full."""
        self._pools.add(pool)

    def try_acquire(self) -> bool:
        """Take a slot if one is free now."""
        with self._cond:
            if self.alive >= self.limit:
                return False
            self.alive += 1
            self.peak = max(self.peak, self.alive)
            return True

    def retire_idle(self) -> bool:
        """Stop the longest idle worker of the first pool sharing the cap that has one;
        whether one was stopped (its slot is free once it is reaped, which is done)."""
        return any(pool.retire_one_idle() for pool in list(self._pools))

    def wait(self, deadline: float) -> bool:
        """While the cap is full, wait until a slot is freed or a worker becomes idle
        (at most 250 ms, and never past ``deadline``, a ``time.monotonic()`` instant);
        ``False`` once ``deadline`` has passed. Counted in ``waiting`` meanwhile: spares
        are not started while calls wait."""
        with self._cond:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.alive >= self.limit:
                self.waiting += 1
                try:
                    self._cond.wait(min(remaining, 0.25))
                finally:
                    self.waiting -= 1
            return True

    def release(self) -> None:
        """Free a slot (its process was reaped)."""
        with self._cond:
            self.alive -= 1
            self._cond.notify()

    def poke(self) -> None:
        """A worker became idle: every waiting call looks again (it may take it, or
        retire it)."""
        with self._cond:
            self._cond.notify_all()
