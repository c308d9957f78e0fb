"""``thread`` isolation: a call runs in its CallActor's own thread (DESIGN §5).

At the deadline the call's result is a ``timeout`` error on time (unless C code holds
the GIL); the call's :class:`~rho_actors.CancelToken` is set (an ``async def run`` is
really cancelled) and its thread is abandoned: counted, and never waited for. What it
returns later is reported as ``late``. Cancelling a call (the host cancelling its turn,
or its loop stopping) sets the token and abandons the thread the same way.

Abandoned threads still running are capped per tool (``threads_per_tool``) and for the
system (``threads_total``): past a cap, the tool's calls get an ``unavailable`` result
without starting a thread, and an :class:`~rho_actors.events.IsolationEvent` tells the
host, until its threads end; so tools can never use up the threads the system needs.
A ``MemoryError`` in a thread call is a ``memory`` result.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, ClassVar

import pykka
from loguru import logger

from rho_actors.call import CallSpec, RunCall, run_here
from rho_actors.events import IsolationEvent
from rho_actors.isolation.base import Isolation, IsolationServices
from rho_actors.otp.timers import Timer
from rho_actors.results import CANCELLED, failure
from rho_actors.tool import ToolResult

__all__ = ["AbandonedThreads", "ThreadIsolation"]


class AbandonedThreads:
    """Counts thread calls cancelled while running (timed out, or their loop stopped):
    ``total`` ever, and ``running``, those whose thread has not returned yet, also by
    tool name (``by_tool``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.running = 0
        self.by_tool: dict[str, int] = {}

    def abandoned(self, tool: str = "") -> None:
        """Count a running call of ``tool`` whose thread was given up on."""
        with self._lock:
            self.total += 1
            self.running += 1
            self.by_tool[tool] = self.by_tool.get(tool, 0) + 1

    def returned(self, tool: str = "") -> int:
        """Count an abandoned call's thread that has returned since; the tool's count left."""
        with self._lock:
            self.running -= 1
            left = self.by_tool.get(tool, 1) - 1
            if left:
                self.by_tool[tool] = left
            else:
                self.by_tool.pop(tool, None)
            return left

    def of(self, tool: str) -> int:
        """Abandoned threads of ``tool`` still running."""
        with self._lock:
            return self.by_tool.get(tool, 0)


class _Running:
    """A thread call: its CallActor and its deadline timer."""

    __slots__ = ("actor", "call", "isolation", "timer")

    def __init__(self, isolation: ThreadIsolation, call: CallSpec) -> None:
        self.isolation = isolation
        self.call = call
        self.actor: pykka.ActorRef[Any] | None = None
        self.timer: Timer | None = None

    def reply(self, result: ToolResult) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.call.reply(result)

    def deadline(self) -> None:
        """The timer's work at the deadline: cancel, abandon the thread, answer."""
        call = self.call
        if not self.isolation.give_up(self, "timeout"):
            return  # it returned just now (its result is on its way), or it was cancelled
        call.reply(failure(
            "timeout", call.call_id, call.name, (time.monotonic() - call.dispatched) * 1000,
            timeout_ms=call.timeout_ms, consequence=CANCELLED,
        ))

    def cancel(self, reason: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.isolation.give_up(self, reason)


class ThreadIsolation(Isolation):
    """Runs each call in a fresh CallActor's thread; the deadline is a timer."""

    name: ClassVar[str] = "thread"
    untrusted_refused: ClassVar[str | None] = "its code would run in the host process; use isolation='process'"

    def __init__(self, services: IsolationServices) -> None:
        super().__init__(services)
        self.abandoned = AbandonedThreads()
        self._exhausted: set[str] = set()
        self._refused = 0

    def _exhausted_reason(self, tool: str) -> dict[str, Any] | None:
        s = self.services
        of_tool = self.abandoned.of(tool)
        if of_tool >= s.threads_per_tool:
            return {"running": of_tool, "cap": s.threads_per_tool, "scope": "per tool"}
        if self.abandoned.running >= s.threads_total and of_tool:
            return {"running": of_tool, "cap": s.threads_total, "scope": "for the whole system"}
        return None

    def _emit(self, kind: str, tool: str, detail: str = "") -> None:
        if self.services.events is not None:
            self.services.events.emit(IsolationEvent(kind, tool, detail))

    def start(self, call: CallSpec) -> _Running:
        running = _Running(self, call)
        reason = self._exhausted_reason(call.name)
        if reason is not None:
            self._refused += 1
            if call.name not in self._exhausted:
                self._exhausted.add(call.name)
                message = failure("threads_exhausted", call.call_id, call.name, **reason).content
                logger.warning("{}", message)
                self._emit("threads_exhausted", call.name, message)
            call.reply(failure("threads_exhausted", call.call_id, call.name, **reason))
            return running
        actor = self.services.calls.start()
        running.actor = actor
        running.timer = self.services.timers.call_at(call.deadline, running.deadline)
        actor.tell(RunCall(replace(call, reply=running.reply), self._run))
        return running

    def _run(self, call: CallSpec) -> ToolResult:
        """The runner, in the CallActor's thread."""
        try:
            return run_here(call)
        except MemoryError:
            return failure("memory_thread", call.call_id, call.name, (time.monotonic() - call.dispatched) * 1000)
        finally:
            if call.cancel.finish():
                left = self.abandoned.returned(call.name)
                logger.info("abandoned call {} of tool {} returned; its result is late", call.call_id, call.name)
                if call.name in self._exhausted and self._exhausted_reason(call.name) is None:
                    self._exhausted.discard(call.name)
                    self._emit("threads_recovered", call.name, f"{left} abandoned threads left")

    def give_up(self, running: _Running, reason: str) -> bool:
        """Cancel a call; if its thread is still running, it is abandoned (and, at the
        deadline or cancelled by the host, no shutdown waits for it). Returns whether it
        was still running."""
        if not running.call.cancel.cancel(reason):
            return False
        self.abandoned.abandoned(running.call.name)
        if reason != "stopping" and running.actor is not None:
            self.services.calls.abandon(running.actor)
        return True

    def stats(self) -> dict[str, int]:
        return {
            "abandoned_threads_running": self.abandoned.running,
            "abandoned_threads_total": self.abandoned.total,
            "abandoned_threads_refused": self._refused,
        }
