"""The event loop background calls of ``async`` tools run on (DESIGN §4 "Background calls").

A background call of a trusted ``async`` tool in ``thread`` isolation runs as an
``asyncio`` task on one event loop per system, in its own daemon thread
(``rho_actors-tasks``, started on the first such call): an open task is a coroutine
waiting there, not a thread, so a thousand of them hold one thread. It runs the way a
call of :meth:`rho_actors.Loop.arun_turn` runs on the caller's loop
(:class:`rho_actors.loop.inline.InlineCall`): its deadline a timer on this loop (a
``timeout`` result, then the task cancelled), its cancel ``asyncio.Task.cancel``, a
crash its ``raised``/``exited`` result.

What a call's end sets off (its task's record written with ``fdatasync``, the
registry's watchers told) is handed to a thread of its own (:class:`Answering`), one end after another in the
order they came (a call's answer before what it returns late), so the loop never waits
on a disk or on the host's code. A tool that blocks the loop itself (a synchronous
sleep inside ``async def``) holds up every other background ``async`` call until it
returns (such a tool belongs in a plain ``def``, its own thread, or ``process``
isolation), but not their deadlines: each call's deadline is also kept off the loop, by
the system's timer thread (:meth:`Answering.arm`, :data:`GRACE_S` after it), which ends
the task ``timeout`` if the loop has not answered it by then.

:meth:`TaskLoop.stop` (the system's stop, after every open task was cancelled) gives the
cancelled coroutines ``timeout_s`` to end, then stops the loop and its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import pykka
from loguru import logger

from rho_actors.isolation.call import Answer, CallSpec
from rho_actors.results import CANCELLED
from rho_actors.tool import ToolResult

if TYPE_CHECKING:
    from rho_actors.otp.timers import Timer, Timers

__all__ = ["GRACE_S", "THREAD_NAME", "Answering", "TaskLoop"]

THREAD_NAME: Final = "rho_actors-tasks"
"""The name of the thread running the tasks' event loop."""
GRACE_S: Final = 1.0
"""How long past a call's deadline, in seconds, the timer thread waits for the event loop
to answer it before it ends the task ``timeout`` itself (the loop being blocked)."""


class TaskLoop:
    """One system's event loop for background ``async`` calls (see the module doc); safe
    from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aio: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ends: concurrent.futures.ThreadPoolExecutor | None = None
        self.stopped = False

    def get(self) -> asyncio.AbstractEventLoop:
        """The running event loop, started (with its thread) on the first call. Raises
        ``pykka.ActorDeadError`` once :meth:`stop` was called: the call does not start."""
        with self._lock:
            if self.stopped:
                raise pykka.ActorDeadError("the system is stopping")
            if self._aio is None:
                aio = asyncio.new_event_loop()
                ready = threading.Event()
                aio.call_soon(ready.set)
                thread = threading.Thread(target=self._serve, args=(aio,), name=THREAD_NAME, daemon=True)
                thread.start()
                ready.wait()
                self._aio, self._thread = aio, thread
                self._ends = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{THREAD_NAME}-end")
            return self._aio

    def answering(self, settle: Callable[[ToolResult], None]) -> Answering:
        """The reply of a background call run on this loop: ``settle`` (the registry's,
        for its task) run on the loop's recording thread. See :class:`Answering`."""
        return Answering(self, settle)

    def later(self, job: Callable[[], object]) -> None:
        """Run ``job()`` on the loop's recording thread after what is queued there (at once
        here when the loop stopped or never started); what it raises is logged."""
        ends = self._ends
        try:
            if ends is None:
                raise RuntimeError("not started")
            ends.submit(_logged, job)
        except RuntimeError:  # stopped: here (a task's late answer is dropped by the registry)
            _logged(job)

    def stop(self, timeout_s: float) -> None:
        """No call starts from now on; the coroutines still running (cancelled by now) get
        ``timeout_s`` seconds to end, then the loop stops and its thread ends. Idempotent."""
        with self._lock:
            self.stopped = True
            aio, thread, ends = self._aio, self._thread, self._ends
        if aio is None or thread is None or not thread.is_alive():
            return
        try:
            aio.call_soon_threadsafe(lambda: aio.create_task(_drain(aio, timeout_s)))
        except RuntimeError:  # closed already
            return
        if thread is not threading.current_thread():
            thread.join(timeout_s + 5.0)
        if ends is not None:  # what is queued there is late by now (each task ended cancelled): quick
            ends.shutdown(wait=not threading.current_thread().name.startswith(f"{THREAD_NAME}-end"))

    @staticmethod
    def _serve(aio: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(aio)
        try:
            aio.run_forever()
        finally:
            try:
                aio.run_until_complete(aio.shutdown_asyncgens())
            except Exception:
                logger.exception("the tasks' event loop could not close its async generators")
            aio.close()


async def _drain(aio: asyncio.AbstractEventLoop, timeout_s: float) -> None:
    """Wait (at most ``timeout_s`` s) for the loop's other tasks to end, then stop it."""
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks(aio) if t is not me]
    if others:
        _, pending = await asyncio.wait(others, timeout=timeout_s)
        if pending:
            logger.warning("{} background async calls still running at the stop are abandoned", len(pending))
    aio.stop()


def _logged(job: Callable[[], object]) -> None:
    try:
        job()
    except Exception:
        logger.exception("recording the end of a background call failed")


class Answering:
    """A background call's reply (its :class:`~rho_actors.isolation.call.CallSpec`
    ``reply``): each result the call gives is handed to the loop's recording thread for
    ``settle``, in order. Once the call started, :meth:`arm` keeps its deadline off the
    loop too."""

    __slots__ = ("_answered", "_guard", "_loop", "_settle")

    def __init__(self, loop: TaskLoop, settle: Callable[[ToolResult], None]) -> None:
        self._loop, self._settle = loop, settle
        self._guard: Timer | None = None
        self._answered = False

    def __call__(self, result: ToolResult) -> None:
        self._answered = True
        guard = self._guard
        if guard is not None:
            guard.cancel()
        self._loop.later(lambda: self._settle(result))

    def arm(self, timers: Timers, spec: CallSpec) -> None:
        """Answer ``spec`` ``timeout`` from the timer thread :data:`GRACE_S` after its
        deadline unless the loop answered it first (its token then set: the coroutine is
        cancelled once the loop runs again)."""
        if not self._answered:
            self._guard = timers.call_at(spec.deadline + GRACE_S, lambda: self._loop.later(lambda: self._overdue(spec)))

    def _overdue(self, spec: CallSpec) -> None:
        if not self._answered:
            self._settle(Answer(spec).timeout(CANCELLED))
            spec.cancel.cancel("timeout")
