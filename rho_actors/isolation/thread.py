"""``thread`` isolation: a call runs in its CallActor's own thread (DESIGN §5).

At the deadline the call's result is a ``timeout`` error on time (unless C code holds
the GIL): the system's timer thread claims the call's :class:`Answer` for the timeout
first, then sets the call's :class:`~rho_actors.CancelToken` (an ``async def run`` is
really cancelled) and abandons its thread: counted, and never waited for. What it
returns later, ``ok`` included, is reported as ``late``; a result the tool returns
past its deadline before the timer fires is the ``timeout`` result all the same.
Cancelling a call (the host cancelling its turn, or its loop stopping) sets the token
and abandons the thread the same way.

Abandoned threads still running are capped per tool (``threads_per_tool``) and for the
system (``threads_total``): past a cap, the tool's calls get an ``unavailable`` result
without starting a thread, and an :class:`~rho_actors.events.IsolationEvent` tells the
host, until its threads end; so tools can never use up the threads the system needs.
A ``MemoryError`` in a thread call is a ``memory`` result.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, ClassVar

import pykka
from loguru import logger

from rho_actors.events import IsolationEvent
from rho_actors.isolation.base import Isolation, IsolationServices
from rho_actors.isolation.call import Answer, CallSpec, RunCall, run_here
from rho_actors.otp.timers import Timer
from rho_actors.results import CANCELLED, failure
from rho_actors.tool import ToolResult

__all__ = ["AbandonedThreads", "ThreadIsolation"]


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


class _Running(Timer):
    """A thread call: its deadline timer (this object is its entry in the system's timer
    heap: no other object per call), its :class:`Answer` and its CallActor.

    At the deadline (:meth:`fire`, on the timer thread) the timeout claims the answer
    first, then the call's token is set and its thread abandoned, and the timeout is
    delivered, from the isolation's one deadlines thread when it fired on the timer
    thread (so a burst of due deadlines is decided on time, whatever delivering them
    costs), else at once by the thread that saw it passed (:meth:`Timers.run_due`).
    ``cancel()`` without a reason disarms the timer (the answer did it: a result won);
    ``cancel(reason)`` is the isolation's cancel."""

    __slots__ = ("actor", "answer", "call", "isolation")

    fire_anywhere = True  # whichever thread first sees the deadline passed claims the timeout

    def __init__(self, isolation: ThreadIsolation, call: CallSpec) -> None:
        super().__init__(call.deadline)
        self.isolation = isolation
        self.call: CallSpec | None = call
        self.answer: Answer | None = None
        self.actor: pykka.ActorRef[Any] | None = None

    def dropped(self) -> None:
        self.call = self.answer = self.actor = None  # it stays in the heap until due: hold nothing

    def fire(self) -> None:
        answer, call, actor = self.answer, self.call, self.actor
        if answer is None or call is None or not answer.claim():
            return  # a result won (or the call was cancelled) just now
        self.isolation.timed_out(call, actor, answer, answer.timeout(CANCELLED))

    def cancel(self, reason: str | None = None) -> None:
        call, actor = self.call, self.actor
        super().cancel()
        if reason is not None and call is not None:
            self.isolation.give_up(call, actor, reason)


class ThreadIsolation(Isolation):
    """Runs each call in a fresh CallActor's thread; the deadline is a timer."""

    name: ClassVar[str] = "thread"
    untrusted_refused: ClassVar[str | None] = "its code would run in the host process; use isolation='process'"

    def __init__(self, services: IsolationServices) -> None:
        super().__init__(services)
        self.abandoned = AbandonedThreads()
        self._exhausted: set[tuple[str, str]] = set()  # (session, tool) refused until its threads end
        self._exhausted_lock = threading.Lock()
        self._refused = 0
        # timeouts claimed on the timer thread, delivered by the deadlines thread (started on first use)
        self._deliveries: queue.SimpleQueue[tuple[CallSpec, pykka.ActorRef[Any] | None, Answer, ToolResult] | None]
        self._deliveries = queue.SimpleQueue()
        self._deliveries_lock = threading.Lock()
        self._deliverer: threading.Thread | None = None

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
        running = _Running(self, call)
        session = _session(call)
        reason = self._exhausted_reason(call.name, session)
        if reason is not None:
            self._refused += 1
            with self._exhausted_lock:
                first = (session, call.name) not in self._exhausted
                self._exhausted.add((session, call.name))
            if first:
                message = failure("threads_exhausted", call.call_id, call.name, **reason).content
                logger.warning("{}", message)
                self._emit("threads_exhausted", call.name, message)
            call.reply(failure("threads_exhausted", call.call_id, call.name, **reason))
            running.dropped()  # answered: nothing to cancel
            return running
        running.actor = actor = self.services.calls.start()
        running.answer = answer = Answer(call)
        answer.timer = running
        try:
            self.services.timers.schedule(running)
        except RuntimeError:  # the timers are stopped: the system is stopping
            actor.stop(block=False)
            raise pykka.ActorDeadError("the system is stopping") from None
        actor.tell(RunCall(call, self._run, answer))
        self.services.timers.run_due(call.dispatched)  # passed deadlines of other calls, while this thread runs
        return running

    def timed_out(self, call: CallSpec, actor: pykka.ActorRef[Any] | None, answer: Answer,
                  result: ToolResult) -> None:
        """A deadline claimed ``answer`` for ``result`` (its timeout): set the call's token,
        abandon its thread, deliver the timeout. From the timer thread this is handed to
        the deadlines thread (the timer thread serves every deadline of the system: it only
        decides); from any other thread it is done at once."""
        if self.services.timers.on_timer_thread():
            with self._deliveries_lock:
                if self._deliverer is None or not self._deliverer.is_alive():
                    self._deliverer = threading.Thread(target=self._deliver_timeouts, name="rho_actors-deadlines",
                                                       daemon=True)
                    self._deliverer.start()
            self._deliveries.put((call, actor, answer, result))
            return
        self._time_out(call, actor, answer, result)

    def _time_out(self, call: CallSpec, actor: pykka.ActorRef[Any] | None, answer: Answer,
                  result: ToolResult) -> None:
        try:
            self.give_up(call, actor, "timeout")
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
        """End the deadlines thread once the timeouts claimed so far are delivered."""
        with self._deliveries_lock:
            if self._deliverer is not None:
                self._deliveries.put(None)
                self._deliverer = None

    def _run(self, call: CallSpec) -> ToolResult:
        """The runner, in the CallActor's thread."""
        try:
            return run_here(call)
        except MemoryError:
            return failure("memory_thread", call.call_id, call.name, (time.monotonic() - call.dispatched) * 1000)
        finally:
            if call.cancel.finish():
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

    def give_up(self, call: CallSpec, actor: pykka.ActorRef[Any] | None, reason: str) -> bool:
        """Cancel a call; if its thread is still running, it is abandoned (and, at the
        deadline or cancelled by the host, no shutdown waits for it). Returns whether it
        was still running."""
        session = _session(call)
        # counted before the token is set: a thread that returns in between finds the count
        # to take back (counting after would leave one behind for ever)
        self.abandoned.abandoned(call.name, session)
        if not call.cancel.cancel(reason):
            self.abandoned.taken_back(call.name, session)  # not abandoned after all
            return False
        if reason != "stopping" and actor is not None:
            self.services.calls.abandon(actor)
        return True

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
