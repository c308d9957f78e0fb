"""A call of a trusted ``async`` tool run on the host's own event loop (DESIGN §4).

When a turn is awaited with :meth:`rho_actors.Loop.arun_turn`, a call whose tool is
trusted, in ``thread`` isolation and ``async`` runs as a task on the awaiting event
loop, as the host's own coroutines do: no thread is woken, no thread crossed. What
holds for every call holds here too:

- **Its deadline is a deadline**: a timer on the same event loop answers ``timeout``
  and then cancels the task (``ctx["cancel"]`` is set, ``asyncio.Task.cancel``),
  without waiting for the task to end; a result that comes after it is ``late``, and one
  that comes past the deadline before the timer could run is a ``timeout`` all the same
  (the result follows as ``late``).
  A tool that blocks the event loop (a sync sleep inside ``async def``) blocks the host's
  loop as it would in the host's own code: its result, once it returns past its
  deadline, is still a ``timeout``.
- **A crash is a result**: an ``Exception`` is a ``raised`` result, a
  ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``) an ``exited`` one; nothing
  the tool raises reaches the host's event loop.
- **Cancelling works the same**: the host cancelling the turn, or the loop stopping,
  sets ``ctx["cancel"]`` and cancels the task (from any thread).
- It runs in a copy of the submitter's ``contextvars`` context, with its span current.
- Its result is settled in the call's :class:`rho_actors.isolation.call.Answer`, as a
  CallActor's is: the task's end and the deadline timer, both on the event loop, race
  for it, and a result settled at or past the deadline reads ``timeout``.

A task that swallows its cancellation goes on running on the host's loop after its
``timeout`` (as an abandoned thread goes on in ``thread`` isolation; it holds no
thread, so it is not counted among abandoned threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import time

import pykka

from rho_actors.isolation.call import Answer, CallSpec, call_failure
from rho_actors.results import CANCELLED, failure, result_from_return
from rho_actors.telemetry import TRACEPARENT, attached
from rho_actors.tool import ToolResult

__all__ = ["InlineCall"]

_NO_SPAN = contextlib.nullcontext()


def _on(aio: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``aio`` now."""
    try:
        return asyncio.get_running_loop() is aio
    except RuntimeError:
        return False


class InlineCall:
    """One call running as a task on ``aio`` (a :class:`rho_actors.isolation.RunningCall`)."""

    __slots__ = ("_aio", "_answer", "_spec", "_task", "_timer")

    def __init__(self, aio: asyncio.AbstractEventLoop, spec: CallSpec) -> None:
        self._aio = aio
        self._spec = spec
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._answer = Answer(spec)  # settled on ``aio`` only: by the task's end or by the deadline, first one wins

    @classmethod
    def start(cls, aio: asyncio.AbstractEventLoop, spec: CallSpec, stopping: bool = False) -> InlineCall:
        """Start ``spec`` as a task on ``aio`` (from any thread; at once when this thread
        runs ``aio``). Raises ``pykka.ActorDeadError`` when the system is ``stopping`` or
        ``aio`` is closed: the call does not start."""
        if stopping:
            raise pykka.ActorDeadError("the system is stopping")
        if aio.is_closed():
            raise pykka.ActorDeadError("the event loop awaiting the turn is closed")
        call = cls(aio, spec)
        if _on(aio):
            call._begin()
        else:
            try:
                aio.call_soon_threadsafe(call._begin)
            except RuntimeError as exc:  # closed just now
                raise pykka.ActorDeadError(f"the event loop awaiting the turn is closed ({exc})") from None
        return call

    def _begin(self) -> None:
        """On ``aio``: arm the deadline and start the task."""
        spec = self._spec
        if spec.cancel.cancelled:  # cancelled before it began: its result is given already
            spec.cancel.finish()
            return
        self._timer = self._aio.call_later(max(0.0, spec.deadline - time.monotonic()), self._deadline)
        context = spec.context if spec.context is not None else contextvars.Context()
        self._task = self._aio.create_task(self._main(), context=context)
        spec.cancel.add_callback(self._cancel_task)

    async def _main(self) -> None:
        spec = self._spec
        try:
            # telemetry off: no span to make current, and no generator entered for none
            with attached(spec.ctx, spec.dispatched, spec.name) if TRACEPARENT in spec.ctx else _NO_SPAN:
                value = spec.tool.run(spec.args, spec.ctx)
                if inspect.iscoroutine(value):
                    value = await value
            result = result_from_return(
                spec.call_id, spec.name, value, spec.max_output_chars, (time.monotonic() - spec.dispatched) * 1000
            )
        except BaseException as exc:  # CancelledError, SystemExit and KeyboardInterrupt too: a result
            result = self._failure(exc)
        spec.cancel.finish()
        if self._answer.settle(result) and self._timer is not None:  # the answer: its deadline is not needed
            self._timer.cancel()

    def _deadline(self) -> None:
        """On ``aio``, at the deadline: answer ``timeout``, then cancel the task."""
        if not self._answer.claim():
            return
        self._answer.deliver(self._answer.timeout(CANCELLED))
        self._spec.cancel.cancel("timeout")  # what the task returns now is late

    def _cancel_task(self) -> None:
        """The call's token was set (any thread): cancel the task on its loop."""
        task = self._task
        if task is None or task.done():
            return
        if _on(self._aio):
            task.cancel()
            return
        try:
            self._aio.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the event loop has closed: the task is gone with it
            pass

    def cancel(self, reason: str) -> None:
        """Signal the call to stop (``ctx["cancel"]`` set with ``reason``, the task
        cancelled); what it returns later is late."""
        self._spec.cancel.cancel(reason)

    def _failure(self, exc: BaseException) -> ToolResult:
        spec = self._spec
        duration_ms = (time.monotonic() - spec.dispatched) * 1000
        if isinstance(exc, MemoryError):
            return failure("memory_thread", spec.call_id, spec.name, duration_ms)
        return call_failure(spec, exc, duration_ms)
