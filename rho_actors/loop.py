"""The LoopActor (one per session) and :class:`Loop`, the host's handle to it (DESIGN §4).

For each turn, in the model's order, each call's arguments are decoded strictly, its
tool is looked up among those offered now, and its arguments are validated against the
checked schema; a call failing any of these gets its error result and its tool never
runs. The rest go to fresh CallActors under the call supervisor, each with a deadline
(``timeout_ms`` from dispatch). A turn with any ``exclusive`` call runs its calls one at
a time in the model's order, each deadline counted from that call's own start. Results
come back in the model's order, exactly one per call.

The LoopActor never blocks: calls report back with messages and deadlines arrive as
timer messages, so a hung tool delays nothing but its own result, which is a ``timeout``
error at its deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pykka
from loguru import logger

from rho_actors.actor import Actor
from rho_actors.arguments import ArgumentsError, decode_arguments, violations
from rho_actors.call import AbandonedThreads, CallSpec, CancelToken, error_result
from rho_actors.encoding import describe_exception
from rho_actors.events import CallEvent, EventBus
from rho_actors.formats import Dialect, to_dialect
from rho_actors.registry import ToolEntry, ToolSet, ToolSetView
from rho_actors.supervisor import Spares
from rho_actors.timers import Timer, Timers
from rho_actors.tool import DEFAULT_TIMEOUT_MS, ErrorKind, ToolCall, ToolInfo, ToolResult
from rho_actors.workers import Workers

if TYPE_CHECKING:
    from rho_actors.agent import PromptEvent, PromptResult
    from rho_actors.model import Model

__all__ = ["Loop", "LoopActor", "LoopSettings", "loop_name"]

_MAX_NAMES_LISTED = 40


def loop_name(session_id: str) -> str:
    """The name a session's LoopActor is registered under (``whereis``)."""
    return f"loop:{session_id}"
_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """Limits of a loop: ``max_output_chars`` caps each result's text (characters);
    ``max_argument_depth`` bounds argument nesting; ``ask_timeout_s`` bounds the
    host's queries to the loop (seconds)."""

    max_output_chars: int
    max_argument_depth: int
    ask_timeout_s: float = 10.0


# --- messages -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _RunTurn:
    calls: tuple[ToolCall, ...]
    future: concurrent.futures.Future[list[ToolResult]]
    cancel: CancelToken | None = None
    context: contextvars.Context | None = None


@dataclass(frozen=True, slots=True)
class _CancelTurn:
    turn: int


@dataclass(frozen=True, slots=True)
class _CallDone:
    turn: int
    index: int
    result: ToolResult


@dataclass(frozen=True, slots=True)
class _Deadline:
    turn: int
    index: int


@dataclass(frozen=True, slots=True)
class _SetWithheld:
    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Offered:
    pass


@dataclass(frozen=True, slots=True)
class _Running:
    pass


# --- turn state -----------------------------------------------------------------------


@dataclass(slots=True)
class _Slot:
    call: ToolCall
    entry: ToolEntry | None = None
    args: dict[str, Any] | None = None
    result: ToolResult | None = None
    started: float = 0.0
    cancel: CancelToken | None = None
    timer: Timer | None = None
    actor: pykka.ActorRef[Any] | None = None


@dataclass(slots=True)
class _Turn:
    id: int
    slots: list[_Slot]
    future: concurrent.futures.Future[list[ToolResult]]
    context: contextvars.Context | None = None
    waiting: deque[int] = field(default_factory=deque)
    exclusive: bool = False
    open: int = 0


class LoopActor(Actor):
    """One agent session: runs its turns (DESIGN §4). Start it through
    :meth:`rho_actors.ActorSystem.start_loop`, which returns a :class:`Loop`."""

    def __init__(
        self,
        *,
        session_id: str,
        data_dir: Path,
        deps: Any,
        withheld: frozenset[str],
        tools: ToolSetView,
        calls: Spares,
        workers: Workers,
        timers: Timers,
        events: EventBus,
        abandoned: AbandonedThreads,
        settings: LoopSettings,
        whereis: Callable[[str], pykka.ActorRef[Any] | None],
    ) -> None:
        super().__init__()
        self.session_id = session_id
        self._data_dir = data_dir
        self._deps = deps
        self._withheld = withheld
        self._withheld_list: tuple[str, ...] = tuple(sorted(withheld))
        self._tools = tools
        self._calls = calls
        self._workers = workers
        self._timers = timers
        self._events = events
        self._abandoned = abandoned
        self._settings = settings
        self._whereis = whereis
        self._turns: dict[int, _Turn] = {}
        self._turn_ids = itertools.count(1)

    # --- messages ---------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _CallDone):
            self._call_done(message)
        elif isinstance(message, _Deadline):
            self._deadline(message)
        elif isinstance(message, _RunTurn):
            self._run_turn(message)
        elif isinstance(message, _CancelTurn):
            self._cancel_turn(message.turn)
        elif isinstance(message, _Offered):
            return [e.info.copy() for e in self._offered(self._tools.current)]
        elif isinstance(message, _Running):
            return self._running()
        elif isinstance(message, _SetWithheld):
            self._withheld = message.names
            self._withheld_list = tuple(sorted(message.names))
        else:
            logger.warning("loop {} ignored an unknown message {!r}", self.session_id, message)
        return None

    def _running(self) -> list[dict[str, Any]]:
        """The calls running now: ``call_id``, ``tool`` and ``ms_left`` to the deadline."""
        now = time.monotonic()
        return [
            {
                "call_id": slot.call.id,
                "tool": slot.entry.info.name,
                "ms_left": round((slot.started + slot.entry.info.timeout_ms / 1000 - now) * 1000, 1),
            }
            for turn in self._turns.values()
            for slot in turn.slots
            if slot.entry is not None and slot.started and slot.result is None
        ]

    def _offered(self, tools: ToolSet) -> list[ToolEntry]:
        return [e for name, e in tools.entries.items() if name not in self._withheld]

    def _run_turn(self, message: _RunTurn) -> None:
        turn = _Turn(next(self._turn_ids), [_Slot(call) for call in message.calls], message.future, message.context)
        self._turns[turn.id] = turn
        if message.cancel is not None:
            if message.cancel.cancelled:  # cancelled before it started: no call starts
                turn.open = len(turn.slots)
                self._cancel_turn(turn.id)
                return
            ref, turn_id = self.actor_ref, turn.id
            message.cancel.add_callback(lambda: _tell(ref, _CancelTurn(turn_id)))
        try:
            tools = self._tools.current
            for index, slot in enumerate(turn.slots):
                try:
                    refusal = self._prepare(slot, tools)
                except Exception as exc:  # a bug, or a checker that broke: this call only
                    logger.exception("loop {} could not prepare call {}", self.session_id, slot.call.id)
                    refusal = error_result(slot.call.id, slot.call.name, ErrorKind.CRASHED,
                                           f"the loop could not prepare this call: {describe_exception(exc)}")
                if refusal is not None:
                    slot.result = refusal
                    self._emit("finished", slot, refusal)
                else:
                    turn.open += 1
                    turn.waiting.append(index)
                    turn.exclusive |= slot.entry is not None and slot.entry.info.concurrency == "exclusive"
            self._dispatch_ready(turn)
        except Exception as exc:  # a bug here must still answer every call
            logger.exception("loop {} failed to run a turn", self.session_id)
            self._fail_open(turn, ErrorKind.CRASHED, f"the loop failed to run this call: {exc!r}")
        self._maybe_finish(turn)

    def _prepare(self, slot: _Slot, tools: ToolSet) -> ToolResult | None:
        """Decode, look up and validate one call; an error result when it is refused."""
        call = slot.call
        name = call.name
        entry = tools.entries.get(name)
        if entry is None or name in self._withheld:
            return error_result(call.id, name, *self._lookup_error(name, entry, tools))
        try:
            args = decode_arguments(call.arguments, self._settings.max_argument_depth)
        except ArgumentsError as err:
            return error_result(call.id, name, err.kind, f"tool {name!r}: {err}")
        try:
            problems = violations(entry.validator, args)
        except Exception as exc:  # a $ref cycle's RecursionError, a format checker's OverflowError...
            return error_result(
                call.id, name, ErrorKind.INVALID_ARGUMENTS,
                f"the arguments for tool {name!r} could not be validated: {describe_exception(exc)}",
            )
        if problems:
            listed = "; ".join(problems)
            return error_result(
                call.id, name, ErrorKind.INVALID_ARGUMENTS, f"invalid arguments for tool {name!r}: {listed}"
            )
        slot.entry, slot.args = entry, args
        return None

    def _lookup_error(self, name: str, entry: ToolEntry | None, tools: ToolSet) -> tuple[ErrorKind, str]:
        if entry is not None:
            return ErrorKind.WITHHELD, f"tool {name!r} is not available in this session now"
        if name in tools.unavailable:
            return ErrorKind.UNAVAILABLE, tools.unavailable[name]
        offered = [e.info.name for e in self._offered(tools)]
        shown = ", ".join(offered[:_MAX_NAMES_LISTED]) + (", ..." if len(offered) > _MAX_NAMES_LISTED else "")
        return ErrorKind.UNKNOWN_TOOL, f"unknown tool {name[:100]!r}; the tools offered are: {shown or '(none)'}"

    def _dispatch_ready(self, turn: _Turn) -> None:
        while turn.waiting:
            self._dispatch(turn, turn.waiting.popleft())
            if turn.exclusive:
                return

    def _dispatch(self, turn: _Turn, index: int) -> None:
        slot = turn.slots[index]
        entry, args = slot.entry, slot.args
        assert entry is not None and args is not None
        now = time.monotonic()
        deadline = now + entry.info.timeout_ms / 1000
        cancel = CancelToken()
        ref = self.actor_ref
        turn_id = turn.id

        def reply(result: ToolResult) -> None:
            _tell(ref, _CallDone(turn_id, index, result))

        ctx = MappingProxyType(
            {
                "session_id": self.session_id,
                "call_id": slot.call.id,
                "data_dir": self._data_dir,
                "loop": ref,
                "withheld": self._withheld_list,
                "deadline": deadline,
                "cancel": cancel,
                "deps": self._deps,
                "whereis": self._whereis,
            }
        )
        spec = CallSpec(
            slot.call.id, entry.info.name, entry.tool, args, ctx, now, deadline, cancel,
            self._settings.max_output_chars, reply, self._abandoned, entry.isolation, self._workers,
            None if turn.context is None else turn.context.copy(),
        )
        slot.started, slot.cancel = now, cancel
        slot.timer = self._timers.call_at(deadline, lambda: _tell(ref, _Deadline(turn_id, index)))
        self._emit("started", slot, None)
        try:
            slot.actor = self._calls.take()
            slot.actor.tell(spec)
        except (pykka.ActorDeadError, pykka.Timeout) as err:
            slot.timer.cancel()
            self._settle(turn, slot, error_result(
                slot.call.id, entry.info.name, ErrorKind.CANCELLED, f"the call did not start: {err}"
            ))

    def _call_done(self, message: _CallDone) -> None:
        turn = self._turns.get(message.turn)
        if turn is None or turn.slots[message.index].result is not None:
            slot = turn.slots[message.index] if turn is not None else _Slot(ToolCall(message.result.call_id, ""))
            self._emit("late", slot, message.result)
            return
        slot = turn.slots[message.index]
        if slot.timer is not None:
            slot.timer.cancel()
        self._settle(turn, slot, message.result)

    def _deadline(self, message: _Deadline) -> None:
        turn = self._turns.get(message.turn)
        if turn is None or turn.slots[message.index].result is not None:
            return
        slot = turn.slots[message.index]
        assert slot.entry is not None and slot.cancel is not None
        timeout = slot.entry.info.timeout_ms
        if slot.cancel.cancel("timeout") and _abandons_a_thread(slot):
            self._abandoned.abandoned()
            if slot.actor is not None:
                self._calls.abandon(slot.actor)
        result = error_result(
            slot.call.id, slot.entry.info.name, ErrorKind.TIMEOUT,
            f"tool {slot.entry.info.name!r} did not finish within its timeout of {timeout} ms; "
            + ("its worker process was killed" if slot.entry.isolation == "process" else "it was cancelled"),
            (time.monotonic() - slot.started) * 1000,
        )
        self._settle(turn, slot, result, event="timed_out")

    def _cancel_turn(self, turn_id: int) -> None:
        """The host cancelled a turn: each running call's ``ctx["cancel"]`` is set (a
        process worker is killed), and every call still without a result gets a
        ``cancelled`` one (a queued call of an exclusive turn never starts)."""
        turn = self._turns.get(turn_id)
        if turn is None:
            return
        turn.waiting.clear()
        for slot in turn.slots:
            if slot.result is not None:
                continue
            if slot.timer is not None:
                slot.timer.cancel()
            running = slot.cancel is not None and slot.cancel.cancel("cancelled")
            if running and _abandons_a_thread(slot):
                self._abandoned.abandoned()
                if slot.actor is not None:
                    self._calls.abandon(slot.actor)
            name = slot.call.name
            if slot.started:
                text = f"tool {name!r} was cancelled by the host while running"
                duration = (time.monotonic() - slot.started) * 1000
            else:
                text = f"tool {name!r} did not start: the host cancelled the turn"
                duration = 0.0
            slot.result = error_result(slot.call.id, name, ErrorKind.CANCELLED, text, duration)
            turn.open -= 1
            self._emit("finished", slot, slot.result)
        self._maybe_finish(turn)

    def _settle(self, turn: _Turn, slot: _Slot, result: ToolResult, event: str = "finished") -> None:
        slot.result = result
        turn.open -= 1
        self._emit(event, slot, result)
        if turn.exclusive:
            self._dispatch_ready(turn)
        self._maybe_finish(turn)

    def _maybe_finish(self, turn: _Turn) -> None:
        if turn.open > 0 or turn.id not in self._turns:
            return
        del self._turns[turn.id]
        results = [slot.result for slot in turn.slots]
        assert all(r is not None for r in results)
        turn.future.set_result(results)  # type: ignore[arg-type]
        self._calls.replenish()

    def _fail_open(self, turn: _Turn, kind: ErrorKind, message: str) -> None:
        """Give every call of ``turn`` still without a result an error result."""
        for slot in turn.slots:
            if slot.result is not None:
                continue
            name = slot.call.name
            if slot.timer is not None:
                slot.timer.cancel()
            if slot.cancel is not None and slot.cancel.cancel("stopping") and _abandons_a_thread(slot):
                self._abandoned.abandoned()
            duration = (time.monotonic() - slot.started) * 1000 if slot.started else 0.0
            slot.result = error_result(slot.call.id, name, kind, message, duration)
        turn.open = 0

    def _emit(self, kind: Any, slot: _Slot, result: ToolResult | None) -> None:
        if result is None:
            outcome, duration = None, 0.0
        else:
            outcome = "ok" if result.ok else str(result.error_kind)
            duration = result.duration_ms
        self._events.emit(CallEvent(kind, self.session_id, slot.call.id, slot.call.name, outcome, duration))

    # --- lifecycle --------------------------------------------------------------------

    def _close(self, kind: ErrorKind, message: str) -> None:
        for turn in list(self._turns.values()):
            self._fail_open(turn, kind, message)
            self._maybe_finish(turn)

    def on_stop(self) -> None:
        if self._exit_cause is None:
            self._close(ErrorKind.CANCELLED, "the session stopped before this call finished")
        else:  # killed, or exited: a crash of the loop, not of the calls
            self._close(ErrorKind.CRASHED, "the session's loop crashed before this call finished")

    def on_failure(self, *exc_info: Any) -> None:
        self._close(ErrorKind.CRASHED, "the session's loop crashed before this call finished")

    def _actor_loop_teardown(self) -> None:
        """Answer the turns still in the inbox too (pykka answers only ``ask``s), so every
        call id gets its result even when a turn races the loop's stop."""
        others = []
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            if isinstance(envelope.message, _RunTurn):
                results = [
                    error_result(c.id, c.name, ErrorKind.CANCELLED, "the session stopped before this turn started")
                    for c in envelope.message.calls
                ]
                envelope.message.future.set_result(results)
            else:
                others.append(envelope)
        for envelope in others:
            self.actor_inbox.put(envelope)
        super()._actor_loop_teardown()


def withheld_names(names: Iterable[str]) -> frozenset[str]:
    """``names`` as a frozenset of plain ``str``; ``TypeError`` for a lone ``str`` or a
    name that is not a ``str``."""
    if isinstance(names, (str, bytes)):
        raise TypeError(f"withheld takes a collection of tool names, got the single string {names!r}")
    checked = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a withheld tool name must be a str, got {type(name).__name__}")
        checked.add(str.__str__(name))
    return frozenset(checked)


def _checked_calls(calls: Iterable[Any]) -> tuple[ToolCall, ...]:
    return tuple(_checked_call(i, call) for i, call in enumerate(calls))


def _checked_call(index: int, call: Any) -> ToolCall:
    """``call`` with a plain ``str`` id and name (a model's are always strings)."""
    if not isinstance(call, ToolCall):
        raise TypeError(f"call {index} of the turn: a turn takes ToolCall values, got {type(call).__name__}")
    for field_name in ("id", "name"):
        if not isinstance(getattr(call, field_name), str):
            raise TypeError(
                f"call {index} of the turn: ToolCall.{field_name} must be a str, "
                f"got {type(getattr(call, field_name)).__name__}"
            )
    if type(call.id) is str and type(call.name) is str:
        return call
    return ToolCall(str.__str__(call.id), str.__str__(call.name), call.arguments)


def _abandons_a_thread(slot: _Slot) -> bool:
    """Whether cancelling this running call abandons a thread: a ``process`` call's
    CallActor returns at once, its worker process being killed instead."""
    return slot.entry is not None and slot.entry.isolation == "thread"


def _settled(future: concurrent.futures.Future[Any], timeout_s: float) -> None:
    """Wait (at most ``timeout_s`` seconds) for ``future`` to be done."""
    concurrent.futures.wait([future], timeout_s)


def _tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        pass


class Loop:
    """The host's handle to one session's LoopActor.

    Example::

        loop = system.start_loop("s1", deps={"db": conn})
        results = loop.run_turn([ToolCall("c1", "add", '{"a": 1, "b": 2}')])
        assert results[0].content == "3"
    """

    def __init__(
        self,
        session_id: str,
        data_dir: Path,
        whereis: Callable[[str], pykka.ActorRef[Any] | None],
        tools: ToolSetView,
        settings: LoopSettings,
    ) -> None:
        self.session_id = session_id
        self.data_dir = data_dir
        self._whereis = whereis
        self._tools = tools
        self._settings = settings
        self.instructions: str | None = None
        """The system prompt of this session's prompts that give none (not recorded)."""

    @property
    def ref(self) -> pykka.ActorRef[Any]:
        """The session's LoopActor now (a restart by its supervisor gives a new one).
        Raises ``pykka.ActorDeadError`` when the loop has stopped."""
        ref = self._whereis(loop_name(self.session_id))
        if ref is None:
            raise pykka.ActorDeadError(f"the loop of session {self.session_id!r} is not running")
        return ref

    def submit_turn(
        self, calls: Iterable[ToolCall], *, cancel: CancelToken | None = None
    ) -> concurrent.futures.Future[list[ToolResult]]:
        """Start a turn without waiting: returns a future of the results, one per call,
        in the calls' order. Setting ``cancel`` (:meth:`CancelToken.cancel`) cancels the
        turn: each running call's ``ctx["cancel"]`` is set (a ``process`` worker is
        killed) and each call still without a result gets a ``cancelled`` one. The
        calls run in copies of the caller's ``contextvars`` context (``thread``
        isolation, ``async`` tools included; a ``process`` worker does not get it).
        Raises ``TypeError`` for an item that is not a :class:`ToolCall` or whose
        ``id`` or ``name`` is not a ``str``, and :class:`pykka.ActorDeadError` when the
        loop has stopped."""
        return self._submit(_checked_calls(calls), cancel)

    def _submit(
        self, batch: tuple[ToolCall, ...], cancel: CancelToken | None = None
    ) -> concurrent.futures.Future[list[ToolResult]]:
        future: concurrent.futures.Future[list[ToolResult]] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        self.ref.tell(_RunTurn(batch, future, cancel, contextvars.copy_context()))
        return future

    def turn_bound_s(self, calls: Sequence[ToolCall]) -> float:
        """An upper bound, in seconds, on how long a turn of ``calls`` can take: the sum
        of their tools' timeouts plus a grace period."""
        entries = self._tools.current.entries
        total_ms = sum(
            entries[c.name].info.timeout_ms if type(c.name) is str and c.name in entries else DEFAULT_TIMEOUT_MS
            for c in calls
        )
        return total_ms / 1000 + _GRACE_S

    def run_turn(
        self, calls: Iterable[ToolCall], timeout_s: float | None = None, *, cancel: CancelToken | None = None
    ) -> list[ToolResult]:
        """Run a turn and wait for its results (one per call, in order); ``cancel``
        as in :meth:`submit_turn` (set it from another thread).

        Waits at most ``timeout_s`` seconds (default :meth:`turn_bound_s`); raises
        ``TimeoutError`` past that, which only a broken runtime can cause.
        """
        batch = _checked_calls(calls)
        return self._submit(batch, cancel).result(timeout_s if timeout_s is not None else self.turn_bound_s(batch))

    async def arun_turn(
        self, calls: Iterable[ToolCall], timeout_s: float | None = None, *, cancel: CancelToken | None = None
    ) -> list[ToolResult]:
        """:meth:`run_turn` for asyncio hosts: awaits the results without ever blocking
        the event loop (the future is completed from the loop's thread). Cancelling the
        awaiting task cancels the turn (as ``cancel`` does) and waits (a bounded time)
        for its ``cancelled`` results before re-raising ``CancelledError``."""
        batch = _checked_calls(calls)
        bound = timeout_s if timeout_s is not None else self.turn_bound_s(batch)
        token = cancel if cancel is not None else CancelToken()
        future = self._submit(batch, token)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), bound)
        except asyncio.CancelledError:
            token.cancel("cancelled")
            await asyncio.to_thread(_settled, future, self._settings.ask_timeout_s)
            raise

    def offered(self) -> list[ToolInfo]:
        """The checked declarations this loop offers now, in registration order."""
        result: list[ToolInfo] = self.ref.ask(_Offered(), block=True, timeout=self._settings.ask_timeout_s)
        return result

    def declarations(self, dialect: Dialect = "neutral") -> list[dict[str, Any]]:
        """:meth:`offered` in a provider's format (see :mod:`rho_actors.formats`)."""
        return [to_dialect(info, dialect) for info in self.offered()]

    def set_withheld(self, names: Iterable[str]) -> None:
        """Replace the set of tool names this loop does not offer (from its next turn).
        Raises ``TypeError`` for a single ``str`` (a name list is wanted) or a name that
        is not a ``str``."""
        self.ref.ask(_SetWithheld(withheld_names(names)), timeout=self._settings.ask_timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop (a normal exit: not restarted); calls still running get
        ``cancelled`` results."""
        try:
            self.ref.stop(timeout=timeout_s)
        except pykka.ActorDeadError:
            pass

    def prompt(self, text: str | None, *, model: Model, **options: Any) -> PromptResult:
        """Run one prompt of this session to its end (see :func:`rho_actors.agent.prompt`
        for ``options``: ``max_steps``, ``cancel``, ``instructions``, ``temperature``,
        ``max_tokens``, ``on_event``): the final text, the steps taken and ``error``."""
        from rho_actors.agent import prompt

        return prompt(self, text, model=model, **options)

    async def aprompt(self, text: str | None, *, model: Model, **options: Any) -> PromptResult:
        """:meth:`prompt` for asyncio hosts; never blocks the event loop. Cancelling the
        awaiting task cancels the prompt and its running turn."""
        from rho_actors.agent import aprompt

        return await aprompt(self, text, model=model, **options)

    def stream(self, text: str | None, *, model: Model, **options: Any) -> Iterator[PromptEvent]:
        """:meth:`prompt`, yielding its events as they happen (see
        :func:`rho_actors.agent.stream`); the last is a ``FinalResult``."""
        from rho_actors.agent import stream

        return stream(self, text, model=model, **options)

    def astream(self, text: str | None, *, model: Model, **options: Any) -> AsyncIterator[PromptEvent]:
        """:meth:`stream` for asyncio hosts (see :func:`rho_actors.agent.astream`)."""
        from rho_actors.agent import astream

        return astream(self, text, model=model, **options)

    def running(self) -> list[dict[str, Any]]:
        """The calls running now: ``call_id``, ``tool``, ``ms_left`` (to the deadline)."""
        result: list[dict[str, Any]] = self.ref.ask(_Running(), block=True, timeout=self._settings.ask_timeout_s)
        return result

    @property
    def alive(self) -> bool:
        """Whether the session's LoopActor is running now."""
        return self._whereis(loop_name(self.session_id)) is not None
