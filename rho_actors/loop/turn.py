"""One turn of a session as :class:`~rho_actors.loop.turns.Turns` keeps it (DESIGN §4):
its calls' slots, its state, where its results go, and the loop's withheld names."""

from __future__ import annotations

import contextvars
import operator
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rho_actors.cancel import CancelToken
from rho_actors.declarations.toolset import ToolEntry
from rho_actors.isolation import RunningCall
from rho_actors.otp.threads import host_code
from rho_actors.results import CANCELLED, error_result, failure
from rho_actors.sandbox import Waiter
from rho_actors.telemetry import CallSpan, TurnTelemetry
from rho_actors.tool import ToolCall, ToolResult

if TYPE_CHECKING:
    import asyncio

__all__ = ["Gate", "ResultSink", "Slot", "Turn", "Withheld", "when_cancelled", "when_failed", "result_of",
           "withheld_set"]


class ResultSink(Protocol):
    """Where a turn's results go, once, from the thread that settles its last call: a
    ``concurrent.futures.Future`` (running), or an asyncio host's landing."""

    def set_result(self, results: list[ToolResult], /) -> object: ...

# A sink may say ``runs_host_code = False`` (a class attribute): its ``set_result`` runs none
# of the host's code (it releases a lock, or schedules a callback on an event loop), so
# the settling thread sets it without :func:`~rho_actors.otp.threads.host_code` around it.


class Gate:
    """A turn's sink in front of ``sink`` that holds its results back until every
    :meth:`hold` of it is released: a turn whose calls wait for a decision gives its
    results only once their ``pending`` records are in the transcript (DESIGN §4
    "Approvals": nothing tells anyone a call waits before a decision can find it)."""

    __slots__ = ("_lock", "_results", "_sink", "_waits")
    runs_host_code = False  # it gives the results itself, around the host's code when its sink runs some

    def __init__(self, sink: ResultSink) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._waits = 0
        self._results: list[ToolResult] | None = None

    def hold(self) -> Callable[[], None]:
        """Hold the results back until the returned callable is called (once counts; from any thread)."""
        with self._lock:
            self._waits += 1
        released = [False]

        def release() -> None:
            with self._lock:
                if released[0]:
                    return
                released[0] = True
                self._waits -= 1
                results = self._results if self._waits == 0 else None
            if results is not None:
                self._give(results)

        return release

    def set_result(self, results: list[ToolResult]) -> None:
        """The turn's results: given now when nothing holds them back, else at the last release."""
        with self._lock:
            self._results = results
            now = self._waits == 0
        if now:
            self._give(results)

    def _give(self, results: list[ToolResult]) -> None:
        if not getattr(self._sink, "runs_host_code", True):
            self._sink.set_result(results)
            return
        with host_code():  # the future's done callbacks are the host's
            self._sink.set_result(results)


@dataclass(slots=True, init=False)
class Slot:
    index: int
    call: ToolCall
    entry: ToolEntry | None
    args: dict[str, Any] | None
    result: ToolResult | None
    started: float
    deadline: float  # once started: its deadline (time.monotonic() s)
    cancel: CancelToken | None
    running: RunningCall | None
    span: CallSpan | None  # its execute_tool span, while telemetry records it
    validated_s: float  # how long its validation took: counted against its deadline
    asked: bool  # the model asked to run it in the background (its run_in_background)

    def __init__(self, index: int, call: ToolCall) -> None:
        # the dataclass's own, less the cost of its ten defaults passed as parameters (one slot a call)
        self.index, self.call = index, call
        self.entry = self.args = self.result = self.cancel = self.running = self.span = None
        self.started = self.deadline = self.validated_s = 0.0
        self.asked = False


result_of = operator.attrgetter("result")  # a slot's result (in C: no frame per turn)


def when_cancelled(slot: Slot, now: float) -> ToolResult:
    """The result of a call without one whose turn the host cancelled at ``now``: a
    ``timeout`` once its deadline passed (a deadline is a deadline), else ``cancelled``."""
    if slot.started and now >= slot.deadline:
        assert slot.entry is not None
        return failure("timeout", slot.call.id, slot.call.name, (now - slot.started) * 1000,
                       timeout_ms=slot.entry.info.timeout_ms, consequence=CANCELLED)
    if slot.started:
        return failure("host_cancelled", slot.call.id, slot.call.name, (now - slot.started) * 1000)
    return failure("host_cancelled_before_start", slot.call.id, slot.call.name)


def when_failed(failed: ToolResult, slot: Slot, now: float) -> ToolResult:
    """The result of a call without one whose turn ended at ``now`` with ``failed``'s
    error (its kind and text: the loop stopped, or a bug)."""
    assert failed.error_kind is not None
    duration = (now - slot.started) * 1000 if slot.started else 0.0
    return error_result(slot.call.id, slot.call.name, failed.error_kind, failed.content, duration)


@dataclass(slots=True, init=False)
class Turn:
    """One turn. Once it is admitted, ``lock`` guards the slots' ``result``, ``started``,
    ``span`` and ``running``, and ``waiting``, ``open``, ``stop_reason`` and
    ``finished``: calls settle from their own threads. Whoever sets a slot's result ends
    its span, after the lock (a one-call turn admitted as its call is dispatched has that
    call marked started under the loop's admitting lock instead: no other thread can
    reach the turn before)."""

    id: int
    slots: list[Slot]
    future: ResultSink
    withheld: tuple[str, ...]
    context: contextvars.Context | None = None
    own_context: bool = False  # ``context`` is the turn's own copy (a one-call turn's call runs in it)
    telemetry: TurnTelemetry | None = None  # what its calls report to (None: nothing configured)
    on_result: Callable[[int, ToolResult], None] | None = None  # RunTurn.on_result
    on_start: Callable[[int], None] | None = None  # Loop.arun_turn's on_start
    aio: asyncio.AbstractEventLoop | None = None  # the event loop awaiting it (arun_turn): async tools run there
    background: bool | frozenset[str] = False  # the calls the caller runs as tasks, of tools declaring "optional"
    journal: bool = False  # its held calls are recorded by the session's approvals (not by a prompt)
    waiter: Waiter | None = None  # its caller waits for its one call alone (Loop.run_turn): may read its reply
    waiting: deque[int] = field(default_factory=deque)
    exclusive: bool = False
    open: int = 0
    stop_reason: str | None = None  # "cancelled" (by the host) or "stopping" (the loop): nothing starts
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    hooked: tuple[CancelToken, Callable[[], None]] | None = None  # the host's token and its callback, until done

    def __init__(
        self, id: int, slots: list[Slot], future: ResultSink, withheld: tuple[str, ...],
        context: contextvars.Context | None, own_context: bool, telemetry: TurnTelemetry | None,
        on_result: Callable[[int, ToolResult], None] | None, on_start: Callable[[int], None] | None,
        aio: asyncio.AbstractEventLoop | None, background: bool | frozenset[str], journal: bool,
    ) -> None:
        # the dataclass's own, less its defaults passed as parameters and its factories' looks (one a turn)
        self.id, self.slots, self.future, self.withheld, self.context, self.own_context = (
            id, slots, future, withheld, context, own_context)
        self.telemetry, self.on_result, self.on_start, self.aio, self.background, self.journal = (
            telemetry, on_result, on_start, aio, background, journal)
        self.waiter = self.stop_reason = self.hooked = None
        self.waiting = deque()
        self.exclusive = self.finished = False
        self.open = 0
        self.lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Withheld:
    """The loop's withheld names, swapped whole: as a set (look-ups) and sorted (ctx)."""

    names: frozenset[str]
    listed: tuple[str, ...]


# The sorted lists of the withheld sets seen last, shared by the sessions that withhold the
# same names (a host's usual case: sorting ~100 names was a fifth of a BFCL session's start).
_LISTED: dict[frozenset[str], tuple[str, ...]] = {}
_LISTED_KEPT = 64  # sets kept (all dropped when full)
_LISTED_MAX_NAMES = 1_024  # larger sets are sorted each time


def withheld_set(names: frozenset[str]) -> Withheld:
    """``names`` as a :class:`Withheld` (its sorted list made once for equal sets seen lately)."""
    listed = _LISTED.get(names)
    if listed is None:
        listed = tuple(sorted(names))
        if len(names) <= _LISTED_MAX_NAMES:
            if len(_LISTED) >= _LISTED_KEPT:
                _LISTED.clear()
            _LISTED[names] = listed
    return Withheld(names, listed)
