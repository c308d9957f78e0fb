"""The CallActor: one fresh, temporary actor per dispatched call (DESIGN §4 step 3).

An isolation (:mod:`rho_actors.isolation`) tells a CallActor one :class:`RunCall`: the
call's :class:`CallSpec` and the runner that executes it in the CallActor's thread
(:func:`run_here` for ``thread`` isolation; handing the call to a worker process and
waiting for it for ``process`` isolation). The CallActor turns whatever happens into
exactly one :class:`ToolResult`, hands it to the spec's ``reply`` callback and stops.
Nothing the tool does escapes: an ``Exception`` is a ``raised`` result, a
``BaseException`` (``SystemExit``, ``KeyboardInterrupt``...) an ``exited`` result, so
pykka never sees a ``BaseException`` (which would stop every actor in the process).

The call's result goes through its :class:`Answer`, the call's settle-once slot, which
decides by the deadline (DESIGN §5 "A deadline is a deadline"): whoever settles first
(this actor's thread with the tool's result, or the isolation's deadline timer) gives
the call its answer, and a result settled at or past the deadline is the ``timeout``
result, whatever it says. The deadline timer is the isolation's (``thread`` isolation
arms one; a worker pool or Ray task keeps its own deadline). An ``async def run`` is
driven by a private event loop and really cancelled (``asyncio.Task.cancel``) at its
deadline or on cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import CoroutineType
from typing import Any, Protocol, TypeVar

from loguru import logger

from rho_actors.cancel import CancelToken
from rho_actors.otp.actor import Actor
from rho_actors.otp.threads import ThreadPool
from rho_actors.otp.timers import Timer
from rho_actors.results import (
    CANCELLED,
    DISCARDED,
    failure,
    result_from_exception,
    result_from_return,
)
from rho_actors.sandbox import Waiter
from rho_actors.telemetry import TRACEPARENT, attached
from rho_actors.tool import ErrorKind, ToolResult

__all__ = [
    "AT_DEADLINE", "Answer", "CallActor", "CallSpec", "RunCall", "SettleOnce", "call_failure", "drive", "in_span",
    "run_here",
]

AT_DEADLINE = frozenset({ErrorKind.TIMEOUT, ErrorKind.MEMORY, ErrorKind.UNAVAILABLE})
"""Results a deadline may give itself, kept when settled at the deadline: a worker pool's
``timeout``, ``memory`` when the bound it hit is why the call ran out of time, and
``unavailable`` (the call never started: nothing ran to be discarded, and the result says
why, e.g. Ray still connecting at the deadline)."""


_R = TypeVar("_R")

LATE_LOCK = threading.Lock()  # every Answer's (and a thread call's), taken only to make its list of late results


class Places(Protocol):
    """The governor's places a ``thread`` call holds until its answer (what
    :class:`~rho_actors.governor.governor.ThreadPlaces` is): ``gov`` (its ``lock``,
    ``waiting``, ``_ready``, ``launch`` and the session ``gates``' ``orphans``), the
    ``gates`` taken, and :meth:`give_back`."""

    gov: Any
    gates: tuple[Any, ...]

    def give_back(self, spec: CallSpec) -> list[Any] | None:
        """Give back the places ``spec`` holds, once; the calls that took them, to launch."""


@dataclass(slots=True)
class CallSpec:
    """Everything a CallActor needs (read-only once built; not ``frozen`` only because a
    frozen dataclass costs microseconds to build, on every call): the tool, its decoded
    arguments, the ``ctx`` it gets, when it was dispatched and its ``deadline``
    (``time.monotonic()`` instants, seconds) and ``reply``, called with the call's answer
    first (once; see :class:`Answer`) and then with any result that came after it, each
    from the thread that settled it (the CallActor's, or a deadline's). ``context``: the
    ``contextvars`` context the CallActor runs the call in (a copy of the submitter's;
    ``None``: the empty one its pooled thread starts each job in); a worker process does
    not get it. ``on_start``: called in a call thread of ``thread`` isolation just before
    the tool runs (the host's bookkeeping of a call it started: :meth:`Loop.arun_turn`);
    every other isolation leaves it alone. ``waiter``: the thread that starts the call
    will wait for it alone (:meth:`Loop.run_turn` of a one-call turn): an isolation may
    leave the call's reply for that thread to read (:class:`~rho_actors.sandbox.Waiter`;
    ``process`` does, for a call written from that thread); others ignore it.
    ``places``: the governor's places a ``thread`` call holds until its answer (set by
    the governor as it starts the call: :class:`Places`),
    given back by the thread that answers it, before the reply (what serves ``thread``
    calls must: :meth:`Places.give_back`), or by the governor when it did not start."""

    call_id: str
    name: str
    tool: Any
    args: dict[str, Any]
    ctx: Mapping[str, Any]
    dispatched: float
    deadline: float
    timeout_ms: int
    cancel: CancelToken
    max_output_chars: int
    reply: Callable[[ToolResult], None]
    context: contextvars.Context | None = None
    on_start: Callable[[], None] | None = None
    waiter: Waiter | None = None
    places: Places | None = None


class SettleOnce:
    """The settle-once answer's shared part (:class:`Answer`, and a ``thread`` call's own
    answer in :mod:`rho_actors.isolation.thread`): a claim is one atomic ``list.pop``
    (safe from any thread); the claimer hands the call's answer to ``spec.reply``
    (:meth:`deliver`); every later result is handed on after it, from the thread that has
    it (``late``). The subclass keeps ``spec``, ``_claim`` (``[None]`` while free),
    ``_late`` (``None`` until the first late result) and ``_delivered``."""

    __slots__ = ()

    spec: CallSpec | None  # kept while a claim may still deliver
    _claim: list[None]
    _late: list[ToolResult] | None
    _delivered: bool

    def claim(self) -> bool:
        """Take the answer (its result is then the caller's to :meth:`deliver`); returns
        whether it was free."""
        try:
            self._claim.pop()
        except IndexError:
            return False
        return True

    def timeout(self, consequence: str = CANCELLED) -> ToolResult:
        """The call's ``timeout`` result, its duration counted until now."""
        spec = self.spec
        assert spec is not None  # read before it is let go (a claim keeps it)
        return failure("timeout", spec.call_id, spec.name, (time.monotonic() - spec.dispatched) * 1000,
                       timeout_ms=spec.timeout_ms, consequence=consequence)

    def deliver(self, result: ToolResult) -> None:
        """Hand the answer of a :meth:`claim` to ``spec.reply``, then any late result
        that came meanwhile. Raises what ``reply`` raises (the late ones are handed on)."""
        spec = self.spec
        assert spec is not None  # a claim keeps it
        try:
            spec.reply(result)
        finally:
            self._delivered = True  # type: ignore[misc]  # a subclass's slot (two slotted bases cannot share)
            if self._late:  # else the usual case; one handed on later sees ``_delivered`` and drains it
                self._drain()

    def _hand_late(self, result: ToolResult) -> None:
        late = self._late
        if late is None:
            with LATE_LOCK:  # two late results from two threads: one list
                late = self._late
                if late is None:
                    late = self._late = []  # type: ignore[misc]  # a subclass's slot, as above
        late.append(result)
        if self._delivered:  # else the delivering thread drains it (it reads the flag after its reply)
            self._drain()

    def _drain(self) -> None:
        late, spec = self._late, self.spec
        assert late is not None and spec is not None  # late results come after a claim, which keeps spec
        while True:
            try:
                result = late.pop(0)
            except IndexError:
                return
            try:
                spec.reply(result)
            except Exception:
                logger.exception("reply of a late result of call {} failed", spec.call_id)


class Answer(SettleOnce):
    """A call's settle-once slot: the first result settled is the call's answer, handed
    to ``spec.reply``; every later one is handed to it too, after the first (the loop
    reports it ``late``). The deadline decides: a result settled at or past
    ``spec.deadline`` is replaced by the ``timeout`` result (the result kept, late),
    unless it is a ``timeout``, ``memory`` or ``unavailable`` error itself (see
    :data:`AT_DEADLINE`), whichever thread settles it.
    A deadline timer takes the slot first (:meth:`claim`) and delivers the timeout after it
    (:meth:`deliver`); a result settled in between waits for that delivery.

    No lock and no event: a claim is one atomic ``list.pop`` (safe from any thread).
    ``timer``: the deadline timer an isolation armed, cancelled once a result wins."""

    __slots__ = ("_claim", "_delivered", "_late", "spec", "timer")

    def __init__(self, spec: CallSpec) -> None:
        self.spec: CallSpec = spec
        self.timer: Timer | None = None
        self._claim: list[None] = [None]
        self._late: list[ToolResult] | None = None  # made by the first late result (most calls have none)
        self._delivered = False

    @property
    def settled(self) -> bool:
        """Whether the slot is taken (its answer may still be on its way)."""
        return not self._claim

    def settle(self, result: ToolResult) -> bool:
        """Settle the call with ``result`` (from the thread that has it): returns whether
        it was the call's answer (possibly replaced by the ``timeout`` result, the
        deadline having passed); if not, it is handed on as late."""
        spec = self.spec
        late: ToolResult | None = None
        now = time.monotonic()
        if result.error_kind not in AT_DEADLINE and now >= spec.deadline:
            late, result = result, self.timeout(DISCARDED)
        timer = self.timer
        try:  # claim(), inline: on every call
            self._claim.pop()
            won = True
        except IndexError:
            won = False
        if not won:
            self._hand_late(late or result)
        else:
            if timer is not None:
                timer.cancel()
            try:  # deliver(result), inline: on every call
                spec.reply(result)
            finally:
                self._delivered = True
                if self._late:
                    self._drain()
            if late is not None:
                self._hand_late(late)
        service = timer._owner if timer is not None else None
        if service is not None:  # other calls' passed deadlines: this thread is running
            now = time.monotonic()
            heap = service._heap
            try:  # run_due's first look, inline (no frame when nothing is due, the usual case)
                due = bool(heap) and heap[0][0] <= now  # an empty heap raises nothing
            except IndexError:  # emptied just now by another thread
                due = False
            if due:
                service.run_due(now)
        return won


@dataclass(frozen=True, slots=True)
class RunCall:
    """Told to a CallActor by an isolation: run ``spec`` with ``runner`` (in the
    CallActor's thread), which returns the call's result or raises; settle it in
    ``answer`` (the isolation's, when it keeps a deadline timer on it; else a new one)."""

    spec: CallSpec
    runner: Callable[[CallSpec], ToolResult]
    answer: Answer | None = None


def run_here(spec: CallSpec) -> ToolResult:
    """Run the call's tool in this thread (an ``async def run`` on a private event loop,
    cancelled at the deadline or on cancellation) and make its result. Raises what the
    tool raises."""
    value = spec.tool.run(spec.args, spec.ctx)
    if type(value) is CoroutineType:  # inspect.iscoroutine without its frame (a subclass cannot be made)
        value = asyncio.run(drive(value, spec.deadline, spec.cancel))
    return result_from_return(
        spec.call_id, spec.name, value, spec.max_output_chars, (time.monotonic() - spec.dispatched) * 1000
    )


async def drive(coro: Coroutine[Any, Any, Any], deadline: float, cancel: CancelToken) -> Any:
    """Run ``coro`` as a task of this event loop until ``deadline``, cancelled when ``cancel`` is set."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()

    def cancel_task() -> None:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop has already closed
            pass

    cancel.add_inline_callback(cancel_task)
    try:
        return await asyncio.wait_for(task, max(0.0, deadline - time.monotonic()))
    finally:  # a token that outlives the call (a host's, given to many) keeps nothing of it, nor its loop
        cancel.remove_callback(cancel_task)


def _attached(message: RunCall) -> ToolResult:
    """Run the call with its span current (in the context this runs in: a copy of the
    submitter's, whose own trace context it replaces for the tool)."""
    spec = message.spec
    with attached(spec.ctx, spec.dispatched, spec.name):
        return message.runner(spec)


class CallActor(Actor):
    """Runs one call (the first :class:`CallSpec` told to it) in its own thread,
    replies once, then stops (restart type ``temporary``: never restarted; a crash is a
    result); it never runs a second call. Its thread is borrowed from ``thread_pool``
    when given (see :class:`rho_actors.otp.threads.ThreadPool`), else its own.

    Its thread is a daemon thread, so an abandoned call cannot keep the process alive.
    """

    takes_over_thread = True  # the next call of an exclusive turn runs on the thread of the one before

    def __init__(self, thread_pool: ThreadPool | None = None) -> None:
        super().__init__()
        self.thread_pool = thread_pool

    def on_receive(self, message: Any) -> None:
        if isinstance(message, RunCall) and not hasattr(self, "spec"):
            self._run(message)
        else:
            logger.warning("CallActor ignored {!r}: it runs exactly one RunCall", message)

    def _run(self, message: RunCall) -> None:
        self.spec = spec = message.spec
        self._answer = message.answer if message.answer is not None else Answer(spec)
        try:
            result = spec.context.run(_attached, message) if spec.context is not None else _attached(message)
        except BaseException as exc:
            result = self._failure(exc, spec.dispatched)
        self._result = result
        self.stop()

    def on_exit(self, reason: object) -> None:
        # The reply goes last, once this actor has ended and been forgotten: the loop's
        # thread then takes the GIL from a thread that has nothing left to do.
        # A call that the reply starts (the next of an exclusive turn) takes over this
        # thread once this hook returns, instead of waking another.
        result: ToolResult | None = getattr(self, "_result", None)
        if result is not None:
            try:
                with self.thread_pool.hand_over() if self.thread_pool is not None else contextlib.nullcontext():
                    self._answer.settle(result)
            except BaseException:
                logger.exception("reply of call {} failed", self.spec.call_id)

    def _failure(self, exc: BaseException, started: float) -> ToolResult:
        return call_failure(self.spec, exc, (time.monotonic() - started) * 1000)


def call_failure(spec: CallSpec, exc: BaseException, duration_ms: float) -> ToolResult:
    """The result of a call whose run raised ``exc`` after ``duration_ms`` milliseconds:
    ``cancelled`` (its token set, for another reason than its deadline), ``timeout`` (a
    ``CancelledError``/``TimeoutError`` at its deadline: the deadline's own result may
    still be on its way, and this one reads the same), else ``raised``/``exited``
    (:func:`rho_actors.results.result_from_exception`). Never raises."""
    try:
        cancelled = isinstance(exc, (asyncio.CancelledError, TimeoutError)) and spec.cancel.cancelled
        if cancelled and spec.cancel.reason != "timeout":
            return failure("cancelled", spec.call_id, spec.name, duration_ms, reason=spec.cancel.reason)
        if cancelled or (isinstance(exc, TimeoutError) and time.monotonic() >= spec.deadline):
            return failure(
                "timeout", spec.call_id, spec.name, duration_ms, timeout_ms=spec.timeout_ms, consequence=CANCELLED
            )
        return result_from_exception(spec.call_id, spec.name, exc, spec.max_output_chars, duration_ms)
    except BaseException:
        return failure("raised_opaque", spec.call_id, spec.name, duration_ms)


def run_on_call_thread(call: CallSpec, run: Callable[[CallSpec], ToolResult | None], ended: Callable[[], None],
                       threads: ThreadPool, answer: Answer) -> None:
    """A call thread's one job (DESIGN §4 step 3), shared by the isolations that run
    their calls on the system's call threads (``thread``, ``process``): ``run(call)``
    in the call's copy of the submitter's context with its span current, one result
    whatever it raises (:func:`call_failure`), ``ended()`` (the isolation counts its
    running calls), then ``answer`` settled in ``threads``' hand-over (the next call of
    an exclusive turn that it starts takes over this thread once this returns, instead
    of waking another). A ``run`` that returns ``None`` handed the call on (a process
    call written to its worker: its pool's reader counts it ended and answers it).
    Never raises (a failed reply is logged)."""
    context = call.context
    try:
        if TRACEPARENT in call.ctx:  # with the call's span current (telemetry off: no span, no frame for it)
            result = context.run(in_span, run, call) if context is not None else in_span(run, call)
        else:
            result = context.run(run, call) if context is not None else run(call)
    except BaseException as exc:  # nothing escapes into the pool: a result
        result = call_failure(call, exc, (time.monotonic() - call.dispatched) * 1000)
    if result is None:
        return
    ended()
    try:
        threads.run_handing_over(answer.settle, result)
    except BaseException:
        logger.exception("reply of call {} failed", call.call_id)


def in_span(run: Callable[[CallSpec], _R], call: CallSpec) -> _R:
    """``run(call)`` with the call's span current (``ctx["traceparent"]``)."""
    with attached(call.ctx, call.dispatched, call.name):
        return run(call)

