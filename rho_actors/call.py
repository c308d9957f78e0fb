"""The CallActor: one fresh, temporary actor per dispatched call (DESIGN §4 step 3).

A CallActor runs its tool's ``run(args, ctx)`` once, in its own thread (``thread``
isolation), turns whatever happens into exactly one :class:`ToolResult`, hands it to
its ``reply`` callback and stops. Nothing the tool does escapes: an ``Exception`` is a
``raised`` result, a ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``...) an
``exited`` result, so pykka never sees a ``BaseException`` (which would stop every
actor in the process).

The deadline is kept by the LoopActor, not here: at the deadline the loop answers with a
``timeout`` result and calls :meth:`CancelToken.cancel`; the thread is abandoned and its
late result discarded. An ``async def run`` is driven by a private event loop and
really cancelled (``asyncio.Task.cancel``) at its deadline or on cancellation. In
``process`` isolation the CallActor hands the call to a worker process
(:class:`rho_actors.sandbox.WorkerPool`), which is killed at the deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from loguru import logger

from rho_actors.actor import Actor
from rho_actors.encoding import describe_exception, encode_output
from rho_actors.tool import Details, Error, ErrorKind, Image, Ok, ToolResult

__all__ = [
    "AbandonedThreads",
    "CallActor",
    "CallSpec",
    "CancelToken",
    "error_result",
    "result_from_exception",
    "result_from_return",
]


class CancelToken:
    """A call's cancellation signal, in ``ctx["cancel"]``: poll :attr:`cancelled`,
    block on :meth:`wait`, or register a callback. Set once, never cleared.

    Example (a cooperative tool)::

        def run(args, ctx):
            for chunk in work():
                if ctx["cancel"].cancelled:
                    return Error("cancelled")
                ...
    """

    __slots__ = ("_callbacks", "_event", "_finished", "_lock", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._finished = False
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """Whether the call was cancelled (its deadline passed, or its loop stopped)."""
        return self._event.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until cancelled or ``timeout_s`` seconds pass; returns :attr:`cancelled`."""
        return self._event.wait(timeout_s)

    def cancel(self, reason: str = "cancelled") -> bool:
        """Set the signal (the first reason wins: ``"timeout"``, ``"stopping"``...) and
        run the callbacks in this thread. Returns whether the call was still running,
        i.e. whether its thread is now abandoned."""
        with self._lock:
            if self._event.is_set():
                return False
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
            running = not self._finished
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("cancel callback raised")
        return running

    def finish(self) -> bool:
        """Mark the call's thread as returned. Returns whether it had been abandoned."""
        with self._lock:
            self._finished = True
            return self._event.is_set()

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` on cancellation (at once if already cancelled)."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback()


class AbandonedThreads:
    """Counts thread calls cancelled while running (timed out, or their loop stopped):
    ``total`` ever, and ``running``, those whose thread has not returned yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.running = 0

    def abandoned(self) -> None:
        """Count a running call whose thread was given up on."""
        with self._lock:
            self.total += 1
            self.running += 1

    def returned(self) -> None:
        """Count an abandoned call's thread that has returned since."""
        with self._lock:
            self.running -= 1


@dataclass(frozen=True, slots=True)
class CallSpec:
    """Everything a CallActor needs: the tool, its decoded arguments, the ``ctx`` it
    gets, when it was dispatched and its ``deadline`` (``time.monotonic()`` instants,
    seconds) and ``reply``, called exactly once with the result, from the CallActor's
    thread. ``context``: a copy of the submitter's ``contextvars`` context the tool
    runs in (``thread`` isolation; ``None``: the CallActor's own)."""

    call_id: str
    name: str
    tool: Any
    args: dict[str, Any]
    ctx: Mapping[str, Any]
    dispatched: float
    deadline: float
    cancel: CancelToken
    max_output_chars: int
    reply: Callable[[ToolResult], None]
    abandoned: AbandonedThreads
    isolation: str = "thread"
    workers: Any = None  # rho_actors.workers.Workers, for "process" isolation
    context: contextvars.Context | None = None


def error_result(call_id: str, name: str, kind: ErrorKind, message: str, duration_ms: float = 0.0) -> ToolResult:
    """An error :class:`ToolResult` with ``message`` as the model's text."""
    return ToolResult(call_id, name, False, message, kind, None, (), duration_ms)


def result_from_exception(
    call_id: str, name: str, exc: BaseException, max_chars: int, duration_ms: float
) -> ToolResult:
    """A ``raised`` result for an ``Exception``, ``exited`` for any other ``BaseException``."""
    if isinstance(exc, Exception):
        kind, verb = ErrorKind.RAISED, "raised"
    else:
        kind, verb = ErrorKind.EXITED, "exited with"
    text = encode_output(f"tool {name!r} {verb} {describe_exception(exc)}", max_chars).text
    return error_result(call_id, name, kind, text, duration_ms)


def result_from_return(call_id: str, name: str, value: Any, max_chars: int, duration_ms: float) -> ToolResult:
    """The result for what ``run`` returned: ``Ok``/plain value/``Details``/``Image``
    parts are ok; ``Error(reason)`` is a ``raised`` error with ``reason`` as text."""
    ok = True
    if isinstance(value, Ok):
        value = value.output
    elif isinstance(value, Error):
        ok, value = False, value.reason
    details = None
    if isinstance(value, Details):
        value, details = value.output, value.details
    images: tuple[Image, ...] = ()
    if isinstance(value, Image):
        value, images = "", (value,)
    elif isinstance(value, list) and any(isinstance(v, Image) for v in value):
        images = tuple(v for v in value if isinstance(v, Image))
        value = "\n".join(
            v if isinstance(v, str) else encode_output(v, max_chars).text for v in value if not isinstance(v, Image)
        )
    text = encode_output(value, max_chars).text
    return ToolResult(call_id, name, ok, text, None if ok else ErrorKind.RAISED, details, images, duration_ms)


async def _drive(coro: Coroutine[Any, Any, Any], deadline: float, cancel: CancelToken) -> Any:
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()

    def cancel_task() -> None:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop has already closed
            pass

    cancel.add_callback(cancel_task)
    return await asyncio.wait_for(task, max(0.0, deadline - time.monotonic()))


def _call(spec: CallSpec) -> Any:
    """Run the tool (an ``async def run`` to its end, under :func:`_drive`)."""
    value = spec.tool.run(spec.args, spec.ctx)
    if inspect.iscoroutine(value):
        value = asyncio.run(_drive(value, spec.deadline, spec.cancel))
    return value


class CallActor(Actor):
    """Runs one call (the first :class:`CallSpec` told to it) in its own thread,
    replies once, then stops (restart type ``temporary``: never restarted; a crash is a
    result). It may be started ahead of its call, as a spare (see
    :class:`rho_actors.supervisor.Spares`), but never runs a second call.

    Its thread is a daemon thread, so an abandoned call cannot keep the process alive.
    """

    def on_receive(self, message: Any) -> None:
        if isinstance(message, CallSpec) and not hasattr(self, "spec"):
            self._run(message)
        else:
            logger.warning("CallActor ignored {!r}: it runs exactly one CallSpec", message)

    def _run(self, spec: CallSpec) -> None:
        self.spec = spec
        started = spec.dispatched
        try:
            if spec.isolation == "process":
                result = self._run_in_process(spec)
            else:
                value = spec.context.run(_call, spec) if spec.context is not None else _call(spec)
                result = result_from_return(
                    spec.call_id, spec.name, value, spec.max_output_chars, (time.monotonic() - started) * 1000
                )
        except BaseException as exc:
            result = self._failure(exc, started)
        if spec.cancel.finish() and spec.isolation == "thread":
            spec.abandoned.returned()
            logger.info("abandoned call {} of tool {} returned; its result is discarded", spec.call_id, spec.name)
        self._result = result
        self.stop()

    def _actor_loop(self) -> None:
        super()._actor_loop()
        # The reply goes last, once this actor has ended and been forgotten: the loop's
        # thread then takes the GIL from a thread that has nothing left to do.
        result: ToolResult | None = getattr(self, "_result", None)
        if result is not None:
            try:
                self.spec.reply(result)
            except BaseException:
                logger.exception("reply of call {} failed", self.spec.call_id)

    @staticmethod
    def _run_in_process(spec: CallSpec) -> ToolResult:
        """``process`` isolation: the call runs in a worker process, killed at the deadline."""
        try:
            pool = spec.workers.pool()
        except RuntimeError as err:
            return error_result(spec.call_id, spec.name, ErrorKind.CANCELLED, f"tool {spec.name!r} did not run: {err}")
        result: ToolResult = pool.run(
            spec.tool, spec.args, spec.ctx, spec.deadline, spec.max_output_chars, name=spec.name,
            started=spec.dispatched, cancel=spec.cancel,
        )
        return result

    def _failure(self, exc: BaseException, started: float) -> ToolResult:
        spec = self.spec
        duration_ms = (time.monotonic() - started) * 1000
        try:
            if isinstance(exc, (asyncio.CancelledError, TimeoutError)) and spec.cancel.cancelled:
                return error_result(
                    spec.call_id, spec.name, ErrorKind.CANCELLED,
                    f"tool {spec.name!r} was cancelled ({spec.cancel.reason})", duration_ms,
                )
            if isinstance(exc, TimeoutError) and time.monotonic() >= spec.deadline:
                return error_result(
                    spec.call_id, spec.name, ErrorKind.TIMEOUT,
                    f"tool {spec.name!r} timed out: its deadline passed", duration_ms,
                )
            logger.opt(exception=exc).debug("tool {} failed in call {}", spec.name, spec.call_id)
            return result_from_exception(spec.call_id, spec.name, exc, spec.max_output_chars, duration_ms)
        except BaseException:
            return error_result(spec.call_id, spec.name, ErrorKind.RAISED, f"tool {spec.name!r} raised", duration_ms)


