"""One timer thread per system: ``send_after`` for actors, as Erlang's ``erlang:send_after/3``.

pykka has no timed messages, and a ``threading.Timer`` per call deadline costs a thread
start (~100 µs). A :class:`Timers` service keeps every pending timer in one heap served by
one thread; a due timer's callback runs on that thread and must be quick (a ``tell``, or
a call's deadline claiming its result slot and handing the rest to another thread: every
deadline of the system waits behind it). A call's deadline is its own heap entry (a
:class:`Timer` subclass given to :meth:`Timers.schedule`), and cancelling a timer takes
no lock.

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
from typing import Any, ClassVar

import pykka
from loguru import logger

__all__ = ["Timer", "Timers"]


def _nothing() -> None:
    pass

_MAX_WAIT_S = 3600.0  # below threading.TIMEOUT_MAX: a far timer is waited for in steps
_MAIN_THREAD = threading.main_thread().ident  # where signal handlers run (and raise KeyboardInterrupt)


class Timer:
    """A pending timer; :meth:`cancel` stops it from firing (a no-op once fired).
    ``cancelled`` is true once it can no longer fire; ``when`` is its
    ``time.monotonic()`` instant (seconds).

    A subclass is its own heap entry (:meth:`Timers.schedule`): it overrides
    :meth:`fire`, run on the timer thread when due, and :meth:`dropped`, run once it
    can no longer fire, to let go of what it holds (it stays in the heap until due)."""

    __slots__ = ("_owner", "cancelled", "when")

    fire_anywhere: ClassVar[bool] = False
    """Whether :meth:`Timers.run_due` may fire it from any thread that passes by once it
    is due (a deadline: whichever thread first sees it passed), not only the timer
    thread. Its :meth:`fire` must then be safe from any thread."""

    def __init__(self, when: float) -> None:
        self.when = when
        self.cancelled = False
        self._owner: Timers | None = None

    @property
    def timers(self) -> Timers | None:
        """The service it is scheduled on (``None`` before)."""
        return self._owner

    def fire(self) -> None:
        """The timer's work, on the timer thread when due (keep it quick)."""

    def dropped(self) -> None:
        """Called once when cancelled: let go of what the timer holds."""

    def cancel(self) -> None:
        """Stop the timer from firing (a no-op once it has fired). Lock-free: a cancel
        racing the firing may or may not stop it."""
        if self.cancelled:
            return
        self.cancelled = True
        self.dropped()
        owner = self._owner
        if owner is not None:
            owner._dead += 1  # unlocked: a lost count only delays the next compaction
            if owner._dead > 1024:
                owner._cancelled()


class _CallbackTimer(Timer):
    __slots__ = ("_callback",)

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        super().__init__(when)
        self._callback = callback

    def fire(self) -> None:
        self._callback()

    def dropped(self) -> None:
        # A cancelled timer stays in the heap until due: it must not keep its
        # callback's objects (a call's whole state) alive that long.
        self._callback = _nothing


class Timers:
    """A heap of timers served by one daemon thread, started on creation."""

    def __init__(self, name: str = "rho_actors-timers") -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()  # taken as itself where nothing waits (no Python frame per call)
        self._cond = threading.Condition(self._lock)
        self._stopped = False
        self._dead = 0  # cancelled timers still in the heap (a count that may run short: a hint)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback()`` on the timer thread at ``when`` (a ``time.monotonic()``
        instant, seconds). Raises ``RuntimeError`` once stopped."""
        return self.schedule(_CallbackTimer(when, callback))

    def schedule(self, timer: Timer) -> Timer:
        """Fire ``timer`` (a :class:`Timer` subclass, not yet scheduled) at its ``when``:
        no object besides it per timer. Returns it. Raises ``RuntimeError`` once stopped,
        ``ValueError`` when it was scheduled before."""
        if timer._owner is not None:
            raise ValueError(f"{timer!r} is scheduled already")
        timer._owner = self
        with self._lock:
            if self._stopped:
                raise RuntimeError("timers are stopped")
            heapq.heappush(self._heap, (timer.when, next(self._seq), timer))
            if self._heap[0][2] is timer:
                try:
                    self._cond.notify()
                except BaseException:  # interrupted inside (Python code): pushed, the timer thread must wake
                    self._cond.notify()
                    raise
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

    def _cancelled(self) -> None:
        """Timers were cancelled (``_dead`` counts them): drop all cancelled ones once they
        are most of the heap, so that short calls with long deadlines do not pile up."""
        if self._dead > 1024 and self._dead * 2 > len(self._heap):
            with self._cond:
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
                    self._dead = max(0, self._dead - 1)
                    continue
                timer.cancelled = True  # fired: a later cancel() is a no-op
            try:
                timer.fire()
            except BaseException:  # this thread serves every deadline: it must not end
                logger.exception("timer callback raised")

    def run_due(self, now: float, limit: int = 8) -> int:
        """Fire, in this thread, up to ``limit`` timers due at ``now`` (a
        ``time.monotonic()`` reading) that may fire anywhere (:attr:`Timer.fire_anywhere`),
        stopping at the first due one that may not. For busy threads passing by: under
        load the timer thread may wait long for the interpreter, a thread already
        running fires a passed deadline first. Costs one look at the heap when nothing
        is due; never blocks on a timer's work. Returns how many fired.

        Never fires in the interpreter's main thread, where a signal's handler may raise
        between any two bytecodes: a deadline interrupted there after it claimed its
        call's answer would leave that call (maybe another session's) unanswered."""
        heap = self._heap
        try:
            if heap[0][0] > now:
                return 0
        except IndexError:
            return 0
        if threading.get_ident() == _MAIN_THREAD:  # only when something is due: off the common path
            return 0
        fired = 0
        while fired < limit:
            with self._lock:
                if self._stopped or not self._heap or self._heap[0][0] > now:
                    break
                timer = self._heap[0][2]
                if timer.cancelled:
                    heapq.heappop(self._heap)
                    self._dead = max(0, self._dead - 1)
                    continue
                if not timer.fire_anywhere:
                    break
                heapq.heappop(self._heap)
                timer.cancelled = True  # fired
            fired += 1
            try:
                timer.fire()
            except Exception:
                logger.exception("timer callback raised")
        return fired

    def on_timer_thread(self) -> bool:
        """Whether the calling thread is this service's timer thread."""
        return threading.current_thread() is self._thread

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
