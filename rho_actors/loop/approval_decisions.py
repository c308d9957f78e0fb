"""Deciding a session's held calls in this host (DESIGN §4 "Approvals"):
:class:`ApprovalDecisions`, the base of :class:`~rho_actors.loop.approvals.SessionApprovals`
(which holds the calls: the gate), itself on
:class:`~rho_actors.loop.approval_journal.ApprovalJournal` (the transcript side).

- **deciding**: :meth:`~ApprovalDecisions.approve` (optionally edited arguments,
  validated again; the approval binds to the SHA-256 of the arguments that run),
  :meth:`~ApprovalDecisions.reject`, :meth:`~ApprovalDecisions.resolve` and the expiry.
  Each decision is made once: claimed in memory, and, for a call the session's
  transcript records, appended to the transcript under its ``flock`` after checking that
  no other process decided it first. An approved call's ``running`` record is written
  before it starts, so a host killed mid-call never runs it again (its outcome is
  unknown: ``cancelled``); it runs as a turn of its own and gets one result, recorded
  once, whoever gives it first (``_Once``: the approving thread, or the turn once that
  thread was interrupted).
- **the result, to whoever waits for it**: :meth:`~ApprovalDecisions.when_decided` is a
  future of a call's result (one decided before it is asked for is kept for it:
  ``_KEPT_OUTCOMES``); :meth:`~ApprovalDecisions.host_stopped` tells the waiters of the
  calls not decided when the session's loop stops.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from loguru import logger

from rho_actors.declarations.arguments import MAX_VALIDATION_S, ArgumentsError, decode_arguments, violations
from rho_actors.declarations.toolset import ToolEntry
from rho_actors.encoding import describe_exception
from rho_actors.events import CallEvent
from rho_actors.lifecycle import arguments_sha256
from rho_actors.loop.approval_journal import ApprovalJournal, Held
from rho_actors.loop.approval_rules import output_problems
from rho_actors.loop.decisions import ApprovalError
from rho_actors.results import error_result, failure, result_from_return, text
from rho_actors.tool import DEFAULT_TIMEOUT_MS, ToolCall, ToolResult

if TYPE_CHECKING:
    from rho_actors.runtime import Runtime

__all__ = ["ApprovalDecisions", "Turns"]

_GRACE_S = 10.0  # past an approved call's timeout, how long its result is waited for
_KEPT_DECISIONS = 10_000  # decided call ids remembered per session, to name the first decision
_KEPT_OUTCOMES = 32  # results of a turn run directly's decided calls not asked for yet (when_decided)


class Turns(Protocol):
    """What deciding needs of a session's :class:`~rho_actors.loop.turns.Turns`."""

    closed: str | None
    max_output_chars: int

    def offered_entries(self) -> tuple[ToolEntry, ...]: ...

    def submit(self, calls: tuple[ToolCall, ...], future: Any, *, approved: bool = False) -> object: ...


class ApprovalDecisions(ApprovalJournal):
    """The decisions on one session's pending calls, and their results to whoever waits
    for them (see the module doc); the session's
    :class:`~rho_actors.loop.approvals.SessionApprovals` holds the state and the calls."""

    _waiters: dict[str, list[concurrent.futures.Future[ToolResult]]]
    _outcomes: dict[str, ToolResult]
    _turns: Turns | None
    _runtime: Runtime | None

    # --- the result, to whoever waits for it ----------------------------------------------

    def when_decided(self, call_id: str) -> concurrent.futures.Future[ToolResult]:
        """A future of call ``call_id``'s result, set once it is decided (by this host
        or, through the transcript, another process) and, approved, has run. A call of a
        turn run directly decided before this is asked (between its turn's result and this
        call) is found too: its result is kept until asked for (the last
        ``_KEPT_OUTCOMES`` of the session). Raises :class:`ApprovalError` when no such call
        waits, runs or was decided so."""
        future: concurrent.futures.Future[ToolResult] = concurrent.futures.Future()
        with self._lock:
            outcome = self._outcomes.pop(call_id, None)
            if outcome is None:
                if call_id not in self._held and call_id not in self._in_flight:
                    raise ApprovalError(f"no call {call_id!r} waits for a decision in session {self.session_id!r}")
                self._waiters.setdefault(call_id, []).append(future)
                return future
        future.set_running_or_notify_cancel()
        future.set_result(outcome)
        return future

    def host_stopped(self) -> None:
        """The session's loop stopped normally (its host's stop, ``loop.stop``): each
        :meth:`when_decided` waiter of a call not decided is told at once (as OTP tells a
        caller whose server went down), an :class:`ApprovalError` naming the call; the call
        stays held in the transcript, for a host started later on the data folder."""
        with self._lock:
            told = {c: self._waiters.pop(c) for c in list(self._waiters) if c not in self._in_flight}
        for call_id, futures in told.items():
            error = ApprovalError(f"call {call_id!r} of session {self.session_id!r} was not decided before its host "
                                  "stopped; it stays held in the session's transcript for the next host")
            for future in futures:
                if future.set_running_or_notify_cancel():
                    future.set_exception(error)

    def _answered(self, call_id: str, result: ToolResult, held: Held | None = None) -> None:
        """``result`` is call ``call_id``'s: to its :meth:`when_decided` futures (``held``,
        a call that ran: it leaves the calls in flight in the same step)."""
        with self._lock:
            if held is not None:
                self._in_flight.pop(call_id, None)
            waiting = self._handed(call_id, result, held)
        _give(waiting, result)

    def _handed(self, call_id: str, result: ToolResult, held: Held | None) -> list[concurrent.futures.Future[Any]]:
        """(Under the lock.) The futures waiting for ``call_id``'s ``result``; none: kept
        for a later :meth:`when_decided` when ``held`` is a turn run directly's call."""
        waiting = self._waiters.pop(call_id, [])
        if not waiting and held is not None and held.recorded is not None:
            if len(self._outcomes) >= _KEPT_OUTCOMES:
                del self._outcomes[next(iter(self._outcomes))]
            self._outcomes[call_id] = result
        return waiting

    # --- deciding -------------------------------------------------------------------------

    def approve(self, call_id: str, arguments: Mapping[str, Any] | str | None = None,
                decided_by: str | None = None) -> ToolResult:
        """Run the pending call ``call_id`` once and return its result (see
        :meth:`rho_actors.Loop.approve`)."""
        held = self._claim(call_id, "approval")
        try:
            args = held.args
            if arguments is not None:
                problem = self._edited(held, arguments)
                if isinstance(problem, ToolResult):
                    self._unclaim(held)
                    return problem
                args = problem
            sha = arguments_sha256(args)
            edited = {"arguments": args} if arguments is not None else {}
            with self._journal(held) as journal:
                if journal is not None:
                    transcript, track = journal
                    transcript.call(track.step, track.index, "decided", call_id=call_id, name=held.pending.name,
                                    decision="approved", decided_by=decided_by, arguments_sha256=sha, sync=False,
                                    **edited)
                    transcript.call(track.step, track.index, "running", call_id=call_id, name=held.pending.name,
                                    arguments_sha256=sha, attempt=1)
        except BaseException:
            self._unclaim(held)
            raise
        self._decide(held, "approved", decided_by, running=True)
        return self._run(held, args)

    def reject(self, call_id: str, message: str, decided_by: str | None = None) -> ToolResult:
        """Give the pending call ``call_id`` a ``rejected`` result with ``message`` as
        the model's text (see :meth:`rho_actors.Loop.reject`)."""
        if not isinstance(message, str) or not message.strip():
            raise ValueError("a rejection needs a message for the model (a non-empty str)")
        held = self._claim(call_id, "approval")
        result = failure("rejected", call_id, held.pending.name, message=message)
        self._settle(held, "rejected", decided_by, result, message=message)
        return result

    def resolve(self, call_id: str, output: Any) -> ToolResult:
        """Give the deferred call ``call_id`` its result from ``output`` (what a tool's
        ``run`` may return) (see :meth:`rho_actors.Loop.resolve`)."""
        held = self._claim(call_id, "external")
        max_chars = 100_000 if self._turns is None else self._turns.max_output_chars
        try:
            problems = output_problems(self._entry(held.pending.name), output)
            if problems:
                raise ValueError(f"call {call_id}: the output does not match tool {held.pending.name!r}'s output "
                                 f"schema: {'; '.join(problems)}; the call is still pending")
            result = result_from_return(call_id, held.pending.name, output, max_chars, 0.0)
        except BaseException:
            self._unclaim(held)
            raise
        self._settle(held, "resolved", None, result)
        return result

    def _expire(self, call_id: str) -> None:
        try:
            held = self._claim(call_id, "approval")
        except ApprovalError:
            return  # decided meanwhile
        if held.deadline is not None and time.monotonic() < held.deadline - 0.001:  # early: again at its deadline
            self._unclaim(held)
            self._arm(held)
            return
        result = failure("approval_expired", call_id, held.pending.name, call=call_id, timeout_s=self.timeout_s)
        try:  # a record that cannot be written is logged, the call answered all the same (_expiry_journal)
            self._settle(held, "expired", None, result, must=True)
        except ApprovalError as exc:  # decided by another process first: acted on once let go (_unclaim)
            logger.warning("session {}: call {} could not expire now: {}", self.session_id, call_id, exc)

    def _settle(self, held: Held, decision: str, decided_by: str | None, result: ToolResult, *, must: bool = False,
                **fields: Any) -> None:
        """Record ``decision`` and its ``result`` at once (a decision that runs nothing)."""
        try:
            with (self._expiry_journal if must else self._journal)(held) as journal:
                if journal is not None:
                    transcript, track = journal
                    transcript.call(track.step, track.index, "decided", call_id=held.pending.call_id,
                                    name=held.pending.name, decision=decision, decided_by=decided_by,
                                    arguments_sha256=held.pending.arguments_sha256, sync=False, **fields)
                    transcript.result(track.step, track.index, result)
        except BaseException:
            self._unclaim(held)
            raise
        self._decide(held, decision, decided_by, result=result)

    def _claim(self, call_id: Any, kind: str) -> Held:
        """The held call ``call_id``, claimed for one decision; raises :class:`ApprovalError`."""
        if not isinstance(call_id, str):
            raise TypeError(f"call_id must be a str, got {type(call_id).__name__}")
        with self._lock:
            held = self._held.get(call_id)
            if held is None:
                first = self._decided.get(call_id)
                if first is not None:
                    raise ApprovalError(f"call {call_id} of session {self.session_id!r} is decided already: {first}")
                raise ApprovalError(f"no call {call_id!r} waits for a decision in session {self.session_id!r} "
                                    "(an unknown call id, or another session's call)")
            if held.claimed:
                raise ApprovalError(f"call {call_id} of session {self.session_id!r} is being decided already")
            if held.pending.kind != kind:
                what = "a result from outside: resolve" if held.pending.kind == "external" else "approval: decide"
                raise ApprovalError(f"call {call_id} waits for {what} it")
            if held.after is not None and held.after in self._held:
                raise ApprovalError(f"call {call_id} runs after call {held.after} of its exclusive turn: "
                                    f"decide {held.after} first")
            held.claimed = True
            return held

    def _unclaim(self, held: Held) -> None:
        """Let go of ``held``'s claim; one that found it decided by another process
        meanwhile acts on that decision (on a pool thread): the look for decisions
        passed it over while it was claimed, and no decision is left unacted on; one
        past its deadline expires (:meth:`_claim_let_go`)."""
        with self._lock:
            held.claimed = False
            track, held.elsewhere = held.elsewhere, None
        self._claim_let_go(held, track)

    def _decide(self, held: Held, decision: str, decided_by: str | None, *, running: bool = False,
                first: str | None = None, result: ToolResult | None = None) -> None:
        """``held`` is decided: forgotten as pending, its decision remembered (``first``:
        as the transcript tells one made elsewhere, not announced here) and announced (a
        ``decided`` event and span); with ``running``, in flight until :meth:`_record`
        has its result; with ``result`` (a decision that runs nothing), answered in the
        same step (:meth:`when_decided` never finds it neither waiting nor answered)."""
        call_id = held.pending.call_id
        if held.timer is not None:
            held.timer.cancel()
        by = "" if decided_by is None else f" by {decided_by}"
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        if first is None and self._runtime is not None:
            self._runtime.telemetry.decision(self.session_id, call_id, held.pending.name, decision, decided_by)
            self._runtime.events.emit(CallEvent("decided", self.session_id, call_id, held.pending.name,
                                                f"{decision}{by}"))
        with self._lock:
            self._held.pop(call_id, None)
            if len(self._decided) >= _KEPT_DECISIONS:
                self._decided.clear()
            self._decided[call_id] = first or f"it was {decision}{by} at {when}"
            if running:
                self._in_flight[call_id] = held.pending.name
            idle = not self._held
            waiting = self._handed(call_id, result, held) if result is not None else []
        if result is not None:
            _give(waiting, result)
        if idle and self._poll is not None:
            self._poll.cancel()
            self._poll = None

    def _edited(self, held: Held, arguments: Mapping[str, Any] | str) -> dict[str, Any] | ToolResult:
        """Edited ``arguments`` decoded and validated against the tool's schema now, or
        the ``invalid_json``/``invalid_arguments`` result (the call stays pending)."""
        name = held.pending.name
        entry = self._entry(name)
        try:
            args = decode_arguments(arguments)
        except ArgumentsError as err:
            return error_result(held.pending.call_id, name, err.kind, text("bad_arguments", tool=name, problem=err))
        if entry is None:
            return failure("not_prepared", held.pending.call_id, name, problem="the tool is not offered now")
        problems = violations(entry.validator, args, MAX_VALIDATION_S)
        if problems:
            return failure("invalid_arguments", held.pending.call_id, name, problems="; ".join(problems))
        return args

    def _run(self, held: Held, args: dict[str, Any]) -> ToolResult:
        """Run the approved call as a turn of its own (prepared again: looked up among the
        tools offered now, validated), wait for its result and record it (once).
        Interrupted (a signal handler's ``KeyboardInterrupt`` in the host's thread), the
        call still gets its one result: the turn's, recorded when it comes, or
        ``turn_interrupted`` when the turn was not submitted yet; the interrupt goes on."""
        call = ToolCall(held.pending.call_id, held.pending.name, args)
        once = _Once(functools.partial(self._record, held))
        future: concurrent.futures.Future[list[ToolResult]] = concurrent.futures.Future()
        submitted = False
        try:
            turns = self._turns
            if turns is None or turns.closed is not None:
                return once.give(failure("turn_not_started", call.id, call.name))
            future.set_running_or_notify_cancel()
            future.add_done_callback(once.abandoned_to)
            submitted = True  # from here the turn answers the future, interrupted or not (Turns.submit)
            turns.submit((call,), future, approved=True)
            entry = self._entry(call.name)
            bound = (DEFAULT_TIMEOUT_MS if entry is None else entry.info.timeout_ms) / 1000 + _GRACE_S
            try:
                return once.give(future.result(timeout=bound)[0])
            except concurrent.futures.TimeoutError:
                return once.give(failure("loop_unanswered", call.id, call.name, bound_s=bound))
        except BaseException as exc:
            once.abandon()
            if future.done():
                once.give(future.result()[0])
            elif not submitted:
                once.give(failure("turn_interrupted", call.id, call.name, problem=describe_exception(exc)))
            raise

    def _entry(self, name: str) -> ToolEntry | None:
        """The entry of tool ``name`` among those the loop offers now."""
        turns = self._turns
        for entry in () if turns is None else turns.offered_entries():
            if entry.info.name == name:
                return entry
        return None

    def _record(self, held: Held, result: ToolResult) -> None:
        try:
            with self._journal(held, claimed=False) as journal:
                if journal is not None:
                    transcript, track = journal
                    transcript.result(track.step, track.index, result, sync=False)  # durable by the next fsync
        finally:
            self._answered(held.pending.call_id, result, held)

    def in_flight(self) -> list[dict[str, Any]]:
        """The approved calls starting or running, their results not recorded yet:
        ``call_id`` and ``tool``."""
        with self._lock:
            return [{"call_id": c, "tool": t} for c, t in self._in_flight.items()]


class _Once:
    """An approved call's one result, recorded (``record``) once: the first given wins,
    whoever gives it (the approving thread, or the turn's future once that thread was
    interrupted: :meth:`abandon`)."""

    def __init__(self, record: Callable[[ToolResult], None]) -> None:
        self._record = record
        self._lock = threading.Lock()
        self._given: ToolResult | None = None
        self._abandoned = False

    def give(self, result: ToolResult) -> ToolResult:
        """Record ``result`` unless one was given first; the one given."""
        with self._lock:
            if self._given is not None:
                return self._given
            self._given = result
        self._record(result)
        return result

    def abandon(self) -> None:
        """The approving thread waits no more: the turn's result is given when it comes."""
        with self._lock:
            self._abandoned = True

    def abandoned_to(self, future: concurrent.futures.Future[list[ToolResult]]) -> None:
        """The turn's future is done: give its result if the approving thread left."""
        with self._lock:
            abandoned = self._abandoned
        if abandoned:
            self.give(future.result()[0])


def _give(waiting: list[concurrent.futures.Future[Any]], result: ToolResult) -> None:
    for future in waiting:
        if future.set_running_or_notify_cancel():
            future.set_result(result)
