"""One timer thread per system: ``send_after`` for actors, as Erlang's ``erlang:send_after/3``.

pykka has no timed messages, and a ``threading.Timer`` per call deadline costs a thread
start (~100 µs). A :class:`Timers` service keeps every pending timer in one heap served by
one thread; a due timer's callback runs on that thread and must be quick (a ``tell``).

Example::

    timers = Timers()
    handle = timers.send_after(0.5, actor_ref, Deadline(call_id))  # tell in 500 ms
    handle.cancel()                                                # unless cancelled first
    timers.stop()
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka
from loguru import logger

__all__ = ["Timer", "Timers"]


def _nothing() -> None:
    pass

_MAX_WAIT_S = 3600.0  # below threading.TIMEOUT_MAX: a far timer is waited for in steps


class Timer:
    """A pending timer; :meth:`cancel` stops it from firing (a no-op once fired).
    ``cancelled`` is true once it can no longer fire."""

    __slots__ = ("_callback", "_owner", "cancelled", "when")

    def __init__(self, owner: Timers, when: float, callback: Callable[[], None]) -> None:
        self._owner = owner
        self.when = when
        self._callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        """Stop the timer from firing (a no-op once it has fired)."""
        self._owner._cancel(self)


class Timers:
    """A heap of timers served by one daemon thread, started on creation."""

    def __init__(self, name: str = "rho_actors-timers") -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._dead = 0  # cancelled timers still in the heap
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback()`` on the timer thread at ``when`` (a ``time.monotonic()``
        instant, seconds). Raises ``RuntimeError`` once stopped."""
        timer = Timer(self, when, callback)
        with self._cond:
            if self._stopped:
                raise RuntimeError("timers are stopped")
            heapq.heappush(self._heap, (when, next(self._seq), timer))
            if self._heap[0][2] is timer:
                self._cond.notify()
        return timer

    def send_after(self, delay_s: float, ref: pykka.ActorRef[Any], message: Any) -> Timer:
        """Tell ``message`` to the actor ``ref`` after ``delay_s`` seconds (dropped if the
        actor has stopped by then)."""

        def deliver() -> None:
            try:
                ref.tell(message)
            except pykka.ActorDeadError:
                pass

        return self.call_at(time.monotonic() + delay_s, deliver)

    def _cancel(self, timer: Timer) -> None:
        """Cancel a pending timer; drop all cancelled ones once they are most of the
        heap, so that short calls with long deadlines do not pile up."""
        with self._cond:
            if timer.cancelled:
                return
            timer.cancelled = True
            # A cancelled timer stays in the heap until due: it must not keep its
            # callback's objects (a call's whole state) alive that long.
            timer._callback = _nothing
            self._dead += 1
            if self._dead > 1024 and self._dead * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._dead = 0

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._cond.wait(None if timeout is None else min(timeout, _MAX_WAIT_S))
                if self._stopped:
                    return
                _, _, timer = heapq.heappop(self._heap)
                if timer.cancelled:
                    self._dead -= 1
                    continue
                timer.cancelled = True  # fired: a later cancel() is a no-op
            try:
                timer._callback()
            except BaseException:  # this thread serves every deadline: it must not end
                logger.exception("timer callback raised")

    def pending(self) -> int:
        """How many timers are waiting (cancelled ones included until they are due)."""
        with self._cond:
            return len(self._heap)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Drop every pending timer and end the thread (waiting at most ``timeout_s``)."""
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
