"""``thread`` isolation: a call runs in its CallActor's own thread (DESIGN §5).

At the deadline the call's result is a ``timeout`` error on time (unless C code holds
the GIL); the call's :class:`~rho_actors.CancelToken` is set (an ``async def run`` is
really cancelled) and its thread is abandoned: counted, and never waited for. What it
returns later is reported as ``late``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, ClassVar

import pykka
from loguru import logger

from rho_actors.call import CallSpec, RunCall, run_here
from rho_actors.isolation.base import Isolation, IsolationServices
from rho_actors.otp.timers import Timer
from rho_actors.results import CANCELLED, failure
from rho_actors.tool import ToolResult

__all__ = ["AbandonedThreads", "ThreadIsolation"]


class AbandonedThreads:
    """Counts thread calls cancelled while running (timed out, or their loop stopped):
    ``total`` ever, and ``running``, those whose thread has not returned yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.running = 0

    def abandoned(self) -> None:
        """Count a running call whose thread was given up on."""
        with self._lock:
            self.total += 1
            self.running += 1

    def returned(self) -> None:
        """Count an abandoned call's thread that has returned since."""
        with self._lock:
            self.running -= 1


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

    def __init__(self, services: IsolationServices) -> None:
        super().__init__(services)
        self.abandoned = AbandonedThreads()

    def start(self, call: CallSpec) -> _Running:
        running = _Running(self, call)
        actor = self.services.calls.start()
        running.actor = actor
        running.timer = self.services.timers.call_at(call.deadline, running.deadline)
        actor.tell(RunCall(replace(call, reply=running.reply), self._run))
        return running

    def _run(self, call: CallSpec) -> ToolResult:
        """The runner, in the CallActor's thread."""
        try:
            return run_here(call)
        finally:
            if call.cancel.finish():
                self.abandoned.returned()
                logger.info("abandoned call {} of tool {} returned; its result is late", call.call_id, call.name)

    def give_up(self, running: _Running, reason: str) -> bool:
        """Cancel a call; if its thread is still running, it is abandoned (and, at the
        deadline, no shutdown waits for it). Returns whether it was still running."""
        if not running.call.cancel.cancel(reason):
            return False
        self.abandoned.abandoned()
        if reason == "timeout" and running.actor is not None:
            self.services.calls.abandon(running.actor)
        return True

    def stats(self) -> dict[str, int]:
        return {"abandoned_threads_running": self.abandoned.running, "abandoned_threads_total": self.abandoned.total}
