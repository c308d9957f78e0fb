"""``thread`` isolation: a call runs in its CallActor's own thread (DESIGN §5).

At the deadline the call's result is a ``timeout`` error on time (unless C code holds
the GIL): the system's timer thread claims the call's answer for the timeout
first, then sets the call's :class:`~rho_actors.CancelToken` (an ``async def run`` is
really cancelled) and abandons its thread: counted, and never waited for. What it
returns later, ``ok`` included, is reported as ``late``; a result the tool returns
past its deadline before the timer fires is the ``timeout`` result all the same.
Cancelling a call (the host cancelling its turn, or its loop stopping) sets the token
and abandons the thread the same way. The host's thread waiting in ``run_turn`` for a
turn's one call keeps that call's deadline off the timer heap (:meth:`Waiter.keep
<rho_actors.sandbox.Waiter.keep>`) until its instant, then hands it to the timer thread
(never fires it itself: a signal handler may interrupt it there).

Abandoned threads still running are capped per tool (``threads_per_tool``) and for the
system (``threads_total``): past a cap, the tool's calls get an ``unavailable`` result
without starting a thread, and an :class:`~rho_actors.events.IsolationEvent` tells the
host, until its threads end; so tools can never use up the threads the system needs.
A ``MemoryError`` in a thread call is a ``memory`` result.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from types import CoroutineType
from typing import Any, ClassVar

import pykka
from loguru import logger

from rho_actors.events import IsolationEvent
from rho_actors.isolation.base import Isolation, IsolationServices
from rho_actors.isolation.call import AT_DEADLINE, CallSpec, SettleOnce, call_failure, drive, in_span
from rho_actors.otp.threads import ThreadPool
from rho_actors.otp.timers import Timer
from rho_actors.results import CANCELLED, DISCARDED, failure, result_from_return
from rho_actors.telemetry import TRACEPARENT
from rho_actors.tool import ToolResult

__all__ = ["AbandonedThreads", "ThreadIsolation", "on_call_thread"]

_CALL_THREAD = "rho_actors-call"


def on_call_thread() -> bool:
    """Whether this thread is a ``thread`` call's, running its call or settling its result
    (an ``on_result`` of its turn): where a host may do a call's own bookkeeping, file
    work included, holding up no timer, event loop or other call."""
    return threading.current_thread().name == _CALL_THREAD  # the pool names a call thread so while it runs


class AbandonedThreads:
    """Counts thread calls cancelled while running (timed out, or their loop stopped):
    ``total`` ever, and ``running``, those whose thread has not returned yet, also by
    (session, tool) and by session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.running = 0
        self.by_tool: dict[tuple[str, str], int] = {}  # (session, tool) -> running
        self.by_session: dict[str, int] = {}

    def abandoned(self, tool: str = "", session: str = "") -> None:
        """Count a running call of ``tool`` in ``session`` whose thread was given up on."""
        with self._lock:
            self.total += 1
            self.running += 1
            key = (session, tool)
            self.by_tool[key] = self.by_tool.get(key, 0) + 1
            self.by_session[session] = self.by_session.get(session, 0) + 1

    def returned(self, tool: str = "", session: str = "") -> int:
        """Count an abandoned call's thread that has returned since (or an abandonment
        taken back); the (session, tool) count left."""
        with self._lock:
            self.running -= 1
            key = (session, tool)
            left = self.by_tool.get(key, 1) - 1
            if left > 0:
                self.by_tool[key] = left
            else:
                self.by_tool.pop(key, None)
            of_session = self.by_session.get(session, 1) - 1
            if of_session > 0:
                self.by_session[session] = of_session
            else:
                self.by_session.pop(session, None)
            return max(0, left)

    def taken_back(self, tool: str = "", session: str = "") -> None:
        """Undo :meth:`abandoned`: the call was not running after all."""
        self.returned(tool, session)
        with self._lock:
            self.total -= 1

    def of(self, tool: str, session: str = "") -> int:
        """Abandoned threads of ``tool`` in ``session`` still running."""
        with self._lock:
            return self.by_tool.get((session, tool), 0)

    def of_session(self, session: str) -> int:
        """Abandoned threads of ``session`` still running (any tool)."""
        with self._lock:
            return self.by_session.get(session, 0)

    def sessions(self) -> dict[str, int]:
        """Abandoned threads still running, by session (for ``stats()``)."""
        with self._lock:
            return dict(self.by_session)


class _Running(Timer, SettleOnce):
    """A thread call, as one object (PROFILE §43): its deadline timer (its own entry in
    the system's timer heap), its settle-once answer (what
    :class:`~rho_actors.isolation.call.Answer` is to the other isolations, specialised
    here), the :class:`~rho_actors.isolation.RunningCall` its turn holds, and the job its
    call thread runs (:meth:`__call__`): no other object per call.

    The answer: the first result settled is the call's, handed to ``spec.reply``; every
    later one is handed on after it (``late``); a result settled at or past the deadline
    is replaced by the ``timeout`` result (see :data:`AT_DEADLINE`). A claim is one atomic
    ``list.pop``. At the deadline (:meth:`fire`, on the timer thread) the timeout claims the
    answer first, then the call's token is set and its thread abandoned, and the timeout is
    delivered, from the isolation's one deadlines thread when it fired on the timer thread
    (so a burst of due deadlines is decided on time, whatever delivering them costs), else
    at once by the thread that saw it passed (:meth:`Timers.run_due`). ``cancel()`` without
    a reason disarms the timer; ``cancel(reason)`` is the isolation's cancel. Once a result
    has won (or the call was refused, or not started), ``spec`` is let go: a disarmed timer
    stays in the heap until its instant, holding nothing of the call's. The governor's
    places the call holds (``spec.places``) are given back by whoever delivers its answer,
    before the reply (:class:`~rho_actors.governor.governor.ThreadPlaces`)."""

    __slots__ = ("_claim", "_delivered", "_late", "_start", "isolation", "spec")

    fire_anywhere = True  # whichever thread first sees the deadline passed claims the timeout

    def __init__(self, isolation: ThreadIsolation, spec: CallSpec) -> None:
        self.when, self.cancelled, self._owner = spec.deadline, False, None  # Timer's fields, without its frame
        self.isolation = isolation
        self.spec: CallSpec | None = spec
        self._claim: list[None] = [None]
        self._start: list[None] = [None]  # taken by the call thread as it begins, or by a start that failed
        self._late: list[ToolResult] | None = None  # made by the first late result (most calls have none)
        self._delivered = False

    # --- the timer and the running call -----------------------------------------------

    def fire(self) -> None:
        spec = self.spec
        if spec is None or not self.claim():
            return  # a result won (or the call was cancelled) just now
        self.isolation.timed_out(spec, self, self.timeout(CANCELLED))

    def cancel(self, reason: str | None = None) -> None:
        spec = self.spec
        Timer.cancel(self)
        if reason is not None and spec is not None and self._claim:  # claimed: its deadline's (which gives it up)
            self.isolation.give_up(spec, reason)

    # --- the answer ---------------------------------------------------------------------

    def settle(self, result: ToolResult) -> None:
        """Settle the call with ``result`` (from its call thread, a pool thread: never the main one, where
        alone a signal handler's exception could come between an acquire and its ``try``): its answer (replaced by the
        ``timeout`` result past the deadline), or handed on as late."""
        spec = self.spec
        if spec is None:  # not started, or answered by a result already: nothing waits for another
            return
        late: ToolResult | None = None
        if result.error_kind not in AT_DEADLINE and time.monotonic() >= spec.deadline:
            late, result = result, self.timeout(DISCARDED)
        try:  # claim(), inline
            self._claim.pop()
        except IndexError:
            self._hand_late(late or result)
            return
        if not self.cancelled:  # Timer.cancel, inline (nothing to drop): disarmed
            self.cancelled = True
            if (owner := self._owner) is not None:
                owner._dead += 1  # unlocked: a lost count only delays the next compaction
                if owner._dead > 1024:
                    owner._cancelled()
        places, ready = spec.places, None
        if places is not None:  # the governor's places, given back first: ThreadPlaces.give_back, inline
            lock = (gov := places.gov).lock
            lock.acquire()  # not ``with`` (~1.1k instructions less, PROFILE §48): a pool thread, never the main one
            try:
                if spec.places is not None:  # else a start that failed gave them back
                    spec.places = None
                    for gate in places.gates:
                        gate.running -= 1
                    if gov.gates.orphans:  # a forgotten session's gates, dropped once free
                        gov.gates.released(places.gates)
                    ready = gov._ready() if gov.waiting.count else None
            finally:
                lock.release()
        try:  # deliver(result), inline
            spec.reply(result)
        finally:
            self._delivered = True
            if self._late:
                self._drain()
            if ready:  # the calls that waited for the places start after the reply
                places.gov.launch(ready)  # type: ignore[union-attr]  # ready: given back from places
        if late is not None:
            self._hand_late(late)
        self.spec = None  # answered: a timer left in the heap holds nothing of the call's (and no cycle)
        service = self._owner
        if service is not None:  # other calls' passed deadlines: this thread is running
            try:  # run_due's first look, inline (no frame when nothing is due, the usual case)
                due = bool(heap := service._heap) and heap[0][0] <= (now := time.monotonic())
            except IndexError:  # emptied just now by another thread
                due = False
            if due:
                service.run_due(now)

    def deliver(self, result: ToolResult) -> None:
        """Hand the answer of a :meth:`claim` (a deadline's) to ``spec.reply``, the
        governor's places the call holds given back first (the calls that waited for them
        start after the reply); then any late result that came meanwhile."""
        spec = self.spec
        places = None if spec is None else spec.places
        ready = places.give_back(spec) if places is not None and spec is not None else None
        try:
            SettleOnce.deliver(self, result)
        finally:
            if ready:
                places.gov.launch(ready)  # type: ignore[union-attr]  # ready: given back from places

    # --- the call thread's job ------------------------------------------------------------

    def __call__(self) -> None:
        """The call thread's one job: the host's ``on_start``, the call run in its copy of
        the submitter's context with its span current, one result whatever it raises
        (:func:`~rho_actors.isolation.call.call_failure`), the call counted ended, then
        settled in the pool's hand-over (the next call of an exclusive turn that it starts
        takes over this thread once this returns). Never raises (a failed reply is logged).
        :func:`~rho_actors.isolation.call.run_on_call_thread`, inline: one frame."""
        spec, isolation = self.spec, self.isolation
        try:  # begun: a start failing from now on leaves the call to this thread (one atomic pop)
            self._start.pop()
        except IndexError:  # not started after all (its start raised): nothing to run, nothing counted
            return
        if spec is None:  # (never: only this thread or a failed start lets it go once started; counted all the same)
            isolation._ended()
            return
        if spec.on_start is not None:
            try:
                spec.on_start()
            except Exception:  # the host's bookkeeping: logged, the call runs all the same
                logger.exception("on_start of call {} raised", spec.call_id)
        context = spec.context
        try:
            if TRACEPARENT in spec.ctx:  # with the call's span current (telemetry off: no span, no frame for it)
                result = (context.run(in_span, isolation._run, spec) if context is not None
                          else in_span(isolation._run, spec))
            else:  # ThreadIsolation._run, inline (no frame): the tool run in the call's context
                try:
                    value = (context.run(spec.tool.run, spec.args, spec.ctx) if context is not None
                             else spec.tool.run(spec.args, spec.ctx))
                    if type(value) is CoroutineType:  # driven on a private event loop, in the call's context
                        driven = drive(value, spec.deadline, spec.cancel)
                        value = context.run(asyncio.run, driven) if context is not None else asyncio.run(driven)
                    made = (time.monotonic() - spec.dispatched) * 1000
                    # a text's result here (no code of the tool's runs for it); any other value's in the call's
                    # context (its conversion may run the tool's code: a __str__, a JSON default)
                    result = (result_from_return(spec.call_id, spec.name, value, spec.max_output_chars, made)
                              if type(value) is str or context is None else
                              context.run(result_from_return, spec.call_id, spec.name, value, spec.max_output_chars,
                                          made))
                except MemoryError:
                    result = failure("memory_thread", spec.call_id, spec.name,
                                     (time.monotonic() - spec.dispatched) * 1000)
                finally:
                    abandoned = spec.cancel.finish(isolation)  # why it was given up on (not the tool's own reason)
                    if abandoned is not None:
                        isolation._abandoned_returned(spec, abandoned)
        except BaseException as exc:  # nothing escapes into the pool: a result
            result = call_failure(spec, exc, (time.monotonic() - spec.dispatched) * 1000)
        isolation._live.pop()  # isolation._ended(), inline
        if isolation._draining:
            with isolation._live_lock:
                isolation._live_changed.notify_all()
        local = isolation._pool._local  # the pool's run_handing_over, inline
        try:
            if not hasattr(local, "next"):  # not one of the pool's threads: no hand-over
                self.settle(result)
                return
            local.handing = True
            try:
                self.settle(result)
            finally:
                local.handing = False
        except BaseException:
            logger.exception("reply of call {} failed", spec.call_id)


class ThreadIsolation(Isolation):
    """Runs each call as one job on a reused thread of the system's pool (its call
    thread: one hand-off there, the reply from it back); the deadline is a timer.

    A call thread is what a CallActor was for ``thread`` calls, without the actor's
    inbox, registry entry and monitors: it runs exactly one call, turns whatever
    happens into exactly one result (an ``Exception`` is ``raised``, a
    ``BaseException`` ``exited``: nothing escapes into the pool), replies once it has
    counted itself ended, and is never restarted. A call thread past its deadline is
    abandoned (counted; the pool never waits for it, the next call gets another
    thread). At :meth:`shutdown` (the system's stop, after the sessions cancelled their
    calls) the call threads still running get ``timeout_s`` seconds to return."""

    name: ClassVar[str] = "thread"
    untrusted_refused: ClassVar[str | None] = "its code would run in the host process; use isolation='process'"

    def __init__(self, services: IsolationServices) -> None:
        super().__init__(services)
        self.abandoned = AbandonedThreads()
        self._exhausted: set[tuple[str, str]] = set()  # (session, tool) refused until its threads end
        self._exhausted_lock = threading.Lock()
        self._refused = 0
        # timeouts claimed on the timer thread, delivered by the deadlines thread (started on first use)
        self._deliveries: queue.SimpleQueue[tuple[CallSpec, _Running, ToolResult] | None]
        self._deliveries = queue.SimpleQueue()
        self._deliveries_lock = threading.Lock()
        self._deliverer: threading.Thread | None = None
        self._pool = services.threads if services.threads is not None else ThreadPool(name="rho_actors-call-idle")
        # call threads running a call now, one entry each: counted without a lock (a deque's append and pop
        # are atomic), two lock rounds fewer a call; len() is the count
        self._live: collections.deque[None] = collections.deque()
        self._forgotten = 0  # of those, given up at their deadline or by the host: no stop waits for them
        self._draining = False  # a shutdown waits for them: each one ending tells it
        self._live_lock = threading.Lock()  # guards ``_forgotten`` and ``_draining``
        self._live_changed = threading.Condition(self._live_lock)

    def _exhausted_reason(self, tool: str, session: str) -> dict[str, Any] | None:
        """Why a call of ``tool`` in ``session`` may not start a thread now (``None``: it
        may). Each session has its own share: ``threads_per_tool`` of one tool,
        ``threads_per_session`` in all; at ``threads_total`` for the system only sessions
        that hold abandoned threads themselves are refused."""
        s = self.services
        of_tool = self.abandoned.of(tool, session)
        if of_tool >= s.threads_per_tool:
            return {"running": of_tool, "cap": s.threads_per_tool, "scope": "per tool in a session"}
        of_session = self.abandoned.of_session(session)
        if of_session >= s.threads_per_session:
            return {"running": of_session, "cap": s.threads_per_session, "scope": "per session, of all its tools"}
        if self.abandoned.running >= s.threads_total and of_session:
            return {"running": of_tool, "cap": s.threads_total, "scope": "for the whole system"}
        return None

    def _emit(self, kind: str, tool: str, detail: str = "") -> None:
        if self.services.events is not None:
            self.services.events.emit(IsolationEvent(kind, tool, detail))

    def start(self, call: CallSpec) -> _Running:
        s = self.services
        if s.calls.closed:
            raise pykka.ActorDeadError("the system is stopping")
        running = _Running(self, call)
        # no abandoned thread anywhere (the usual case): no cap can refuse, no lock taken
        if self.abandoned.running or s.threads_per_tool <= 0 or s.threads_per_session <= 0:
            session = _session(call)
            reason = self._exhausted_reason(call.name, session)
            if reason is not None:
                self._refuse(call, session, reason)
                running.spec = None  # answered: nothing to cancel
                return running
        self._live.append(None)  # counted running from here: until its call thread, or its failed start, ends it
        try:
            timers = s.timers
            waiter = call.waiter  # the starting thread waits for this call alone (run_turn): it may keep the deadline
            # (Waiter.keep, inline: by the thread that made the waiter, before it closed, once)
            if waiter is not None and waiter._deadline is None and waiter._thread == threading.get_ident():
                waiter._deadline = (running, timers)
            else:
                try:
                    timers.schedule(running)
                except RuntimeError:  # the timers are stopped: the system is stopping
                    raise pykka.ActorDeadError("the system is stopping") from None
            heap = timers._heap
            try:  # timers.run_due's first look, inline (no frame when nothing is due, the usual case)
                due = bool(heap) and heap[0][0] <= call.dispatched  # an empty heap raises nothing (none kept there)
            except IndexError:  # emptied just now by another thread
                due = False
            if due:  # passed deadlines of other calls: fired while this thread runs
                timers.run_due(call.dispatched)
            # the hand-off last: the call thread, woken by it, finds little left before this thread waits
            try:
                # the call is its thread's job; one run_turn waits for alone goes straight to an idle thread
                self._pool.submit(running, _CALL_THREAD, may_take_over=True, alone=waiter is not None)
            except RuntimeError as exc:  # no thread could be started (the host at its thread limit): not started
                raise pykka.ActorDeadError(f"no thread could be started for the call ({exc})") from None
        except BaseException:  # not started (as above), or an interrupt (a signal handler's) in the host's thread
            self._not_started(running)  # while it armed the deadline or as the pool started a thread for the job
            raise
        return running

    def _not_started(self, running: _Running) -> None:
        """:meth:`start` failed once ``running`` was counted: unless its call thread began
        the job already (the pool may have queued it, or handed it to a thread, before an
        interrupt: then the call runs, and ends, as any), it is never run, even if the
        pool runs the job later: not counted running, its deadline disarmed, its token
        finished (a deadline that claimed it meanwhile abandoned no thread), and no answer
        given here (the failure raised tells its turn, which answers it)."""
        try:
            running._start.pop()  # taken from the call thread: it returns at once if it ever runs the job
        except IndexError:  # begun: the call thread counts it ended, and answers it
            return
        spec = running.spec
        assert spec is not None  # let go only by its call thread, which did not begin
        if running.claim():  # else its deadline passed meanwhile and answered it
            running.cancel()
            running.spec = None
        self._ended()
        abandoned = spec.cancel.finish(self)  # given up on by its deadline meanwhile: no thread to wait for
        if abandoned is not None:
            self._abandoned_returned(spec, abandoned)

    def _refuse(self, call: CallSpec, session: str, reason: dict[str, Any]) -> None:
        self._refused += 1
        with self._exhausted_lock:
            first = (session, call.name) not in self._exhausted
            self._exhausted.add((session, call.name))
        if first:
            message = failure("threads_exhausted", call.call_id, call.name, **reason).content
            logger.warning("{}", message)
            self._emit("threads_exhausted", call.name, message)
        places = call.places  # the governor's, given back before the refusal is its answer
        ready = places.give_back(call) if places is not None else None
        try:
            call.reply(failure("threads_exhausted", call.call_id, call.name, **reason))
        finally:
            if ready:
                places.gov.launch(ready)  # type: ignore[union-attr]  # ready: given back from places

    def _ended(self) -> None:
        self._live.pop()
        # read after the pop: a shutdown that set it before sees this pop in its own check (it reads the
        # count after setting the flag, under the lock), one that sets it after reads the count then
        if self._draining:
            with self._live_lock:
                self._live_changed.notify_all()

    def stopping_from_here(self) -> None:
        """A call thread stopping the system (a tool calling ``stop()``) is not waited
        for by :meth:`shutdown`: it returns only once that stop has."""
        if on_call_thread():
            self._forget(1)

    def running_calls(self) -> int:
        """How many call threads are running a call now (abandoned ones included)."""
        return len(self._live)

    def timed_out(self, call: CallSpec, answer: _Running, result: ToolResult) -> None:
        """A deadline claimed ``answer`` for ``result`` (its timeout): set the call's token,
        abandon its thread, deliver the timeout. From the timer thread this is handed to
        the deadlines thread (the timer thread serves every deadline of the system: it only
        decides; when that thread cannot be started, the host at its thread limit, it is
        done there); from any other thread it is done at once."""
        if self.services.timers.on_timer_thread():
            with self._deliveries_lock:
                deliverer = self._deliverer
                if deliverer is None or not deliverer.is_alive():
                    deliverer = self._deliverer = threading.Thread(target=self._deliver_timeouts,
                                                                   name="rho_actors-deadlines", daemon=True)
                    try:
                        deliverer.start()
                    except RuntimeError:  # the host at its thread limit: delivered here, late but never lost
                        self._deliverer = deliverer = None
                if deliverer is not None:
                    self._deliveries.put((call, answer, result))
                    return
        self._time_out(call, answer, result)

    def _time_out(self, call: CallSpec, answer: _Running, result: ToolResult) -> None:
        try:
            self.give_up(call, "timeout")
        finally:
            answer.deliver(result)

    def _deliver_timeouts(self) -> None:
        """The deadlines thread: each claimed timeout, in the order claimed."""
        while True:
            item = self._deliveries.get()
            if item is None:
                return
            try:
                self._time_out(*item)
            except BaseException:  # it serves every thread call's deadline: it must not end
                logger.exception("delivering the timeout of call {} failed", item[0].call_id)

    def shutdown(self, timeout_s: float) -> None:
        """Give the call threads still running a call (their calls cancelled by now)
        ``timeout_s`` seconds to return, then abandon them (never waited for again);
        end the deadlines thread once the timeouts claimed so far are delivered."""
        with self._live_changed:
            self._draining = True
            if not self._live_changed.wait_for(lambda: len(self._live) <= self._forgotten, timeout_s):
                logger.warning("{} call threads still running at the stop are abandoned", len(self._live))
        with self._deliveries_lock:
            if self._deliverer is not None:
                self._deliveries.put(None)
                self._deliverer = None

    def _run(self, call: CallSpec) -> ToolResult:
        """The runner, in the CallActor's thread."""
        try:  # run_here, inline
            value = call.tool.run(call.args, call.ctx)
            if type(value) is CoroutineType:  # inspect.iscoroutine without its frame (a subclass cannot be made)
                value = asyncio.run(drive(value, call.deadline, call.cancel))
            return result_from_return(call.call_id, call.name, value, call.max_output_chars,
                                      (time.monotonic() - call.dispatched) * 1000)
        except MemoryError:
            return failure("memory_thread", call.call_id, call.name, (time.monotonic() - call.dispatched) * 1000)
        finally:
            abandoned = call.cancel.finish(self)  # why it was given up on (not a reason the tool set itself)
            if abandoned is not None:
                self._abandoned_returned(call, abandoned)

    def _abandoned_returned(self, call: CallSpec, abandoned: str) -> None:
        """``call``'s thread, given up on for ``abandoned`` (a reason), returned (or never began)."""
        if abandoned != "stopping":
            self._forget(-1)
        session = _session(call)
        left = self.abandoned.returned(call.name, session)
        logger.info("abandoned call {} of tool {} returned; its result is late", call.call_id, call.name)
        with self._exhausted_lock:
            refused = [k for k in self._exhausted if k[0] == session]  # every tool refused in it
        for key in refused:
            if self._exhausted_reason(key[1], session) is None:
                with self._exhausted_lock:
                    present = key in self._exhausted
                    self._exhausted.discard(key)
                if present:
                    self._emit("threads_recovered", key[1], f"{left} abandoned threads left")

    def give_up(self, call: CallSpec, reason: str) -> bool:
        """Cancel a call; if its thread is still running, it is abandoned (and, at the
        deadline or cancelled by the host, no shutdown waits for it). Returns whether it
        was still running."""
        session = _session(call)
        # counted before the token is set: a thread that returns in between finds the count
        # to take back (counting after would leave one behind for ever)
        self.abandoned.abandoned(call.name, session)
        forgotten = reason != "stopping"  # a stop waits for its call threads, within its timeout
        if forgotten:
            self._forget(1)
        if not call.cancel.abandon(reason, self):
            self.abandoned.taken_back(call.name, session)  # not abandoned after all
            if forgotten:
                self._forget(-1)
            return False
        return True

    def _forget(self, n: int) -> None:
        with self._live_changed:
            self._forgotten += n
            self._live_changed.notify_all()

    def stats(self) -> dict[str, Any]:
        s = self.services
        return {
            "abandoned_threads_running": self.abandoned.running,
            "abandoned_threads_total": self.abandoned.total,
            "abandoned_threads_refused": self._refused,
            "abandoned_threads_caps": {
                "per_tool": s.threads_per_tool, "per_session": s.threads_per_session, "total": s.threads_total,
            },
            "abandoned_threads_by_session": self.abandoned.sessions(),
        }


def _session(call: CallSpec) -> str:
    """The session a call belongs to ("" when it has none), for the per-session caps."""
    return str(call.ctx.get("session_id") or "")
