"""Calls that wait for a decision: approvals and deferred results (DESIGN §4 "Approvals").

A session's :class:`SessionApprovals` (made by ``start_loop``, kept across restarts of
its LoopActor) is the ``pending`` part of the call lifecycle (:mod:`rho_actors.lifecycle`):

- **the gate**: a turn's :class:`~rho_actors.loop.turns.Turns` asks :meth:`hold` which
  of its prepared calls require approval (the tool's ``requires_approval``: an
  attribute, a method of no arguments, or a policy ``requires_approval(args, ctx)``;
  the loop's ``approval(call_info)``; a raise counts as "requires"; an untrusted tool's
  own code is never read here, so it can never lift what the loop requires). Those
  never start: their result is ``pending_approval`` and they hold no thread, only a
  heap entry for their expiry (``approval_timeout_s``). In an exclusive turn the calls
  after a held one are held too, each behind the one before it. A call whose tool
  returned ``Deferred`` is registered by :meth:`defer` (``kind="external"``).
- **deciding**: :meth:`approve` (optionally edited arguments, validated again; the
  approval binds to the SHA-256 of the arguments that run), :meth:`reject`,
  :meth:`resolve` and the expiry. Each decision is made once: claimed in memory, and,
  for a call the session's transcript records (the agent loop records each pending
  call), appended to the transcript under its ``flock`` after checking that no other
  process decided it first. An approved call's ``running`` record is written before
  it starts, so a host killed mid-call never runs it again (its outcome is unknown:
  ``cancelled``).
- **from another process**: :func:`~rho_actors.loop.decisions.decide` writes a decision into a session's
  transcript (``rho-actors approve/reject``); a host with journaled pending calls checks
  the transcript every :data:`POLL_S` seconds (a timer, no thread of its own) and acts on
  what it finds, as after a restart (:meth:`attach` recovers the transcript's open calls).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from loguru import logger

from rho_actors.agent.transcript import TRANSCRIPT_NAME
from rho_actors.declarations.arguments import MAX_VALIDATION_S, ArgumentsError, decode_arguments, violations
from rho_actors.declarations.toolset import ToolEntry
from rho_actors.encoding import describe_exception
from rho_actors.events import CallEvent
from rho_actors.lifecycle import PendingCall, arguments_sha256, held_by, pending_call
from rho_actors.loop.approval_journal import POLL_S, ApprovalJournal, Held, copy_args
from rho_actors.loop.approval_rules import approval_rule, output_problems
from rho_actors.loop.decisions import ApprovalError, decide
from rho_actors.results import error_result, failure, result_from_return, text
from rho_actors.tool import DEFAULT_TIMEOUT_MS, ErrorKind, ToolCall, ToolInfo, ToolResult

if TYPE_CHECKING:
    from rho_actors.otp.threads import ThreadPool
    from rho_actors.otp.timers import Timers
    from rho_actors.runtime import Runtime

__all__ = ["DEFAULT_APPROVAL_TIMEOUT_S", "MAX_PENDING_ARGUMENT_BYTES", "MAX_PENDING_CALLS", "POLL_S", "ApprovalError",
           "CallInfo", "SessionApprovals", "decide"]


DEFAULT_APPROVAL_TIMEOUT_S: Final = 24 * 3600.0
"""How long a call waits for its decision by default (seconds): past it, ``approval_expired``."""
_GRACE_S = 10.0  # past an approved call's timeout, how long its result is waited for
MAX_PENDING_CALLS: Final = 256
"""The most calls of one session that wait for a decision at once: past it, or past
:data:`MAX_PENDING_ARGUMENT_BYTES`, a call that would wait is refused ``unavailable``."""
MAX_PENDING_ARGUMENT_BYTES: Final = 16 << 20
"""The most bytes of arguments (their JSON text) the waiting calls of one session hold."""
_KEPT_DECISIONS = 10_000  # decided call ids remembered per session, to name the first decision
_KEPT_OUTCOMES = 32  # results of a turn run directly's decided calls not asked for yet (when_decided)


class Turns(Protocol):
    """What deciding needs of a session's :class:`~rho_actors.loop.turns.Turns`."""

    closed: str | None
    max_output_chars: int

    def offered_entries(self) -> tuple[ToolEntry, ...]: ...

    def submit(self, calls: tuple[ToolCall, ...], future: Any, *, approved: bool = False) -> object: ...


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What a loop's ``approval`` policy sees of a call: its ``session_id``,
    ``call_id``, tool ``name``, decoded and validated ``arguments`` (read-only) and the
    tool's checked declaration ``tool``."""

    session_id: str
    call_id: str
    name: str
    arguments: Mapping[str, Any]
    tool: ToolInfo


class SessionApprovals(ApprovalJournal):
    """One session's pending calls (see the module doc). ``policy``: the loop's
    ``approval(call_info) -> bool``, or ``None``; ``timeout_s``: each approval's
    deadline, seconds from the request."""

    def __init__(self, session_id: str, data_dir: Path, policy: Callable[[CallInfo], Any] | None = None,
                 timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S) -> None:
        if policy is not None and not callable(policy):
            raise TypeError(f"approval must be a callable(call_info) -> bool or None, got {type(policy).__name__}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 1e9:
            raise ValueError(f"approval_timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        super().__init__(data_dir)
        self.session_id = session_id
        self.policy = policy
        self.timeout_s = float(timeout_s)
        self._held: dict[str, Held] = {}
        self._decided: dict[str, str] = {}  # call id -> its decision, described
        self._in_flight: dict[str, str] = {}  # approved calls until their result is recorded: id -> tool
        self._waiters: dict[str, list[concurrent.futures.Future[ToolResult]]] = {}  # when_decided(), by call id
        self._outcomes: dict[str, ToolResult] = {}  # decided, no one waited yet: for a late when_decided()
        self._lock = threading.Lock()
        self._turns: Turns | None = None
        self._runtime: Runtime | None = None
        self._timers: Timers | None = None
        self._threads: ThreadPool | None = None
        self._rules: tuple[int, dict[int, bool | Callable[..., Any]]] = (-1, {})  # by tool set version, serial
        self._recovered = False

    # --- the loop's side ------------------------------------------------------------------

    def attach(self, turns: Turns, runtime: Runtime, *, found: frozenset[str] | None = None) -> frozenset[str]:
        """The session's (new) LoopActor runs ``turns`` in ``runtime``: decisions run
        their calls there. The first attach recovers the open calls of the session's
        transcript (a host that died with calls pending, decided or approved and not
        started) and returns their ids (those it took back to wait, or to run again);
        a later one (a restart) looks at the transcript again while calls wait, and
        returns none. ``found``: the names in the session's folder as its start found
        them (the transcript is read only if its name is there); ``None``: looked for here."""
        self._turns, self._runtime = turns, runtime
        self._timers, self._threads = runtime.timers, runtime.threads
        if self._recovered:
            self._watch()
            return frozenset()
        self._recovered = True  # read here (its pending calls listed at once); a decided one runs on a pool thread
        if TRANSCRIPT_NAME in found if found is not None else self.transcript_exists():
            return self._recover()
        return frozenset()

    def _later(self, job: Callable[[], object], what: str) -> bool:
        """Run ``job`` on a pool thread; False when no thread could be started."""
        assert self._threads is not None
        try:
            self._threads.submit(job, f"approvals:{self.session_id}:{what}")
        except RuntimeError:  # no thread could be started: done at the next look
            logger.warning("session {}: no thread to {} its pending calls now", self.session_id, what)
            return False
        return True

    def hold(self, prepared: list[tuple[int, ToolCall, ToolEntry, dict[str, Any]]], exclusive: bool, version: int,
             ctx: Mapping[str, Any], *, journal: bool = False) -> dict[int, ToolResult]:
        """Which of a turn's ``prepared`` calls (index, call, entry, validated args, in
        the model's order) wait for approval: their ``pending_approval`` results, by
        index (their ``details["pending"]`` the :class:`PendingCall`). ``version``: the
        tool set's; ``ctx``: what a tool's policy gets as its context; ``journal``: a
        turn run directly, whose held calls its caller records (:meth:`record`) once the
        turn is admitted, or forgets; a decision waits for that."""
        held: dict[int, ToolResult] = {}
        before: str | None = None
        rules = self._rules_of(version)
        registered: list[Held] = []
        try:
            for index, call, entry, args in prepared:
                rule = self._rule(rules, entry)
                if rule is False and self.policy is None and before is None:  # the usual case: nothing to ask
                    continue
                if before is not None and exclusive:
                    reason = f" (it runs after call {before} of its exclusive turn)"
                elif self._requires(call, entry, args, rule, ctx):
                    reason = ""
                else:
                    continue
                held[index] = self._register(call, entry.info.name, args, "approval", reason,
                                             before if exclusive else None, registered, announce=not journal)
                if held[index].error_kind is ErrorKind.PENDING_APPROVAL:
                    before = call.id
            if journal and held:
                with self._lock:
                    marked = [h for r in held.values() if (p := pending_call(r)) and (h := self._held.get(p.call_id))]
                self._awaited(marked)
        except BaseException:  # an interrupt in the host's thread (a policy's too): its turn is not held at all
            self._unregister(registered)
            raise
        return held

    def may_hold(self, slots: Sequence[Any], waiting: Iterable[int], version: int) -> bool:
        """Whether :meth:`hold` could hold any call of a turn's ``slots`` (prepared, each
        with its ``entry``) at the indexes ``waiting`` (tool set ``version``): always with
        a policy; without one, only a call whose tool asks for approval can (the rules
        :meth:`hold` reads, cached alike). ``False`` spares the usual turn building what
        :meth:`hold` would look through for nothing."""
        if self.policy is not None:
            return True
        known, rules = self._rules
        if known != version:
            rules = self._rules_of(version)
        for index in waiting:  # a plain loop, the rule read inline: no generator or frame per call
            entry = slots[index].entry
            rule = rules.get(entry.serial)
            if rule is None:
                rule = rules[entry.serial] = approval_rule(entry)
            if rule is not False:
                return True
        return False

    def _rules_of(self, version: int) -> dict[int, bool | Callable[..., Any]]:
        """What each tool of tool set ``version`` says of approval, by registration serial
        (a new version starts an empty cache)."""
        known, rules = self._rules
        if known != version:
            self._rules = (version, rules := {})
        return rules

    @staticmethod
    def _rule(rules: dict[int, bool | Callable[..., Any]], entry: ToolEntry) -> bool | Callable[..., Any]:
        """``entry``'s :func:`approval_rule`, read once per tool set version (``rules``)."""
        rule = rules.get(entry.serial)
        if rule is None:
            rule = rules[entry.serial] = approval_rule(entry)
        return rule

    def _requires(self, call: ToolCall, entry: ToolEntry, args: dict[str, Any], rule: bool | Callable[..., Any],
                  ctx: Mapping[str, Any]) -> bool:
        if callable(rule):
            try:
                if rule(copy_args(args), MappingProxyType({**ctx, "call_id": call.id})) not in (False, None):
                    return True
            except BaseException:
                return True
        elif rule:
            return True
        if self.policy is None:
            return False
        try:
            info = CallInfo(self.session_id, call.id, entry.info.name, MappingProxyType(copy_args(args)),
                            entry.offered_info())
            return self.policy(info) not in (False, None)
        except BaseException:
            return True

    def would_hold(self, call: ToolCall, ctx: Mapping[str, Any]) -> bool:
        """Whether ``call`` would wait for approval if run now (its tool offered, its
        arguments valid; ``False`` for one that would be refused): for an adapter that
        asks its framework's approval before it runs the call."""
        entry = self._entry(call.name)
        if entry is None:
            return False
        try:
            args = decode_arguments(call.arguments)
        except ArgumentsError:
            return False
        if violations(entry.validator, args, MAX_VALIDATION_S):
            return False
        return self._requires(call, entry, args, approval_rule(entry), ctx)

    def defer(self, call: ToolCall, args: dict[str, Any], result: ToolResult, journal: bool = False,
              then: Callable[[], None] | None = None) -> ToolResult:
        """``result`` (a tool's ``Deferred``, :data:`~rho_actors.ErrorKind.DEFERRED`) with
        its call registered as pending, ``kind="external"`` (``journal``: of a turn run
        directly, recorded in the transcript on a pool thread, then announced and
        ``then()`` called: :meth:`record`). Whatever raises here, ``then()`` is called
        first (a turn's results are never held back for good) and a call registered by it
        waits no more (its turn answers it)."""
        reason = result.details.get("deferred", "") if isinstance(result.details, Mapping) else ""
        registered: list[Held] = []
        try:
            try:
                pending = self._register(call, result.name, args, "external", str(reason), None, registered,
                                         announce=not journal)
            except BaseException:  # (the timers stopped, an interrupt): the call does not wait, its turn answers it
                with self._lock:
                    for one in registered:
                        if self._held.get(one.pending.call_id) is one:
                            del self._held[one.pending.call_id]
                raise
            held = pending_call(pending)
            if journal and held is not None:
                with self._lock:
                    marked = self._held.get(held.call_id)
                self._awaited([marked] if marked is not None else [])
                self.record([(call, held)], True, then)
            elif then is not None:
                then()
        except BaseException:  # the turn's results are never held back behind a record that will not come
            if then is not None:
                then()  # (once counts: a release it had already is a no-op)
            raise
        return dataclasses.replace(pending, duration_ms=result.duration_ms)

    def _register(self, call: ToolCall, name: str, args: dict[str, Any], kind: str, reason: str,
                  after: str | None, registered: list[Held] | None = None, *, announce: bool = True) -> ToolResult:
        """Register ``call`` as waiting (its ``pending_approval`` or ``deferred`` result,
        ``details["pending"]`` its :class:`PendingCall`), or its refusal; ``announce``:
        its ``pending`` event now (else once :meth:`record` has recorded it)."""
        now = time.time()
        expires = None if kind == "external" else now + self.timeout_s
        pending = PendingCall(call.id, name, MappingProxyType(copy_args(args)), arguments_sha256(args), now,
                              kind, expires, reason.strip(" ()"))  # type: ignore[arg-type]
        size = len(call.arguments) if isinstance(call.arguments, str) else len(json.dumps(args))
        held = Held(pending, args, after, size=size,
                    deadline=None if expires is None else time.monotonic() + self.timeout_s)
        with self._lock:
            if call.id in self._held:  # a call id names one call: the waiting one is never replaced
                return failure("call_id_pending", call.id, name, call=call.id)
            held_bytes = sum(h.size for h in self._held.values())
            if len(self._held) >= MAX_PENDING_CALLS or held_bytes + size > MAX_PENDING_ARGUMENT_BYTES:
                return failure("pending_bound", call.id, name, count=len(self._held), held_bytes=held_bytes,
                               bound=MAX_PENDING_CALLS, bound_bytes=MAX_PENDING_ARGUMENT_BYTES)
            if registered is not None:  # before it waits: an interrupt from here on finds it there
                registered.append(held)
            self._held[call.id] = held
        if expires is not None:
            self._arm(held)
        self._watch()
        if announce:
            self._announce([pending])
        if kind == "external":
            result = failure("deferred", call.id, name, call=call.id, reason=reason)
        else:
            result = failure("pending_approval", call.id, name, call=call.id, reason=reason)
        return dataclasses.replace(result, details={"pending": pending})

    def _announce(self, pending: list[PendingCall]) -> None:
        """The ``pending`` event of each of ``pending`` (calls that wait)."""
        if self._runtime is not None and self._runtime.events.wants_calls("pending"):
            for one in pending:
                self._runtime.events.emit(CallEvent("pending", self.session_id, one.call_id, one.name, one.kind))

    def _arm(self, held: Held) -> None:
        """Expire ``held`` at its ``deadline`` (monotonic: a wall clock set either way
        moves no expiry): one timer heap entry, no thread."""
        if self._timers is None or held.deadline is None:
            return
        call_id = held.pending.call_id

        def expire() -> None:
            self._later(lambda: self._expire(call_id), "expire")

        held.timer = self._timers.call_at(held.deadline, expire)

    def waits(self, call_id: str) -> bool:
        """Whether call ``call_id`` of this session waits for a decision (or is being decided)."""
        if not self._held:  # none waits (the usual case): no lock taken
            return False
        with self._lock:
            return call_id in self._held

    def forget(self, results: list[ToolResult]) -> None:
        """Unregister the calls held by ``results`` (a turn's refused calls' results, a
        held call's or the acknowledgement of the task it waits as) of a turn that was
        not started after all (its loop stopped while it was prepared, or it was
        interrupted): nothing waits. Another call of the same id is kept."""
        mine = [p for r in results if (p := held_by(r)) is not None]
        with self._lock:
            held = [h for p in mine if (h := self._held.get(p.call_id)) and h.pending is p]
        self._unregister(held)

    def _unregister(self, held: list[Held]) -> None:
        """Let go of ``held`` calls still waiting (another call of the same id is kept):
        never decided, nothing waits for them."""
        with self._lock:
            gone = [self._held.pop(h.pending.call_id) for h in held if self._held.get(h.pending.call_id) is h]
        for one in gone:
            if one.timer is not None:
                one.timer.cancel()
            if one.recorded is not None:
                one.recorded.set()  # never recorded: nothing waits

    # --- seeing ---------------------------------------------------------------------------

    def pending(self) -> list[PendingCall]:
        """The calls waiting for a decision (one being decided included), oldest first."""
        with self._lock:
            return sorted((h.pending for h in self._held.values()), key=lambda p: p.requested_at)

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
