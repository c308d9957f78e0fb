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
    beyond it first retires an idle worker of any pool sharing the cap, else waits,
    until its deadline. ``limit`` >= 1. ``peak`` is the most ever alive at once."""

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

    def acquire(self, deadline: float) -> bool:
        """Take a slot, retiring idle workers or waiting until ``deadline``
        (``time.monotonic()``); whether one was taken."""
        while True:
            if self.try_acquire():
                return True
            if any(pool.retire_one_idle() for pool in list(self._pools)):
                continue
            with self._cond:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if self.alive >= self.limit:
                    self.waiting += 1
                    try:
                        self._cond.wait(min(remaining, 0.25))  # an idle worker may appear meanwhile
                    finally:
                        self.waiting -= 1

    def release(self) -> None:
        """Free a slot (its process was reaped)."""
        with self._cond:
            self.alive -= 1
            self._cond.notify()

    def poke(self) -> None:
        """A worker became idle: a waiting call may retire it."""
        with self._cond:
            self._cond.notify()
