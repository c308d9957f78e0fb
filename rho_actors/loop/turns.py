"""A session's turns, prepared and started in the submitting thread (DESIGN §4).

:class:`Turns` is the part of a LoopActor that runs turns. The host's
:class:`~rho_actors.loop.handle.Loop` calls :meth:`Turns.submit` in its own thread:
for each call of the turn, in the model's order, its arguments are decoded strictly,
its tool is looked up among those offered now (an immutable snapshot: the published
:class:`~rho_actors.declarations.toolset.ToolSet` and the loop's withheld names), and
its arguments are validated against the checked schema (:mod:`rho_actors.loop.prepare`);
a call failing any of these gets its error result and its tool never runs. The rest are started in their tool's
isolation (:mod:`rho_actors.isolation`), each with a deadline (``timeout_ms`` from
dispatch) that the isolation keeps, from the tool's call plan (:mod:`rho_actors.loop.call_plan`:
made once per registration). A turn with any ``exclusive`` call runs its calls
one at a time in the model's order, each deadline counted from that call's own start.
Results come back in the model's order, exactly one per call. Each call runs in a copy
of the submitter's ``contextvars`` context. A turn given a cancel token is cancelled
when the token is set: each running call is cancelled through its isolation (the one
path of deadlines and stops too: its ``ctx["cancel"]`` is set, a worker process is
killed) and every call without a result gets a ``cancelled`` one at once; a turn whose
token is set before it starts runs no call. A turn awaited on an asyncio event loop
(``arun_turn``) runs its calls of trusted ``async`` tools in ``thread`` isolation on
that event loop (:mod:`rho_actors.loop.inline`), with their deadlines; a background call
of such a tool runs the same way on the system's tasks event loop
(:mod:`rho_actors.tasks.event_loop`), from any turn.

A result does not pass through the LoopActor: the thread that answers a call (its
CallActor's, its deadline timer's, the event loop's) settles the call's slot in its turn
under the turn's lock, first answer wins (a later one, or one after the host cancelled
the turn, is reported ``late``); in an exclusive turn it starts the next call, and the
one settling the last open call completes the turn's future. A hung tool delays nothing
but its own result, which is a ``timeout`` error at its deadline.

What is offered (:mod:`rho_actors.loop.offered`, which ``Turns`` inherits): the withheld
names are one immutable snapshot, swapped whole by :meth:`Turns.set_withheld` (from the
host's thread through the handle, or the LoopActor's on a ``SetWithheld``): a turn reads
it once, so it is prepared against the old set or the new one, never a mix.
What must be serial stays with the LoopActor, which owns this object: it answers
``Running`` and ``CancelTurn``, and at its stop or crash :meth:`Turns.close` refuses new
turns and answers every open call (under the lock that also admits turns, so no turn
slips past a close).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pykka
from loguru import logger

from rho_actors.budgets import over_budget, result_bytes
from rho_actors.cancel import CancelToken
from rho_actors.declarations.toolset import ToolEntry
from rho_actors.encoding import describe_exception
from rho_actors.events import CallEvent, EventKind, report_progress
from rho_actors.governor.recount import recount
from rho_actors.isolation import RunningCall
from rho_actors.isolation.call import CallSpec
from rho_actors.lifecycle import RECORDED_BY_CALLER, PendingCall
from rho_actors.lifecycle.tasks import acknowledgement, runs_as_task
from rho_actors.loop.approval_rules import idempotent
from rho_actors.loop.call_plan import CallPlans
from rho_actors.loop.inline import InlineCall, on_loop
from rho_actors.loop.messages import Allowlist, CancelTurn, SessionWithheld, make_session_folder, tell_loop
from rho_actors.loop.prepare import CallPreparation
from rho_actors.loop.reruns import rerun_tasks
from rho_actors.loop.turn import ResultSink, Slot, Turn, Withheld, result_of, when_cancelled, when_failed, withheld_set
from rho_actors.otp.threads import host_code
from rho_actors.results import failure, traceback_of
from rho_actors.sandbox import Waiter
from rho_actors.tasks import Task
from rho_actors.telemetry import CallSpan, Telemetry, TurnTelemetry
from rho_actors.tool import ErrorKind, ToolCall, ToolResult

if TYPE_CHECKING:
    import asyncio

    from rho_actors.agent.session_lease import SessionLease
    from rho_actors.loop.approvals import SessionApprovals
    from rho_actors.loop.messages import FolderAtStart
    from rho_actors.runtime import Runtime
    from rho_actors.tasks.event_loop import Answering

__all__ = ["ResultSink", "Turns"]


class _Chain(threading.local):
    """Per thread, one for all sessions: ``held``, the exclusive turn whose calls this
    thread starts in turn and their queue (``None`` on a thread that starts none: the
    class's value, read without an ``AttributeError`` raised and cleared)."""

    held: tuple[Turn, list[int]] | None = None


_CHAIN = _Chain()


class Turns(CallPreparation):
    """One session's turns (see the module doc): safe from any thread. Built by the
    session's LoopActor (``ref`` is its ref: the calls' ``ctx["loop"]``, and where a
    cancel token's ``CancelTurn`` goes). ``withheld``: the names, or the session's
    :class:`SessionWithheld`, which :meth:`set_withheld` updates too (a restart of the
    loop starts with the names withheld last)."""

    def __init__(
        self, *, ref: pykka.ActorRef[Any], session_id: str, data_dir: Path, deps: Any,
        withheld: frozenset[str] | SessionWithheld, runtime: Runtime, allowed: Allowlist | None = None,
        approvals: SessionApprovals | None = None, folder: tuple[int, int] | None = None,
        at_start: FolderAtStart | None = None, lease: SessionLease | None = None,
    ) -> None:
        self.ref = ref
        self.session_id = session_id
        self._data_dir = data_dir
        self._folder = folder  # the identity start_loop checked the folder with (None: it was missing)
        self.folder_made = False
        """Whether the session's folder was made (checked) by these turns: before the first call is dispatched."""
        self.lease = lease
        """The session's lease (:mod:`~rho_actors.agent.session_lease`): held from the folder's making on."""
        self._deps = deps
        # a call's ctx: the session's fields, copied for each call, which sets its own (None here) in place
        self._fields: dict[str, Any] = {
            "session_id": session_id, "call_id": None, "data_dir": data_dir, "loop": ref, "withheld": None,
            "deadline": None, "cancel": None, "deps": deps, "whereis": runtime.names.whereis, "progress": None,
        }
        # the session's names, shared with its loop's restarts; the snapshot made of them
        self._kept = withheld if isinstance(withheld, SessionWithheld) else SessionWithheld(withheld)
        self._snapshot = withheld_set(self._kept.names)
        self._allowed = allowed
        self.approvals = approvals  # the session's pending calls (loop/approvals.py), kept across restarts
        self.max_output_chars = runtime.limits.max_output_chars
        self._runtime = runtime
        self._tools = runtime.tools
        self._limits = runtime.limits
        self._budgets = runtime.budgets
        self._events = runtime.events
        self._telemetry = runtime.telemetry
        self._tasks = runtime.tasks
        self.plans = CallPlans(runtime.isolations, runtime.plans)  # what each tool's calls start with: the system's
        self._turns: dict[int, Turn] = {}  # admitted, unfinished turns; finished from call threads too
        self._lock = threading.Lock()  # guards admission into ``_turns`` and ``closed`` (a turn leaves by one pop)
        self.closed: str | None = None  # once closed: the key of the result open calls got
        self._turn_ids = itertools.count(1)
        # arguments texts found valid, by (tool name, text): the entry they were valid for and
        # the decoded value marshalled (decoded, checked once)
        self._valid: dict[tuple[str, str], tuple[ToolEntry, bytes]] = {}
        # the last offer, by version: its entries and their schemas marshalled in chunks (offered() copies)
        self._offer: tuple[int, Withheld, tuple[ToolEntry, ...], tuple[bytes, ...] | None] | None = None
        self._resumed: dict[str, Task] = {}  # tasks run again after a crash, by call id, until dispatched
        found = at_start.take() if at_start is not None else None  # what start_loop listed: the first turns only
        recount(runtime.governor.budgets, session_id, data_dir, runtime.tools.current.entries, found)  # its counts
        rerun_tasks(session_id, data_dir, runtime.tools.current.entries, self._tasks, self._resumed, self.submit,
                    found=found, attach=None if approvals is None else  # the tasks read first, then the open calls
                    functools.partial(approvals.attach, self, runtime, found=found))

    def running(self) -> list[dict[str, Any]]:
        """The calls running now: ``call_id``, ``tool`` and ``ms_left`` to the deadline."""
        now = time.monotonic()
        with self._lock:
            turns = list(self._turns.values())
        return [
            {
                "call_id": slot.call.id,
                "tool": slot.entry.info.name,
                "ms_left": round((slot.started + slot.entry.info.timeout_ms / 1000 - now) * 1000, 1),
            }
            for turn in turns
            for slot in turn.slots
            if slot.entry is not None and slot.started and slot.result is None
        ]

    # --- a turn -------------------------------------------------------------------------

    def submit(
        self, calls: tuple[ToolCall, ...], future: ResultSink, *,
        telemetry: TurnTelemetry | None = None, cancel: CancelToken | None = None,
        context: contextvars.Context | None = None,
        on_result: Callable[[int, ToolResult], None] | None = None, aio: asyncio.AbstractEventLoop | None = None,
        approved: bool = False, background: bool | frozenset[str] = False, chooses: bool = False,
        on_start: Callable[[int], None] | None = None, waiter: Waiter | None = None, own_context: bool = False,
    ) -> int | None:
        """Prepare and start a turn of ``calls`` in this thread; ``future`` gets their
        results; ``telemetry``: what its calls report to (:meth:`rho_actors.Telemetry.turn`,
        decided once per turn); ``approved``: its calls were approved (none is held for
        approval); ``background``: the ids of the calls to run as tasks when their tool
        allows it (``background="optional"``), or ``True`` for all of them; ``chooses``:
        the model may ask for that too (a call's ``run_in_background``; else passing it
        is ``invalid_arguments``); ``waiter``: this thread waits for the results alone
        (``run_turn``), given to a one-call turn's call (DESIGN §5 "A call's path");
        ``own_context``: ``context`` is the turn's own copy, which nothing else runs in (a
        one-call turn's call runs in it, not in a copy of it); see
        :class:`~rho_actors.loop.messages.RunTurn` for the rest. Returns the turn's id (for
        :meth:`cancel_from_host`), ``None`` when it was not admitted. Never raises: a turn of a
        closed loop gets ``turn_not_started`` results, a bug an error result for each call."""
        try:  # from its first line: an interrupt anywhere before admission answers every call
            turn: Turn | None = None
            refused: list[Slot] = []
            held: list[tuple[ToolCall, PendingCall]] = []
            admitted = False
            recorded: Callable[[], None] | None = None  # releases the turn's results once its held are recorded
            if self.closed is not None:
                future.set_result([failure("turn_not_started", c.id, c.name) for c in calls])
                return None
            withheld, names = self._snapshot, self._kept.names  # the snapshot, remade only when they changed
            if withheld.names is not names:
                withheld = self._withheld
            slots = [Slot(0, calls[0])] if len(calls) == 1 else list(map(Slot, range(len(calls)), calls))
            turn = Turn(next(self._turn_ids), slots, future, withheld.listed, context, own_context, telemetry,
                        on_result, on_start, aio, background,  # in its fields' order: keywords were half of making it
                        self.approvals is not None and not RECORDED_BY_CALLER.get())
            if cancel is None or not cancel.cancelled:
                held = self._prepare_turn(turn, refused, withheld.names, chooses, approved, waiter)
            if held and turn.journal and aio is not None:  # recorded on a pool thread: its results wait for that
                recorded = self._gated(turn)
            # one call, nothing refused (or held), no token to hook, the folder made, never a task (none resumed
            # either), no span: admitted as it is dispatched (nothing made before outlives a turn not admitted)
            quick = (not refused and cancel is None and turn.open == 1 and self.folder_made and telemetry is None
                     and not self._resumed and slots[0].entry.info.policy.background is False)  # type: ignore[union-attr]
            if not quick:
                with self._lock:
                    admitted = self.closed is None
                    if admitted:
                        self._turns[turn.id] = turn
        except BaseException as exc:  # an interrupt as it was made or prepared: nothing it held waits, all answered
            release = locals().get("recorded")
            if release is not None:  # nothing is recorded: the results go at once
                release()
            self._unprepared(locals().get("turn"), calls, future, describe_exception(exc))
            raise
        if quick:  # dispatched here (no chain, no loop), admitted in the lock round that marks its call started
            try:
                admitted = self._dispatch(turn, 0, True)  # (admit: positional, no keyword parsed)
            except BaseException as exc:  # admitted or not (nothing it held waits): every call is answered
                if self._failed(turn, exc, None):
                    raise
                return turn.id
        if not admitted:  # the loop stopped while the turn was being prepared: none of its calls waits either
            self._let_go(refused, failure("turn_not_started", "", ""))
            future.set_result([failure("turn_not_started", c.id, c.name) for c in calls])
            return None
        if quick:
            return turn.id
        try:
            if held and turn.journal:  # admitted: its held calls are recorded, durable before their results are given
                assert self.approvals is not None
                self.approvals.record(held, off_thread=aio is not None, then=recorded)
            self._admitted(turn, refused, cancel)
        except BaseException as exc:
            if self._failed(turn, exc, recorded):
                raise
        return turn.id

    def _failed(self, turn: Turn, exc: BaseException, recorded: Callable[[], None] | None) -> bool:
        """A submitted turn's start raised ``exc``: every call still without a result is
        answered, a bug's logged; whether ``exc`` is raised on (an interrupt: a signal handler's,
        in the host's thread too). The held calls' results are released first (their record
        maybe never handed over): never held back for good."""
        if recorded is not None:
            recorded()
        if isinstance(exc, Exception):
            logger.exception("loop {} failed to run a turn", self.session_id)
            self._fail_open(turn, failure("loop_failed", "", "", problem=repr(exc)))
            return False
        self._fail_open(turn, failure("turn_interrupted", "", "", problem=describe_exception(exc)))
        return True

    def _admitted(self, turn: Turn, refused: list[Slot], cancel: CancelToken | None) -> None:
        for slot in refused:
            assert slot.result is not None
            self._telemetry.call_refused(turn.telemetry, self.session_id, slot.result, slot.call.arguments)
            self._emit("finished", slot, slot.result)
        if cancel is not None:
            if cancel.cancelled:  # cancelled before it started: no call starts
                self._cancel_turn(turn)
                return
            hook = functools.partial(self.cancel_from_host, turn.id)  # holds no turn: the turn holds it
            turn.hooked = (cancel, hook)  # forgotten by the token once the turn is done: it may serve many
            cancel.add_inline_callback(hook)
            with turn.lock:
                done = turn.finished
            if done:  # finished meanwhile (its loop stopped), before the callback was there to forget
                cancel.remove_callback(hook)
        if turn.open == 0:
            with turn.lock:
                finished, turn.finished = turn.finished, True
            if not finished:  # else the host cancelled it meanwhile, and that finished it
                self._finish(turn)
            return
        if not self.folder_made:
            try:
                self.make_folder()
            except OSError as exc:  # a symlink in its place, another host serving the session: no call starts
                logger.error("loop {}: the session folder cannot be used: {}", self.session_id, exc)
                self._fail_open(turn, failure("not_started", "", "", problem=f"the session folder: {exc}"))
                return
        self._dispatch_ready(turn)

    def make_folder(self) -> None:
        """Make (check) the session's folder and hold its lease, as before its first call;
        raises as :func:`~rho_actors.loop.messages.make_session_folder`."""
        make_session_folder(self._data_dir, self._folder, self.lease)
        self.folder_made = True

    def _dispatch_ready(self, turn: Turn) -> None:
        """Start the turn's waiting calls: all of them, or the first of an exclusive turn
        (each later one is started by the thread settling the one before)."""
        while True:
            with turn.lock:
                if not turn.waiting or turn.stop_reason is not None:
                    return
                index = turn.waiting.popleft()
            if turn.exclusive:  # its later calls are started one by one, in this thread's chain
                self._start(turn, index)
                return
            self._dispatch(turn, index)  # no call of this turn starts another: no chain to keep

    def _start(self, turn: Turn, index: int) -> None:
        """Dispatch call ``index``, then, in this thread, each call of an exclusive turn
        whose turn came while it started (a call refused at its start, or one whose first
        step settled it, settles at once): one after another, never nested, however long
        the turn. Another turn started meanwhile on this thread (by a tool's first step
        run in the dispatch, say) gets its own chain at once: it may be waited for there."""
        local = _CHAIN
        outer = local.held
        if outer is not None and outer[0] is turn:  # inside this turn's dispatch: its loop below starts it
            outer[1].append(index)
            return
        chain = [index]  # the turn's calls to start here, in order (a list: seldom more than one)
        local.held = (turn, chain)
        try:
            while chain:
                self._dispatch(turn, chain.pop(0))
        finally:
            local.held = outer

    def _dispatch(self, turn: Turn, index: int, admit: bool = False) -> bool:
        """Start call ``index`` in its isolation (from the submitting thread, or from the
        thread that settled the call before it in an exclusive turn). ``admit``: the turn,
        its one call waiting (never a task, no span), is admitted here too (:meth:`submit`),
        in the lock round that marks the call started (nothing can have stopped a turn not
        admitted yet): whether it was (``False``: the loop has closed, nothing was started)."""
        slot = turn.slots[index]
        entry, args = slot.entry, slot.args
        assert entry is not None and args is not None
        plan = self._runtime.plans.get(entry.info.name)  # made once per registration (CallPlans.of's look, inline)
        if plan is None or plan.entry is not entry:  # not this very entry's (or none yet)
            plan = self.plans.of(entry)
        resumed = self._resumed.pop(slot.call.id, None) if self._resumed else None
        task, timeout_ms = ((None, plan.timeout_ms) if resumed is None and plan.plain else
                            (resumed, self._tasks.timeout_ms(entry.info)) if resumed is not None else
                            self._tasks.open(self.session_id, self._data_dir, slot.call.id, entry.info,
                                             args if idempotent(entry) else None)
                            if runs_as_task(entry.info.policy.background, turn.background, slot.call.id, slot.asked)
                            or (entry.info.policy.background == "optional"  # approved: its held task goes on
                                and self._tasks.holds(self.session_id, slot.call.id))
                            else (None, entry.info.timeout_ms))
        if isinstance(task, ToolResult):  # a background call past a bound: refused
            return self._not_started(turn, slot, None, task)
        now = time.monotonic()
        # the tool's own time, after what its isolation may take to start it (a worker process); max(), inline
        own_s = timeout_ms / 1000 - slot.validated_s
        deadline = now + plan.start_bound_s + (own_s if own_s > 0.0 else 0.0)
        cancel = CancelToken()
        fields = self._fields.copy()  # the session's own, in the ctx's order (a copy: no insert for them); the call's:
        fields["call_id"], fields["withheld"], fields["deadline"], fields["cancel"], fields["progress"] = (
            slot.call.id, turn.withheld, deadline, cancel,
            functools.partial(report_progress, self._events, self.session_id, slot.call.id, plan.name))
        span = None if turn.telemetry is None else self._telemetry.call_started(  # None: nothing configured
            turn.telemetry, self.session_id, slot.call.id, entry.info.name, entry.isolation, slot.call.arguments
        )
        if span is not None:
            fields.update(Telemetry.ctx_fields(span))  # "traceparent": the call's span
        # a turn awaited on an event loop runs an async tool's call there; a task runs on the tasks' own loop
        inline = (turn.aio is not None or task is not None) and plan.inline
        settle: Callable[[ToolResult], None] = (functools.partial(self._settle, turn, slot) if task is None  # no frame
                                                else functools.partial(self._tasks.settle, task))
        answering = self._tasks.event_loop.answering(settle) if inline and task is not None else None
        spec = CallSpec(
            slot.call.id, plan.name, entry.tool, args, MappingProxyType(fields), now, deadline,
            timeout_ms, cancel, self._limits.max_output_chars, answering or settle,
            turn.context if turn.context is None or (turn.own_context and len(turn.slots) == 1)  # its own
            else turn.context.copy(),
            None if turn.on_start is None or task is not None else functools.partial(turn.on_start, slot.index),
            None if task is not None or inline else turn.waiter,
        )
        if admit:  # no task, no span (submit's look): nothing made so far outlives a turn not admitted
            with self._lock:
                if self.closed is not None:
                    return False
                self._turns[turn.id] = turn
                turn.waiting.popleft()
                slot.started, slot.deadline, slot.cancel, slot.span = now, deadline, cancel, span
        else:
            with turn.lock:
                dropped = turn.stop_reason is not None
                if not dropped:
                    slot.started, slot.deadline, slot.cancel, slot.span = now, deadline, cancel, span
            if dropped:  # cancelled, or the loop stopped, since it left ``waiting``: it has its result
                return self._dropped(slot, span, task)
        if self._events.wants_calls("started"):  # asked here: no frame when nobody listens
            self._emit_event("started", slot, None)
        try:
            # a task outlives its turn (and the caller's event loop): it runs on the tasks' event loop
            aio = None if not inline else turn.aio if task is None else self._tasks.event_loop.get()
            start: Any = (plan.isolation.start if aio is None else
                          functools.partial(InlineCall.start, aio, stopping=self._runtime.calls.closed))
            running: RunningCall = self._runtime.governor.start(entry, spec, self.session_id, start, inline)  # bounds
        except (pykka.ActorDeadError, pykka.Timeout) as err:
            return self._not_started(turn, slot, task, failure("not_started", slot.call.id, entry.info.name,
                                                               problem=err))
        if task is not None:  # a task: it runs on past its turn, which has its acknowledgement now
            return self._task_started(turn, slot, task, running, spec, answering)
        with turn.lock:
            if slot.result is None:  # else answered already (its running call holds this slot: no cycle)
                slot.running = running
            stop_reason = turn.stop_reason
        if stop_reason is not None:  # cancelled, or the loop stopped, while the call was being started
            running.cancel(stop_reason)
        return True

    def _dropped(self, slot: Slot, span: CallSpan | None, task: Task | None) -> bool:
        """Call ``slot``, about to start, was answered (its turn cancelled, or its loop stopped): not started."""
        self._telemetry.call_ended(span, slot.result)  # type: ignore[arg-type]
        if task is not None:
            self._tasks.discard(task)
        return True

    def _task_started(self, turn: Turn, slot: Slot, task: Task, running: RunningCall, spec: CallSpec,
                      answering: Answering | None) -> bool:
        """Call ``slot`` was started as ``task``, which runs on past its turn: the turn has its acknowledgement now."""
        self._tasks.started(task, running, spec.deadline)
        if answering is not None:  # on the tasks' event loop: its deadline kept off the loop too
            answering.arm(self._runtime.timers, spec)
        self._settle(turn, slot, acknowledgement(task.task_id, slot.call.id, spec.name))
        return True

    def _not_started(self, turn: Turn, slot: Slot, task: Task | None, refusal: ToolResult) -> bool:
        """Call ``slot`` could not be started: ``refusal`` is its result (and its task's)."""
        if task is not None:
            self._tasks.settle(task, refusal)
        self._settle(turn, slot, refusal)
        return True

    def _settle(self, turn: Turn, slot: Slot, result: ToolResult) -> None:
        """Record a dispatched call's result, from whichever thread has it: the first answer wins, a
        later one is ``late``. Ends the call's span, starts the next call of an exclusive turn, or
        completes the turn once this was its last open call. A bug here still answers every call of the turn."""
        try:
            following: int | None = None
            last = False
            with turn.lock:
                late = slot.result is not None
                if not late:
                    if result.error_kind is ErrorKind.DEFERRED and self.approvals is not None and slot.args is not None:
                        result = self.approvals.defer(slot.call, slot.args, result, turn.journal,  # loop.resolve
                                                      self._gated(turn) if turn.journal else None)
                    size = (len(result.content) if result.content.isascii() and not result.blocks and not result.images
                            else result_bytes(result))  # charged inline, every call (an ASCII text alone: its length)
                    over = self._budgets.charge(self.session_id, turn.id, size, alone=len(turn.slots) == 1)
                    if over is not None:
                        result = over_budget(self.session_id, result, size, over, self._limits.max_output_chars)
                    slot.result, slot.running = result, None  # answered: nothing to cancel (and no cycle kept)
                    turn.open -= 1
                    if turn.exclusive and turn.waiting and turn.stop_reason is None:
                        following = turn.waiting.popleft()
                    last = turn.open == 0 and not turn.finished
                    turn.finished = turn.finished or last
            if late:
                self._emit("late", slot, result)
                return
            if slot.span is not None:
                self._telemetry.call_ended(slot.span, result)
            if not result.ok and self._limits.log_tracebacks:
                trace = traceback_of(result)
                if trace is not None:
                    logger.error("session {}: tool {} {} in call {}:\n{}", self.session_id, result.name,
                                 result.error_kind, result.call_id, trace)
            event: EventKind = "timed_out" if result.error_kind is ErrorKind.TIMEOUT else "finished"
            if self._events.wants_calls(event):  # asked here: no frame when nobody listens
                self._emit_event(event, slot, result)
            if turn.on_result is not None:
                self._tell_host(turn, slot, result)
            if following is not None:
                self._start(turn, following)
            elif last:
                last = False  # finishing it now: not again below
                self._finish(turn)
        except Exception as exc:  # a bug here (or host code it ran) must still answer every call
            logger.exception("loop {} could not settle call {}", self.session_id, slot.call.id)
            if last:  # marked finished here (every call has its result): the turn is completed as it is
                self._finish(turn)
            else:
                self._fail_open(turn, failure("loop_failed", "", "", problem=repr(exc)))

    def cancel_from_host(self, turn_id: int) -> None:
        """The host cancelled turn ``turn_id`` (its token, or its awaiting task): in the host's own
        step when that is quick work there, else by the LoopActor, or here when it has no thread."""
        if self._inline_only(turn_id) or not tell_loop(self.ref, CancelTurn(turn_id)):
            self.cancel_turn(turn_id)

    def cancel_turn(self, turn_id: int) -> None:
        """The host cancelled turn ``turn_id`` (a no-op once it has finished)."""
        with self._lock:
            turn = self._turns.get(turn_id)
        if turn is not None:
            self._cancel_turn(turn)

    def _inline_only(self, turn_id: int) -> bool:
        """Whether turn ``turn_id`` is open, awaited on the event loop this thread runs,
        and each of its running calls runs there too (:mod:`rho_actors.loop.inline`):
        cancelling it then is quick work on that loop (no thread, process or remote call
        to stop), done in the cancelling step."""
        with self._lock:
            turn = self._turns.get(turn_id)
        aio = None if turn is None else turn.aio
        if turn is None or aio is None or not on_loop(aio):
            return False
        with turn.lock:
            return all(slot.running is None or isinstance(slot.running, InlineCall) for slot in turn.slots)

    def _cancel_turn(self, turn: Turn) -> None:
        """Each running call is cancelled through its isolation (``ctx["cancel"]`` set, a
        worker process killed; what it returns later is ``late``), and every call still
        without a result gets a ``cancelled`` one (a queued call of an exclusive turn
        never starts)."""
        self._end_turn(turn, "cancelled", when_cancelled)

    def _finish(self, turn: Turn) -> None:
        """Complete the turn's future with its results in the model's order (once: its caller set it finished)."""
        self._turns.pop(turn.id, None)  # one dict operation, atomic: no lock round (admission and close take it)
        if turn.hooked is not None:
            turn.hooked[0].remove_callback(turn.hooked[1])
        slots = turn.slots
        if len(slots) == 1:  # a one-call turn kept no share of its own
            results: list[ToolResult] = [slots[0].result]  # type: ignore[list-item]  # it has its result
        else:  # each has its result: the turn is finished (an empty turn has none)
            if slots:
                self._budgets.turn_done(self.session_id, turn.id)
            results = list(map(result_of, slots))
        try:
            if not getattr(turn.future, "runs_host_code", True):  # a latch or a landing: no code of the host's here
                turn.future.set_result(results)
                return
            with host_code():  # the future's done callbacks are the host's
                turn.future.set_result(results)
        except BaseException:  # a done callback's SystemExit (futures catch only Exception): set, and logged
            logger.exception("loop {}: a callback of turn {}'s results raised", self.session_id, turn.id)

    def _fail_open(self, turn: Turn, failed: ToolResult) -> None:
        """Give every call of ``turn`` still without a result the error of ``failed``
        (its kind and text), cancel those running, and complete the turn."""
        self._end_turn(turn, "stopping", functools.partial(when_failed, failed))

    def _end_turn(self, turn: Turn, reason: str, answer: Callable[[Slot, float], ToolResult]) -> None:
        """End ``turn`` at once (``reason``: ``"cancelled"`` by the host, ``"stopping"``:
        the loop stops or failed), unless it has ended: nothing more starts, each running
        call is cancelled through its isolation with ``reason``, each call without a
        result gets ``answer(slot, now)`` (an event each), then the turn completes."""
        now = time.monotonic()
        running: list[RunningCall] = []
        settled: list[Slot] = []
        with turn.lock:
            if turn.finished:
                return
            turn.stop_reason = reason
            turn.finished = True
            turn.waiting.clear()
            turn.open = 0
            for slot in turn.slots:
                if slot.result is not None:
                    continue
                if slot.running is not None:  # else the dispatching thread cancels it once started
                    running.append(slot.running)
                slot.result = answer(slot, now)
                settled.append(slot)
        try:
            for call in running:
                call.cancel(reason)
            for slot in settled:
                assert slot.result is not None
                self._telemetry.call_ended(slot.span, slot.result)
                self._emit("finished", slot, slot.result)
                if turn.on_result is not None and slot.started:  # a started call's result, as _settle gives it
                    self._tell_host(turn, slot, slot.result)
        except Exception:  # a bug, or the host's code: logged; the turn, marked finished above, is completed
            logger.exception("loop {} could not end turn {}", self.session_id, turn.id)
        self._finish(turn)

    def _tell_host(self, turn: Turn, slot: Slot, result: ToolResult) -> None:
        """``on_result(index, result)`` of the turn's host; what it raises is logged."""
        assert turn.on_result is not None
        try:
            with host_code():  # it may run a turn itself: no call held back for it
                turn.on_result(slot.index, result)
        except BaseException:  # the host's callback (a SystemExit too): its fault must not lose the turn
            logger.exception("loop {}: on_result for call {} raised", self.session_id, slot.call.id)

    def _emit(self, kind: Any, slot: Slot, result: ToolResult | None) -> None:
        if self._events.wants_calls(kind):  # else nobody listens: no event built, no line logged
            self._emit_event(kind, slot, result)

    def _emit_event(self, kind: Any, slot: Slot, result: ToolResult | None) -> None:
        """Build and emit a call's :class:`CallEvent` (someone listens: :meth:`EventBus.wants_calls`)."""
        with host_code():  # its subscribers are the host's
            self._events.emit(CallEvent.of(kind, self.session_id, slot.call, result))

    # --- the end ------------------------------------------------------------------------

    def close(self, key: str) -> None:
        """Refuse new turns from now on and give every open call the result ``key``
        (``"session_stopped"``, ``"loop_crashed"``), cancelling those running. Once
        only: a second close does nothing."""
        with self._lock:
            if self.closed is not None:
                return
            self.closed = key
            turns = list(self._turns.values())
        for turn in turns:
            self._fail_open(turn, failure(key, "", ""))
