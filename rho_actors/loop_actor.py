"""The LoopActor: one agent session's turns (DESIGN §4).

For each turn, in the model's order, each call's arguments are decoded strictly, its
tool is looked up among those offered now, and its arguments are validated against the
checked schema; a call failing any of these gets its error result and its tool never
runs. The rest are started in their tool's isolation (:mod:`rho_actors.isolation`),
each with a deadline (``timeout_ms`` from dispatch) that the isolation keeps. A turn with
any ``exclusive`` call runs its calls one at a time in the model's order, each deadline
counted from that call's own start. Results come back in the model's order, exactly one
per call.

The LoopActor never blocks: calls report back with messages, so a hung tool delays
nothing but its own result, which is a ``timeout`` error at its deadline. Its host
handle is :class:`rho_actors.loop.Loop`; its messages are in
:mod:`rho_actors.loop_messages`.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pykka
from loguru import logger

from rho_actors.arguments import ArgumentsError, decode_arguments, violations
from rho_actors.call import CallSpec
from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception
from rho_actors.events import CallEvent
from rho_actors.isolation import RunningCall
from rho_actors.loop_messages import CallDone, Offered, Running, RunTurn, SetWithheld
from rho_actors.otp.actor import Actor
from rho_actors.registry import ToolEntry, ToolSet
from rho_actors.results import error_result, failure, text
from rho_actors.tool import ErrorKind, ToolCall, ToolResult

if TYPE_CHECKING:
    from rho_actors.runtime import Runtime

__all__ = ["LoopActor"]

_MAX_NAMES_LISTED = 40




@dataclass(slots=True)
class _Slot:
    call: ToolCall
    entry: ToolEntry | None = None
    args: dict[str, Any] | None = None
    result: ToolResult | None = None
    started: float = 0.0
    cancel: CancelToken | None = None
    running: RunningCall | None = None


@dataclass(slots=True)
class _Turn:
    id: int
    slots: list[_Slot]
    future: concurrent.futures.Future[list[ToolResult]]
    waiting: deque[int] = field(default_factory=deque)
    exclusive: bool = False
    open: int = 0


class LoopActor(Actor):
    """One agent session: runs its turns (DESIGN §4). Start it through
    :meth:`rho_actors.ActorSystem.start_loop`, which returns a :class:`Loop`."""

    def __init__(
        self, *, session_id: str, data_dir: Path, deps: Any, withheld: frozenset[str], runtime: Runtime
    ) -> None:
        super().__init__()
        self.session_id = session_id
        self._data_dir = data_dir
        self._deps = deps
        self._withheld = withheld
        self._withheld_list: tuple[str, ...] = tuple(sorted(withheld))
        self._runtime = runtime
        self.thread_pool = runtime.threads
        self._tools = runtime.tools
        self._limits = runtime.limits
        self._events = runtime.events
        self._turns: dict[int, _Turn] = {}
        self._turn_ids = itertools.count(1)

    # --- messages ---------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, CallDone):
            self._call_done(message)
        elif isinstance(message, RunTurn):
            self._run_turn(message)
        elif isinstance(message, Offered):
            return [e.info.copy() for e in self._offered(self._tools.current)]
        elif isinstance(message, Running):
            return self._running()
        elif isinstance(message, SetWithheld):
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

    def _run_turn(self, message: RunTurn) -> None:
        turn = _Turn(next(self._turn_ids), [_Slot(call) for call in message.calls], message.future)
        self._turns[turn.id] = turn
        try:
            tools = self._tools.current
            for index, slot in enumerate(turn.slots):
                try:
                    refusal = self._prepare(slot, tools)
                except Exception as exc:  # a bug, or a checker that broke: this call only
                    logger.exception("loop {} could not prepare call {}", self.session_id, slot.call.id)
                    refusal = failure("not_prepared", slot.call.id, slot.call.name, problem=describe_exception(exc))
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
            self._fail_open(turn, failure("loop_failed", "", "", problem=repr(exc)))
        self._maybe_finish(turn)

    def _prepare(self, slot: _Slot, tools: ToolSet) -> ToolResult | None:
        """Decode, look up and validate one call; an error result when it is refused."""
        call = slot.call
        name = call.name
        entry = tools.entries.get(name)
        if entry is None or name in self._withheld:
            return self._lookup_error(call.id, name, entry, tools)
        try:
            args = decode_arguments(call.arguments, self._limits.max_argument_depth)
        except ArgumentsError as err:
            return error_result(call.id, name, err.kind, text("bad_arguments", tool=name, problem=err))
        try:
            problems = violations(entry.validator, args)
        except Exception as exc:  # a $ref cycle's RecursionError, a format checker's OverflowError...
            return failure("unvalidatable", call.id, name, problem=describe_exception(exc))
        if problems:
            return failure("invalid_arguments", call.id, name, problems="; ".join(problems))
        slot.entry, slot.args = entry, args
        return None

    def _lookup_error(self, call_id: str, name: str, entry: ToolEntry | None, tools: ToolSet) -> ToolResult:
        if entry is not None:
            return failure("withheld", call_id, name)
        if name in tools.unavailable:
            return error_result(call_id, name, ErrorKind.UNAVAILABLE, tools.unavailable[name])
        offered = [e.info.name for e in self._offered(tools)]
        shown = ", ".join(offered[:_MAX_NAMES_LISTED]) + (", ..." if len(offered) > _MAX_NAMES_LISTED else "")
        message = text("unknown_tool", tool=name[:100], offered=shown or "(none)")
        return error_result(call_id, name, ErrorKind.UNKNOWN_TOOL, message)

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
            _tell(ref, CallDone(turn_id, index, result))

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
                "whereis": self._runtime.names.whereis,
            }
        )
        spec = CallSpec(
            slot.call.id, entry.info.name, entry.tool, args, ctx, now, deadline, entry.info.timeout_ms, cancel,
            self._limits.max_output_chars, reply,
        )
        slot.started, slot.cancel = now, cancel
        self._emit("started", slot, None)
        try:
            slot.running = self._runtime.isolations[entry.isolation].start(spec)
        except (pykka.ActorDeadError, pykka.Timeout) as err:
            self._settle(turn, slot, failure("not_started", slot.call.id, entry.info.name, problem=err))

    def _call_done(self, message: CallDone) -> None:
        turn = self._turns.get(message.turn)
        if turn is None or turn.slots[message.index].result is not None:
            slot = turn.slots[message.index] if turn is not None else _Slot(ToolCall(message.result.call_id, ""))
            self._emit("late", slot, message.result)
            return
        slot = turn.slots[message.index]
        timed_out = message.result.error_kind is ErrorKind.TIMEOUT
        self._settle(turn, slot, message.result, event="timed_out" if timed_out else "finished")

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

    def _fail_open(self, turn: _Turn, failed: ToolResult) -> None:
        """Give every call of ``turn`` still without a result the error of ``failed``
        (its kind and text), and cancel those running."""
        assert failed.error_kind is not None
        for slot in turn.slots:
            if slot.result is not None:
                continue
            if slot.running is not None:
                slot.running.cancel("stopping")
            duration = (time.monotonic() - slot.started) * 1000 if slot.started else 0.0
            slot.result = error_result(slot.call.id, slot.call.name, failed.error_kind, failed.content, duration)
        turn.open = 0

    def _emit(self, kind: Any, slot: _Slot, result: ToolResult | None) -> None:
        if result is None:
            outcome, duration = None, 0.0
        else:
            outcome = "ok" if result.ok else str(result.error_kind)
            duration = result.duration_ms
        self._events.emit(CallEvent(kind, self.session_id, slot.call.id, slot.call.name, outcome, duration))

    # --- lifecycle --------------------------------------------------------------------

    def _close(self, key: str) -> None:
        for turn in list(self._turns.values()):
            self._fail_open(turn, failure(key, "", ""))
            self._maybe_finish(turn)

    def on_stop(self) -> None:
        if self._exit_cause is None:
            self._close("session_stopped")
        else:  # killed, or exited: a crash of the loop, not of the calls
            self._close("loop_crashed")

    def on_failure(self, *exc_info: Any) -> None:
        self._close("loop_crashed")

    def on_undelivered(self, message: Any) -> bool:
        """Answer the turns still in the inbox too (pykka answers only ``ask``s), so every
        call id gets its result even when a turn races the loop's stop."""
        if not isinstance(message, RunTurn):
            return False
        message.future.set_result([failure("turn_not_started", c.id, c.name) for c in message.calls])
        return True


def _tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        pass
