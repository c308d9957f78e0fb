"""Where the results of a turn the host waits for land (internal; DESIGN §4): the sink
:meth:`Loop.run_turn <rho_actors.loop.handle.Loop.run_turn>` waits on (:class:`Latch`,
also its thread's :class:`~rho_actors.sandbox.Waiter`), and the one
:meth:`Loop.arun_turn <rho_actors.loop.handle.Loop.arun_turn>` awaits (:class:`Landing`),
with the bounds of the turns awaited on one event loop (:class:`Bounds`)."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from rho_actors.sandbox import Waiter
from rho_actors.tool import ToolResult

__all__ = ["Bounds", "Landing", "Latch"]


class Latch(Waiter):
    """Where the results of a turn waited for by :meth:`Loop.run_turn` land (the turn's
    sink): one lock, held until they are set; lighter than a
    ``concurrent.futures.Future``, which nothing else would see. It is also the
    :class:`~rho_actors.sandbox.Waiter` of the thread that waits (one object a turn)."""

    __slots__ = ("held", "results")
    runs_host_code: ClassVar[bool] = False  # set_result releases a lock: the host's code runs in its own thread

    def __init__(self) -> None:
        self._thread, self._call, self._replies, self._deadline = threading.get_ident(), None, None, None  # Waiter's
        self.results: list[ToolResult] = []
        self.held = threading.Lock()  # released once the results are set: run_turn waits on it
        self.held.acquire()

    def set_result(self, results: list[ToolResult]) -> None:
        """The turn's results (from any thread; once)."""
        self.results = results
        self.held.release()


class Landing:
    """Where the results of a turn awaited on ``aio`` land (the turn's sink), bounded by
    ``bound_s`` seconds: kept in :attr:`results` at once when they are set on ``aio``'s
    own thread (every call refused, or settled there), and handed to the future of
    :meth:`wait` with one ``call_soon_threadsafe`` from the thread that settled the
    turn's last call (one hop, no ``concurrent.futures.Future`` in between). Built on
    ``aio``'s thread; the future is made only when the host has to wait."""

    __slots__ = ("_thread", "_waiter", "_waiting", "aio", "bound_s", "results")
    runs_host_code: ClassVar[bool] = False  # set_result lands on aio's thread (or schedules it there)

    def __init__(self, aio: asyncio.AbstractEventLoop, bound_s: float) -> None:
        self.aio = aio
        self.bound_s = bound_s
        self._thread = threading.get_ident()
        self.results: list[ToolResult] | None = None  # read and set on aio's thread only
        self._waiter: asyncio.Future[list[ToolResult]] | None = None
        self._waiting: asyncio.Future[None] | None = None

    def set_result(self, results: list[ToolResult]) -> None:
        """The turn's results (from any thread; once)."""
        if threading.get_ident() == self._thread:
            self._land(results)
            return
        try:
            self.aio.call_soon_threadsafe(self._land, results)
        except RuntimeError:  # the event loop has closed: nobody awaits the turn any more
            pass

    def _land(self, results: list[ToolResult]) -> None:
        self.results = results
        waiter = self._waiter
        if waiter is not None and not waiter.done():  # else timed out, or its task was cancelled
            waiter.set_result(results)
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    def wait(self, stop: Callable[[], object] | None) -> asyncio.Future[list[ToolResult]]:
        """The future of the results (on aio's thread, before they have landed): when it
        is cancelled (its awaiting task is), ``stop()`` cancels the turn at once, in that step."""
        waiter = self._waiter = _Waiter(self.aio, stop)
        return waiter

    def expire(self) -> None:
        """The bound has passed (on aio's thread): the awaiting host gets ``TimeoutError``."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(TimeoutError(f"the turn did not finish within {self.bound_s} s"))

    def wait_landed(self) -> asyncio.Future[None]:
        """An asyncio future done once the results have landed (on aio's thread)."""
        if self._waiting is None:
            self._waiting = self.aio.create_future()
            if self.results is not None:
                self._waiting.set_result(None)
        return self._waiting


class _Waiter(asyncio.Future[list[ToolResult]]):
    """The future a turn's awaiting task waits on, which sets the turn's token as it is
    cancelled: the task's ``cancel()`` cancels the turn in the same step (a call running
    on its event loop has its task cancelled then, as the host's own coroutine awaited
    there would), not a step later when the task runs again."""

    def __init__(self, aio: asyncio.AbstractEventLoop, stop: Callable[[], object] | None) -> None:
        super().__init__(loop=aio)
        self._stop = stop

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        if self._stop is not None:
            self._stop()
        return True


class Bounds:
    """The bounds of the turns awaited on ``aio`` through one handle: one timer, armed
    at the earliest bound (a turn whose bound comes after it costs a dict entry, not a
    ``call_later``), which expires every turn due and re-arms for the next. Used on
    ``aio``'s thread only."""

    __slots__ = ("_at", "_due", "_timer", "aio")

    def __init__(self, aio: asyncio.AbstractEventLoop) -> None:
        self.aio = aio
        self._due: dict[Landing, float] = {}  # each turn awaited: when its bound passes (aio.time() s)
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires (inf: none armed)

    def add(self, landing: Landing) -> None:
        """Bound ``landing``'s turn from now (it must be discarded once awaited)."""
        at = self._due[landing] = self.aio.time() + landing.bound_s
        if at < self._at:
            self._arm(at)

    def discard(self, landing: Landing) -> None:
        self._due.pop(landing, None)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.aio.call_at(at, self._fire) if at < math.inf else None
        self._at = at

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        now = self.aio.time()
        soonest = math.inf
        for landing, at in list(self._due.items()):
            if at <= now:
                del self._due[landing]
                landing.expire()
            elif at < soonest:
                soonest = at
        self._arm(soonest)
