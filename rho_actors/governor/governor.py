"""The governor: every bound on calls, kept at the one point where a call starts
(DESIGN §4 "The governor").

The session's :class:`~rho_actors.loop.turns.Turns` starts each call through
:meth:`Governor.start`, which, in order:

1. **budgets and the breaker** (per session): ``max_calls_per_session``, the tool's
   ``max_calls`` and ``max_repeats`` (the same tool with the same arguments) refuse the
   call at once, ``budget_exhausted`` or ``repeated_call``. The first and last are the
   system's (:class:`GovernorSettings`), or the session's own where it set them
   (:meth:`Governor.bound_session`): a session may only tighten the system's, which are
   the host's ceiling (:mod:`rho_actors.governor.session_counts`). They count the calls
   started: a call answered before it started (the refusals below, a cancel while it
   waited) gives its counts back (:meth:`_Call.uncount`);
2. **the rate** (the tool's token bucket, :mod:`rho_actors.governor.buckets`): the call
   starts when its token comes, if that is before its deadline, else ``rate_limited``
   (a token taken by a call that never starts is given back: :meth:`_Call.unreserve`);
3. **places** (:mod:`rho_actors.governor.places`): the tool's ``max_concurrency`` (the
   whole system), its ``max_concurrency_per_session`` and, for a call on a thread, the
   system's ``max_thread_calls``, and for a call of an ``exclusive`` tool the session's
   one exclusive place (no two calls of a session's exclusive tools at once, a
   background call's task holding it until its answer); a call without a place waits in arrival order, served
   fairly across sessions, until one frees, or its deadline: ``unavailable``, naming
   the bound;
4. **retries**: an ``idempotent`` tool's call that fails retryably is run again
   after tenacity's backoff (its :class:`~rho_actors.declarations.policy.RetryPolicy`),
   every attempt within the call's one deadline, and none starting later than the
   policy's ``total_s`` after the first began; ``details["attempts"]`` and
   ``details["failures"]`` of its result say how many ran and why each failed.

A place is held from the call's start until its answer (a ``thread`` call abandoned at
its deadline is counted among the abandoned threads then); an isolation's start that
raises (a bug, or an interrupt from a signal handler) gives it back, the call answered
``not_started`` (the interrupt raised on). A call of a tool with no
policy the governor keeps (``NO_POLICY``, or one with only ``requires_approval``: not
``governed``) and no session bound, not on a thread, passes straight through.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import pykka
from loguru import logger

from rho_actors.cancel import CancelToken
from rho_actors.declarations.policy import NO_POLICY, CallPolicy, RetryPolicy
from rho_actors.encoding import describe_exception
from rho_actors.events import CallEvent, EventBus
from rho_actors.governor.buckets import TokenBucket
from rho_actors.governor.places import Gate, SessionGates, Waiting, blocking, fits, release, take
from rho_actors.governor.session_counts import Reserved, SessionBudgets
from rho_actors.governor.settings import GovernorSettings
from rho_actors.isolation.call import CallSpec
from rho_actors.lifecycle import arguments_sha256
from rho_actors.results import failure
from rho_actors.telemetry import TRACEPARENT, attempt_ended, attempt_started
from rho_actors.tool import ErrorKind, ToolInfo, ToolResult

if TYPE_CHECKING:
    from rho_actors.declarations.toolset import ToolEntry
    from rho_actors.isolation import RunningCall
    from rho_actors.otp.threads import ThreadPool
    from rho_actors.otp.timers import Timer, Timers

__all__ = ["Governor", "ThreadPlaces"]

_RETRIED_KINDS: Final = frozenset({ErrorKind.CRASHED, ErrorKind.EXITED, ErrorKind.UNAVAILABLE})
_MAX_FAILURE_CHARS: Final = 500
_BOUND_TEXTS: Final = {"tool": "concurrency_bound", "session": "session_concurrency_bound",
                       "thread": "thread_calls_bound", "exclusive": "exclusive_bound"}
_BOUND_NAMES: Final = {"tool": "max_concurrency", "session": "max_concurrency_per_session",
                       "thread": "max_thread_calls", "exclusive": 'concurrency="exclusive"'}


class _Refused:
    """The running call of a call answered at its start (nothing to cancel)."""

    __slots__ = ()

    def cancel(self, reason: str) -> None:
        pass


_REFUSED: Final = _Refused()


def _nothing(result: ToolResult) -> None:
    """The reply of a governed call that is done (its late results go to the turn's directly)."""


_DONE_SPEC: Final = CallSpec("", "", None, {}, MappingProxyType({}), 0.0, 0.0, 0, CancelToken(), 0, _nothing)
"""What a done call holds instead of its spec."""
# a governed call's states
_PLACES, _RATE, _BACKOFF, _STARTING, _RUNNING, _DONE = range(6)


class ThreadPlaces:
    """The places a ``thread`` call of a tool without a policy holds, shared by every such
    call (no object per call): a place among the system's thread calls and, for an
    ``exclusive`` tool, its session's exclusive place (``gates``: both; one of these a
    session). The call's spec carries it (``CallSpec.places``) from its start until its
    answer (its first result), whose thread gives the places back first (the next call of
    an exclusive turn, started by the turn's reply, finds them free) and starts the calls
    that waited for them after the reply: :meth:`give_back` (``isolation/thread.py``
    inlines it on a call's answer). Given back once: whoever clears ``spec.places`` under
    the governor's lock (the answer's thread, or a start that failed)."""

    __slots__ = ("gates", "gov")

    def __init__(self, gov: Governor, gates: tuple[Gate, ...]) -> None:
        self.gov = gov
        self.gates = gates

    def give_back(self, spec: CallSpec) -> list[_Call] | None:
        """Give back the places ``spec`` holds (nothing when given back already); the
        waiting calls that took them, to :meth:`Governor.launch` after the reply."""
        gov = self.gov
        with gov.lock:
            if spec.places is None:
                return None
            spec.places = None
            for gate in self.gates:
                gate.running -= 1
            if gov.gates.orphans:  # a forgotten session's gates, dropped once free
                gov.gates.released(self.gates)
            return gov._ready() if gov.waiting.count else None


class _Call:
    """One governed call, the :class:`~rho_actors.isolation.RunningCall` its turn holds:
    waiting (for a token, a place or a retry), or running one attempt. Its fields change
    under the governor's lock."""

    __slots__ = ("attempt", "began", "bucket", "counted", "current", "failures", "final", "gates", "gov",
                 "has_answer", "held", "reply", "retry", "running", "seq", "session", "span", "spec", "start", "state",
                 "stop", "timer", "token", "tool")

    def __init__(self, gov: Governor, spec: CallSpec, session: str, start: Callable[[CallSpec], RunningCall],
                 gates: tuple[Gate, ...], retry: RetryPolicy | None, bucket: TokenBucket | None) -> None:
        self.gov, self.spec, self.session, self.start = gov, spec, session, start
        self.tool = spec.name
        self.gates, self.retry, self.bucket = gates, retry, bucket
        self.reply = spec.reply  # the turn's: gets the answer (attempts decided), then late results
        spec.reply = functools.partial(self.answered, 1)
        self.current = spec  # the spec of the attempt running (or last run)
        self.attempt, self.final, self.seq = 1, 0, 0
        self.began = 0.0  # time.monotonic() s its first attempt started (retried: total_s counts from it)
        self.has_answer = self.held = False
        self.token = False  # a rate token taken for the attempt not started yet (given back if it never starts)
        self.counted: Reserved | None = None  # its budgets' counts until it starts (given back if it never does)
        self.state = _PLACES
        self.running: RunningCall | None = None
        self.timer: Timer | None = None
        self.stop: str | None = None  # the cancel's reason, once cancelled
        self.failures: list[dict[str, Any]] = []
        self.span: Any = None  # the running attempt's span, when the call's is recorded and it may be retried

    # --- waiting and starting ------------------------------------------------------------

    def proceed(self) -> None:
        """Take a rate token (maybe waiting for it), then places; from the starting
        thread, or a timer's."""
        self.timer = None  # a retry's timer, fired
        bucket = self.bucket
        if bucket is not None:
            now = time.monotonic()
            when, ok = bucket.reserve(now, self.spec.deadline)
            if not ok:
                self.gov.count("rate_limited")
                self.refuse(failure("rate_limited", self.spec.call_id, self.tool, rate=bucket.rate.text,
                                    wait_ms=round((when - now) * 1000)))
                return
            self.token = True
            if when > now:
                with self.gov.lock:
                    if self.stop is not None:
                        self.unreserve()
                        return
                    self.state = _RATE
                    self.timer = self.gov.later(when, self.places)
                if self.timer is None:  # the system is stopping
                    self.refuse(failure("not_started", self.spec.call_id, self.tool, problem="the system is stopping"))
                else:
                    self.gov.emit("queued", self)
                    self.gov.moved(self, "queued", reason=f"rate {bucket.rate.text}: its token comes in "
                                                          f"{round((when - now) * 1000)} ms")
                return
        self.places()

    def places(self) -> None:
        """Take a place in each gate, or wait for them (until the deadline)."""
        gov = self.gov
        with gov.lock:
            self.timer = None  # a rate's timer, fired
            if self.stop is not None:
                self.unreserve()
                return
            if fits(self.gates):
                take(self.gates)
                self.held, self.state = True, _STARTING
                waits = False
            else:
                self.timer = gov.later(self.spec.deadline, self.expired)
                waits = self.timer is not None
                if waits:
                    self.state, self.seq = _PLACES, next(gov.seq)
                    gov.waiting.add(self)
                    gov.queued_total += 1
        if waits:
            gov.emit("queued", self)
            gate = blocking(self.gates)
            if gate is not None:
                gov.moved(self, "queued", reason=f"{gate.running} running, the bound is {gate.bound} "
                                                 f"({_BOUND_NAMES[gate.key[0]]})")
        elif self.held:
            self.launch()
        else:  # no timer for its deadline: the system is stopping
            self.refuse(failure("not_started", self.spec.call_id, self.tool, problem="the system is stopping"))

    def launch(self) -> None:
        """Start the current attempt in its isolation (it holds its places)."""
        attempt = self.attempt
        self.token = False  # spent: the attempt starts
        self.counted = None  # the budgets' counts too
        spec = self.spec if attempt == 1 else dataclasses.replace(
            self.spec, reply=functools.partial(self.answered, attempt))
        if self.retry is not None and TRACEPARENT in spec.ctx:  # its own span, the call's child
            started = attempt_started(spec.ctx, self.tool, spec.call_id, attempt)
            if started is not None:
                self.span = started[0]
                spec = dataclasses.replace(spec, ctx=MappingProxyType({**spec.ctx, TRACEPARENT: started[1]}),
                                           reply=functools.partial(self.answered, attempt))
        self.current = spec
        if attempt > 1:
            self.gov.moved(self, "running", attempt=attempt)
        elif self.retry is not None:
            self.began = time.monotonic()
        try:
            running = self.start(spec)
        except (pykka.ActorDeadError, pykka.Timeout) as err:
            self.answered_now(attempt, failure("not_started", spec.call_id, self.tool, problem=err))
            return
        except BaseException as exc:  # a bug, or an interrupt (a signal handler's) as it started: never a place kept
            self.answered_now(attempt, failure("not_started", spec.call_id, self.tool,
                                               problem=describe_exception(exc)))
            if not isinstance(exc, Exception):
                raise  # the interrupt goes on (its turn, answered here, finds this call answered)
            logger.opt(exception=exc).error("call {} ({}) could not be started: {}", spec.call_id, self.tool,
                                            describe_exception(exc))
            return
        with self.gov.lock:
            current = self.attempt == attempt and not self.has_answer
            if current:
                self.running, self.state = running, _RUNNING
            stop = self.stop
        if current and stop is not None:
            running.cancel(stop)

    def expired(self) -> None:
        """Its deadline came while it waited for places: ``unavailable``, naming the bound."""
        gov = self.gov
        with gov.lock:
            self.timer = None
            if self.state != _PLACES or self.stop is not None or not gov.waiting.remove(self):
                return
            self.state = _DONE
            gate = blocking(self.gates) or self.gates[0]
            running, bound = gate.running, gate.bound
        gov.count("unavailable")
        key = _BOUND_TEXTS[gate.key[0]]
        self.finish(failure(key, self.spec.call_id, self.tool, (time.monotonic() - self.spec.dispatched) * 1000,
                            running=running, bound=bound))

    def refuse(self, result: ToolResult) -> None:
        with self.gov.lock:
            self.state = _DONE
        self.finish(result)

    def cancel(self, reason: str) -> None:
        """The turn was cancelled or its loop stops (it answered the call itself)."""
        gov = self.gov
        with gov.lock:
            if self.stop is not None:
                return
            self.stop = reason
            timer, running = self.timer, self.running if self.state == _RUNNING else None
            self.timer = None
            if self.state == _PLACES:
                gov.waiting.remove(self)
            if self.state in (_PLACES, _RATE, _BACKOFF):  # nothing runs: the loop answered it
                self.state = _DONE
                self.uncount()
                self.let_go()
        if timer is not None:
            timer.cancel()
        if running is not None:
            running.cancel(reason)

    # --- answers -------------------------------------------------------------------------

    def answered(self, attempt: int, result: ToolResult) -> None:
        """The reply of attempt ``attempt`` (its isolation's; the first is its answer,
        then any late result)."""
        gov = self.gov
        with gov.lock:
            late = attempt != self.attempt or self.has_answer
            if not late:
                self.has_answer, self.running, span, self.span = True, None, self.span, None
                ready = gov.released(self) if self.held else ()
        if late:
            if attempt == self.final:  # a late result of the attempt that answered: the loop reports it
                self.reply(result)
            return
        retried = self.retried(result)
        if span is not None:
            attempt_ended(span, result, retried)
        if not retried:
            self.final, self.state = attempt, _DONE
            self.finish(result)
        gov.launch(ready)

    def answered_now(self, attempt: int, result: ToolResult) -> None:
        """An attempt that could not start: its answer, no retry (none when it answered
        already: its isolation did, before its start raised)."""
        gov = self.gov
        with gov.lock:
            if attempt != self.attempt or self.has_answer:
                return
            self.has_answer, self.state, span, self.span = True, _DONE, self.span, None
            ready = gov.released(self) if self.held else ()
        if span is not None:
            attempt_ended(span, result, False)
        self.finish(result)
        gov.launch(ready)

    def retried(self, result: ToolResult) -> bool:
        """Whether ``result`` is retried (the next attempt waits its backoff)."""
        retry = self.retry
        if retry is None or result.ok or self.attempt >= retry.attempts:
            return False
        kind = result.error_kind
        flagged = isinstance(result.details, dict) and result.details.get("retryable") is True
        if not (kind in _RETRIED_KINDS or flagged or (kind is ErrorKind.TIMEOUT and retry.on_timeout)):
            return False
        now = time.monotonic()
        when = now + retry.wait_s(self.attempt)
        if when >= self.spec.deadline or when - self.began > retry.total_s:  # none past its deadline or total_s
            return False
        gov = self.gov
        with gov.lock:
            if self.stop is not None:
                return False
            self.timer = gov.later(when, self.proceed)
            if self.timer is None:  # the system is stopping: this answer stands
                return False
            self.failures.append({"attempt": self.attempt, "error_kind": str(kind),
                                  "message": result.content[:_MAX_FAILURE_CHARS]})
            self.has_answer, self.state = False, _BACKOFF
            self.attempt += 1
            gov.retried += 1
        gov.emit("retried", self, str(kind))
        gov.moved(self, "retried", attempt=self.attempt - 1, error_kind=str(kind), delay_s=round(when - now, 6))
        return True

    def finish(self, result: ToolResult) -> None:
        """Hand the call's answer to its turn (with its attempts, when it had more than one).
        Its spec's ``reply`` is the turn's again from now on (no reference cycle is left:
        a call's objects are freed by reference counting, DESIGN §4)."""
        reply = self.reply
        self.let_go()
        if self.counted is not None:
            self.uncount()
        if self.failures:
            details = result.details if isinstance(result.details, dict) else (
                {} if result.details is None else {"details": result.details})
            result = dataclasses.replace(result, details={**details, "attempts": self.attempt,
                                                          "failures": list(self.failures)})
        reply(result)

    def unreserve(self) -> None:
        """Give back the rate token taken for an attempt that will never start."""
        if self.token and self.bucket is not None:
            self.token = False
            self.bucket.give_back(time.monotonic())

    def uncount(self) -> None:
        """Give back the budgets' counts of a call that never started."""
        if self.counted is not None:
            self.gov.budgets.give_back(self)

    def let_go(self) -> None:
        """The call is done: its attempt's late results go to the turn's reply directly,
        and this object holds nothing of the turn (its slot may still hold this); a rate
        token it took for an attempt that never started is given back."""
        self.unreserve()
        self.spec.reply = self.current.reply = self.reply
        self.reply = _nothing
        self.spec = self.current = _DONE_SPEC


class Governor:
    """The bounds of one system's calls (see the module doc). Thread-safe."""

    def __init__(self, settings: GovernorSettings, timers: Timers, events: EventBus, threads: ThreadPool) -> None:
        self.settings = settings
        self.timers = timers
        self.events = events
        self._pool = threads
        self.lock = threading.Lock()
        self.seq = itertools.count()
        self.waiting = Waiting()
        self._threads = Gate(("thread",), settings.max_thread_calls)
        self._thread_places = ThreadPlaces(self, (self._threads,))  # of a thread call of a shared tool without a policy
        self._tools: dict[str, Gate] = {}
        self._exclusive: dict[str, ThreadPlaces] = {}  # by session: its exclusive place with the thread place
        # each session's gates: per tool (max_concurrency_per_session), and exclusive (its ThreadPlaces dropped with it)
        self.gates = SessionGates(dropped=self._exclusive.pop)
        self._buckets: dict[str, TokenBucket] = {}
        self.budgets = SessionBudgets(settings.max_calls_per_session, settings.max_repeats)
        self.refused: dict[str, int] = {"budget_exhausted": 0, "repeated_call": 0, "rate_limited": 0,
                                        "unavailable": 0}
        self._watchers: dict[str, Callable[[str, str, dict[str, Any], str], None]] = {}
        self.retried = 0
        self.queued_total = 0

    def start(self, entry: ToolEntry, spec: CallSpec, session: str, start: Callable[[CallSpec], RunningCall],
              inline: bool) -> RunningCall:
        """Start ``spec`` (a call of ``entry``'s tool in ``session``) with ``start`` (its
        isolation's), within its bounds (the module doc); ``inline``: it runs on the
        awaiting event loop (it holds no thread even in ``thread`` isolation). Its
        ``reply`` gets exactly one answer, a refusal included (maybe before this
        returns). Raises what ``start`` raises when the call goes straight through."""
        policy = entry.info.policy
        threaded = not inline and entry.isolation == "thread"
        exclusive = entry.info.concurrency == "exclusive"
        budgets = self.budgets
        counted = budgets.everyone or (bool(budgets.bounds) and session in budgets.bounds)
        if (policy is NO_POLICY or not policy.governed) and not counted and (not exclusive or threaded):
            if not threaded:
                return start(spec)
            threads = self._threads
            with self.lock:  # the usual case: its places free, nobody waiting for one; looked at inline
                if not exclusive:  # the thread place alone
                    places = self._thread_places
                    free = not self.waiting.count and threads.running < threads.bound
                    if free:
                        threads.running += 1
                else:  # and the session's exclusive place
                    kept = self._exclusive.get(session)
                    # (a forgotten session back: its gate is no orphan any more)
                    places = kept if kept is not None and not self.gates.orphans else self._exclusive_places(session)
                    gate = places.gates[0]
                    free = not self.waiting.count and gate.running < gate.bound and threads.running < threads.bound
                    if free:
                        gate.running += 1
                        threads.running += 1
            if free:  # held until the call's answer, whose thread gives them back (ThreadPlaces)
                spec.places = places
                try:
                    return start(spec)
                except BaseException:  # it did not start: no answer comes, the places are given back here
                    ready = places.give_back(spec)  # (unless a deadline's answer came meanwhile and did)
                    if ready:
                        self.launch(ready)
                    raise
            call = _Call(self, spec, session, start, places.gates, None, None)
        else:
            refusal, reserved = budgets.admit(
                session, spec.name, spec.args, policy.max_calls, entry.info.parameter_schema,
            ) if counted or policy.max_calls else (None, None)
            if refusal is not None:
                self.count(refusal[0])
                spec.reply(failure(refusal[0], spec.call_id, spec.name, **refusal[1]))
                return _REFUSED
            gates = self._gates(policy, spec.name, session, threaded, exclusive)
            bucket = None if policy.rate is None else self._bucket(spec.name, policy)
            call = _Call(self, spec, session, start, gates, policy.retries, bucket)
            call.counted = reserved
            call.proceed()
            return call
        call.places()
        return call

    def _exclusive_places(self, session: str) -> ThreadPlaces:
        """The session's one place for calls of its exclusive tools (``gates[0]``, its
        :class:`SessionGates` gate), with the thread place (under the lock)."""
        gate = self.gates.exclusive_of(session)
        places = self._exclusive.get(session)
        if places is None or places.gates[0] is not gate:
            places = self._exclusive[session] = ThreadPlaces(self, (gate, self._threads))
        return places

    def _gates(self, policy: CallPolicy, name: str, session: str, threaded: bool,
               exclusive: bool = False) -> tuple[Gate, ...]:
        gates: list[Gate] = []
        with self.lock:
            if exclusive:
                gates.append(self.gates.exclusive_of(session))
            if policy.max_concurrency_per_session is not None:
                gates.append(self.gates.per_tool(name, session, policy.max_concurrency_per_session))
            if policy.max_concurrency is not None:
                gate = self._tools.get(name)
                if gate is None:
                    gate = self._tools[name] = Gate(("tool", name), 1)
                gate.bound = policy.max_concurrency  # a tool registered again may bring another bound
                gates.append(gate)
        if threaded:
            gates.append(self._threads)
        return tuple(gates)

    def _bucket(self, name: str, policy: CallPolicy) -> TokenBucket:
        """The tool's token bucket (its rate group's, when it has one: ``group:<name>``)."""
        key = name if policy.rate_group is None else f"group:{policy.rate_group}"
        bucket = self._buckets.get(key)
        if bucket is None or bucket.rate != policy.rate:
            assert policy.rate is not None
            with self.lock:
                bucket = self._buckets.get(key)
                if bucket is None or bucket.rate != policy.rate:
                    bucket = self._buckets[key] = TokenBucket(policy.rate, time.monotonic())
        return bucket

    def session_bounds(self, max_calls_per_session: Any = None, max_repeats: Any = None,
                       ) -> tuple[int | None, int | None] | None:
        """:meth:`SessionBudgets.session_bounds`: a session's own bounds checked against the system's."""
        return self.budgets.session_bounds(max_calls_per_session, max_repeats)

    def bound_session(self, session: str, bounds: tuple[int | None, int | None] | None) -> None:
        """Give ``session`` its own bounds (from :meth:`session_bounds`; ``None``: the
        system's) until :meth:`forget`: its ``max_calls_per_session`` and ``max_repeats``."""
        self.budgets.bound(session, bounds)

    def bounded(self, session: str, bounds: tuple[int | None, int | None] | None,
                start: Callable[[], pykka.ActorRef[Any]]) -> Callable[[], pykka.ActorRef[Any]]:
        """``start`` (a session's loop's, at each start and restart) giving ``session`` its
        ``bounds`` first (:meth:`bound_session`; a loop's stop forgets them); ``start`` for ``None``."""
        return self.budgets.bounded(session, bounds, start)

    # --- places freed ----------------------------------------------------------------------

    def released(self, call: _Call) -> list[_Call]:
        """Give back ``call``'s places and take the waiting calls that fit now (under the lock)."""
        call.held = False
        release(call.gates)
        if self.gates.orphans:
            self.gates.released(call.gates)
        return self._ready() if self.waiting.count else []

    def _ready(self) -> list[_Call]:
        """The waiting calls that fit now, their places taken (under the lock)."""
        ready = list(self.waiting.ready())
        for waiter in ready:
            waiter.held, waiter.state = True, _STARTING
            if waiter.timer is not None:
                waiter.timer.cancel()
                waiter.timer = None
        return ready

    def launch(self, ready: list[_Call] | tuple[()]) -> None:
        """Start the calls that took places (outside the lock): each one, an interrupt
        as one starts raised once all were (each holds places: none is left unstarted)."""
        interrupt: BaseException | None = None
        for call in ready:
            try:
                call.launch()  # a start that raised answers its call (not_started), its places given back
            except Exception:  # a bug here
                logger.exception("the governor could not start call {}", call.spec.call_id)
            except BaseException as exc:
                interrupt = interrupt or exc
        if interrupt is not None:
            raise interrupt

    def later(self, when: float, job: Callable[[], None]) -> Timer | None:
        """Run ``job`` at ``when`` (a ``time.monotonic()`` instant) on a pooled thread
        (the timer thread only hands it over); ``None`` once the timers are stopped."""
        try:
            return self.timers.call_at(when, functools.partial(self._elsewhere, job))
        except RuntimeError:
            return None

    def _elsewhere(self, job: Callable[[], None]) -> None:
        try:
            self._pool.submit(job, "rho_actors-governor")
        except RuntimeError:  # no thread could be started: run it here
            job()

    def count(self, reason: str) -> None:
        with self.lock:
            self.refused[reason] += 1

    def emit(self, kind: Any, call: _Call, outcome: str | None = None) -> None:
        """A :class:`CallEvent` (``queued``, ``retried``) of ``call``, when someone listens."""
        if self.events.wants_calls(kind):
            spec = call.spec
            self.events.emit(CallEvent(kind, call.session, spec.call_id, spec.name, outcome,
                                       (time.monotonic() - spec.dispatched) * 1000))

    def watch(self, session: str, moved: Callable[[str, str, dict[str, Any], str], None]) -> Callable[[], None]:
        """Call ``moved(call_id, state, fields, arguments_sha256)`` for each move of a
        ``session``'s calls through the governor, as the call lifecycle names them
        (:mod:`rho_actors.lifecycle`: ``queued`` with its ``reason``, ``retried`` with
        ``attempt``, ``error_kind`` and ``delay_s``, ``running`` with ``attempt`` for
        each attempt after the first), from the thread that moves it (one watcher a
        session: the prompt running). Returns the function that stops it."""
        self._watchers[session] = moved

        def unwatch() -> None:
            if self._watchers.get(session) is moved:
                del self._watchers[session]

        return unwatch

    def moved(self, call: _Call, state: str, **fields: Any) -> None:
        """Tell the session's watcher (if any) that ``call`` moved to ``state``."""
        watcher = self._watchers.get(call.session)
        if watcher is None:
            return
        try:
            watcher(call.spec.call_id, state, fields, arguments_sha256(call.spec.args))
        except Exception:  # the host's: its fault must not lose the call
            logger.exception("the watcher of session {} failed on call {}", call.session, call.spec.call_id)

    def forget(self, session: str) -> None:
        """The session ended: drop its counts, its own bounds and its per-session places
        (those with calls in them once their last call ends)."""
        self.budgets.forget(session)
        with self.lock:
            self.gates.forget(session)

    # --- what an operator sees ---------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """``max_thread_calls``, ``thread_calls_running``, ``max_calls_per_session``,
        ``max_repeats``; ``running`` and ``queued`` (calls waiting for a place) per
        capped tool; ``queued_total`` (calls that ever waited for one), ``refused`` per
        reason (``budget_exhausted``, ``repeated_call``, ``rate_limited``,
        ``unavailable``) and ``retried`` (retries made)."""
        settings = self.settings
        with self.lock:
            return {
                "max_thread_calls": settings.max_thread_calls, "thread_calls_running": self._threads.running,
                "max_calls_per_session": settings.max_calls_per_session, "max_repeats": settings.max_repeats,
                "running": {name: gate.running for name, gate in self._tools.items()},
                "queued": self.waiting.per_tool(), "queued_total": self.queued_total,
                "refused": dict(self.refused), "retried": self.retried,
            }

    def describe(self, infos: Mapping[str, ToolInfo]) -> dict[str, Any]:
        """The bounds of each tool of ``infos`` that has any, with its ``running`` and
        ``queued`` calls now (``tree()``), and the system's own."""
        stats = self.stats()
        tools = {}
        for name, info in infos.items():
            if info.policy.governed:
                data = info.policy.as_data()
                data.pop("requires_approval", None)  # not the governor's
                tools[name] = {**data, "running": stats["running"].get(name, 0),
                               "queued": stats["queued"].get(name, 0)}
        return {"max_thread_calls": stats["max_thread_calls"], "thread_calls_running": stats["thread_calls_running"],
                "max_calls_per_session": stats["max_calls_per_session"], "max_repeats": stats["max_repeats"],
                "tools": tools}

