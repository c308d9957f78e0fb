"""A call of a trusted ``async`` tool run on the host's own event loop (DESIGN §4).

When a turn is awaited with :meth:`rho_actors.Loop.arun_turn`, a call whose tool is
trusted, in ``thread`` isolation and ``async`` runs as a task on the awaiting event
loop, as the host's own coroutines do: no thread is woken, no thread crossed. A
background call of such a tool runs the same way on the system's tasks event loop
(:mod:`rho_actors.tasks.event_loop`), started from another thread: its first step is
then that loop's to run.

**Its first step runs at once** (as Python 3.12's eager tasks do; this works on 3.11
too): the call's task is made, and the tool's coroutine is driven to its first
suspension in the thread that starts the call, which is the awaiting host task's own
step under ``arun_turn`` (or an event-loop callback when an exclusive turn's next call
is started from a call thread), with the call's task swapped in as the current task
while it runs (``asyncio.current_task()`` is the call's task in every step of the tool,
so ``asyncio.timeout()``, a ``TaskGroup`` and ``current_task().cancel()`` in the first
step act on the call, never on the host's task). Then:

- **A tool that returns without suspending** (a no-op, a cached answer) has its result
  settled in that first step: no deadline timer is armed, no event-loop iteration is
  waited for, and ``arun_turn`` returns without suspending (so a cancellation of the
  host's task requested meanwhile is seen at the host's next ``await``, as for any
  coroutine that does not suspend). Its task's own first step, already scheduled, finds
  the coroutine ended and ends at once, off the host's path.
- **A tool that suspends** is continued by its task (:class:`_Rest`: the task's first
  step hands the task what the coroutine yielded, then every step goes to the
  coroutine), with its deadline timer armed then, counted from its dispatch as always.

What holds for every call holds here too:

- **Its deadline is a deadline**: a timer on the same event loop answers ``timeout``
  and then cancels the task (``ctx["cancel"]`` is set, ``asyncio.Task.cancel``),
  without waiting for the task to end; a result that comes after it is ``late``, and one
  that comes past the deadline before the timer could run (a first step or a step that
  overran it) is a ``timeout`` all the same (the result follows as ``late``).
  A tool that blocks the event loop (a sync sleep inside ``async def``) blocks the host's
  loop as it would in the host's own code: its result, once it returns past its
  deadline, is still a ``timeout``.
- **A crash is a result**, in the first step as in any other: an ``Exception`` is a
  ``raised`` result, a ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``, a
  ``CancelledError`` the tool raises itself) an ``exited`` one (``cancelled`` or
  ``timeout`` once its token is set); nothing the tool raises reaches the host's task
  or event loop.
- **Cancelling works the same**: the host cancelling the turn (or its awaiting task),
  or the loop stopping, sets ``ctx["cancel"]`` and cancels the task (from any thread);
  a cancel that comes before the task's first step reaches the coroutine where it
  suspended (the future it waits on is cancelled, as a task's would be); one that comes
  before the call's first step runs (its start queued on another thread's loop) answers
  it ``cancelled`` without running the tool, late for the canceller, so a place held
  until its answer (an exclusive tool's) is given back.
- It runs in a copy of the submitter's ``contextvars`` context, its first step and every
  later one in the same copy (what the tool sets stays its own), with its span current.
- Its result is settled in the call's :class:`rho_actors.isolation.call.Answer`, as a
  call thread's is: the coroutine's end and the deadline timer, both on the event loop,
  race for it, and a result settled at or past the deadline reads ``timeout``.

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
from asyncio.events import _get_running_loop
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Callable, Coroutine, Generator
from types import CoroutineType
from typing import Any

import pykka

from rho_actors.declarations.toolset import ToolEntry
from rho_actors.isolation.call import Answer, CallSpec, call_failure
from rho_actors.results import CANCELLED, failure, result_from_return
from rho_actors.telemetry import TRACEPARENT, attached
from rho_actors.tool import ToolResult

__all__ = ["InlineCall", "on_loop", "runs_inline"]

_NO_SPAN = contextlib.nullcontext()
_UNSTARTED = object()  # _Rest.pending: the coroutine's first step has not run yet
_NOTHING = object()  # _Rest.pending: nothing left over from the first step to hand to the task
_ENDED = object()  # _Rest.pending: the coroutine ended in its first step (or never ran)
# asyncio's table of each loop's current task, where it keeps one (3.11, 3.12): read without current_task's frame
_CURRENT_TASKS: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = getattr(asyncio.tasks, "_current_tasks",
                                                                                    None)


def on_loop(aio: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``aio`` now."""
    try:
        return asyncio.get_running_loop() is aio
    except RuntimeError:
        return False


class InlineCall:
    """One call running as a task on ``aio`` (a :class:`rho_actors.isolation.RunningCall`)."""

    __slots__ = ("_aio", "_answer", "_on_cancel", "_spec", "_task", "_timer")

    def __init__(self, aio: asyncio.AbstractEventLoop, spec: CallSpec) -> None:
        self._aio = aio
        self._spec = spec
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._answer = Answer(spec)  # settled on ``aio`` only: by the coroutine's end or the deadline, first wins
        self._on_cancel: Callable[[], None] | None = None  # its callback on the token, until the call ends

    @classmethod
    def start(cls, aio: asyncio.AbstractEventLoop, spec: CallSpec, stopping: bool = False) -> InlineCall:
        """Start ``spec`` as a task on ``aio`` (from any thread; at once, its first step
        included, when this thread runs ``aio``). Raises ``pykka.ActorDeadError`` when
        the system is ``stopping`` or ``aio`` is closed: the call does not start."""
        if stopping:
            raise pykka.ActorDeadError("the system is stopping")
        if aio.is_closed():
            raise pykka.ActorDeadError("the event loop awaiting the turn is closed")
        call = cls(aio, spec)
        if _get_running_loop() is aio:  # on_loop(aio), inline: on every call
            call._begin()
        else:
            try:
                aio.call_soon_threadsafe(call._begin)
            except RuntimeError as exc:  # closed just now
                raise pykka.ActorDeadError(f"the event loop awaiting the turn is closed ({exc})") from None
        return call

    def _begin(self) -> None:
        """On ``aio``: make the task, run the coroutine's first step as that task, and arm
        the deadline if it suspended."""
        spec = self._spec
        if spec.cancel.cancelled:  # cancelled before it began: its result is given already, this one is late
            self._never_ran()
            return
        aio = self._aio
        context = spec.context if spec.context is not None else contextvars.Context()
        coro = self._main()
        rest = _Rest(coro)
        # its first step (_Rest.send) is scheduled; made as create_task makes it when the loop has no task
        # factory (a host's factory, an eager one included, is used when it has one)
        task: asyncio.Task[None] = (asyncio.Task(rest, loop=aio, context=context)
                                    if getattr(aio, "_task_factory", True) is None
                                    else aio.create_task(rest, context=context))
        self._task = task
        if rest.pending is _UNSTARTED:  # else an eager task factory ran the first step in create_task
            if spec.cancel.cancelled:  # by another thread meanwhile: the tool never runs, its task ends at once
                coro.close()
                rest.pending = _ENDED
                self._never_ran()
                return
            rest.pending = _ENDED  # kept if the first step raises (a bug: nothing is left to run)
            rest.pending = _first_step(aio, task, context, coro)
        if not self._answer.settled:  # suspended: its task goes on, cancellable, the deadline kept from now on
            # the token's hook only now: a call settled in its first step has no task left to cancel (a cancel
            # that came during the step runs the hook at once, and the task's first step takes it)
            self._on_cancel = hook = self._cancel_task  # the very object, forgotten at the end: no cycle kept
            spec.cancel.add_inline_callback(hook)
            self._timer = aio.call_later(max(0.0, spec.deadline - time.monotonic()), self._deadline)

    async def _main(self) -> None:
        spec = self._spec
        try:
            # telemetry off: no span to make current, and no generator entered for none
            with attached(spec.ctx, spec.dispatched, spec.name) if TRACEPARENT in spec.ctx else _NO_SPAN:
                value = spec.tool.run(spec.args, spec.ctx)
                if type(value) is CoroutineType:  # inspect.iscoroutine without its frame (no subclass can be made)
                    value = await value
            result = result_from_return(
                spec.call_id, spec.name, value, spec.max_output_chars, (time.monotonic() - spec.dispatched) * 1000
            )
        except BaseException as exc:  # CancelledError, SystemExit and KeyboardInterrupt too: a result
            result = self._failure(exc)
        spec.cancel.finish()
        hook, self._on_cancel = self._on_cancel, None
        if hook is not None:
            spec.cancel.remove_callback(hook)
        if self._answer.settle(result) and self._timer is not None:  # the answer: its deadline is not needed
            self._timer.cancel()

    def _never_ran(self) -> None:
        """The call was cancelled before its first step: it is answered all the same (its
        ``cancelled`` result, late for whoever cancelled it), so what holds a place for
        it until its answer (the governor's) lets go."""
        spec = self._spec
        spec.cancel.finish()
        hook, self._on_cancel = self._on_cancel, None
        if hook is not None:
            spec.cancel.remove_callback(hook)
        self._answer.settle(call_failure(spec, asyncio.CancelledError(), 0.0))

    def _deadline(self) -> None:
        """On ``aio``, at the deadline: answer ``timeout``, then cancel the task."""
        self._timer = None  # fired: its handle holds this call no longer (no cycle left to collect)
        if not self._answer.claim():
            return
        self._answer.deliver(self._answer.timeout(CANCELLED))
        self._spec.cancel.cancel("timeout")  # what the task returns now is late

    def _cancel_task(self) -> None:
        """The call's token was set (any thread): cancel the task on its loop."""
        task = self._task
        if task is None or task.done():
            return
        if on_loop(self._aio):
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


def _first_step(
    aio: asyncio.AbstractEventLoop, task: asyncio.Task[None], context: contextvars.Context,
    coro: Coroutine[Any, Any, None],
) -> Any:
    """Run ``coro``'s first step now, in ``context``, with ``task`` the current task of
    ``aio`` meanwhile (the one running before, the host's task or none, is current again
    after). Returns what the coroutine yielded as it suspended, or :data:`_ENDED` when
    it ended."""
    host = asyncio.current_task(aio) if _CURRENT_TASKS is None else _CURRENT_TASKS.get(aio)
    if host is not None:
        _leave_task(aio, host)
    _enter_task(aio, task)
    try:
        return context.run(coro.send, None)
    except StopIteration:
        return _ENDED
    finally:
        _leave_task(aio, task)
        if host is not None:
            _enter_task(aio, host)


class _Rest(Coroutine[Any, Any, None]):
    """What a call's task drives: the call's coroutine, whose first step ran before the
    task's (:meth:`InlineCall._begin`). ``pending``: what the coroutine yielded when it
    suspended there (a future it waits on, or ``None`` for a bare yield), handed to the
    task by the task's first step; :data:`_NOTHING` once handed; :data:`_ENDED` when
    the coroutine ended in its first step (the task's first step then ends the task);
    :data:`_UNSTARTED` until the first step ran (an eager task factory runs it as the
    task's own). Every later step is the coroutine's own ``send``/``throw``."""

    __slots__ = ("_coro", "pending")

    def __init__(self, coro: Coroutine[Any, Any, None]) -> None:
        self._coro = coro
        self.pending: Any = _UNSTARTED

    def send(self, value: Any) -> Any:
        pending = self.pending
        if pending is _NOTHING or pending is _UNSTARTED:
            self.pending = _NOTHING
            return self._coro.send(value)
        if pending is _ENDED:
            raise StopIteration
        self.pending = _NOTHING
        return pending  # the task waits on it, as if the coroutine had yielded it in this step

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        exc = typ if val is None and tb is None else typ(val) if tb is None else typ(val).with_traceback(tb)
        pending = self.pending
        if pending is _ENDED:  # nothing left to cancel
            raise StopIteration
        self.pending = _NOTHING
        # cancelled before the task's first step: as a task cancels the future it waits on
        if isinstance(exc, asyncio.CancelledError) and asyncio.isfuture(pending) and pending.cancel(*exc.args[:1]):
            return pending
        return self._coro.throw(exc)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:
        yield from self

    def __iter__(self) -> _Rest:
        return self

    def __next__(self) -> Any:
        return self.send(None)


def runs_inline(entry: ToolEntry) -> bool:
    """Whether a call of ``entry`` awaited on an event loop runs on that loop: a trusted
    ``thread`` tool whose ``run`` is ``async``."""
    if entry.isolation != "thread" or entry.untrusted:
        return False
    async_run = entry.async_run
    if async_run is None:  # asked once per registration, not on every call
        async_run = inspect.iscoroutinefunction(entry.tool.run)
        object.__setattr__(entry, "async_run", async_run)
    return async_run
