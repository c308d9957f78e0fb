"""The progress of a served ``tools/call`` on its way to the client
(:class:`LiveProgress`): what a tool reports with ``ctx["progress"]`` becomes the
call's ``notifications/progress``, sent on the server's asyncio loop.

Before, each report was a task of its own on the server's loop, holding its message
until sent. A tool reporting in a tight loop, or a client that stopped reading the
call's SSE stream (its sends wait on the client until ``send_timeout_s``), piled up a
task and a message per report: 50,000 reports of 2 KB held 46,000 tasks and about
480 MB of the server, all of them sent (or stored for a resume) long after the level
they told had changed. Progress is a level: past a few steps the client needs the
latest, not each one. So one call has at most one report being sent and
:data:`MAX_WAITING_REPORTS` waiting, in order; a report made while that many wait
replaces the newest waiting one (counted in :attr:`LiveProgress.replaced`). A tool
reporting at a pace the client takes has each step sent; the values a client gets
still only grow, and the last report made is always sent (before the result:
:meth:`LiveProgress.flushed`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from typing import Any

from loguru import logger

__all__ = ["MAX_WAITING_REPORTS", "LiveProgress"]

MAX_WAITING_REPORTS = 16
"""Reports of one call waiting while one is sent, at most (a later one replaces the newest)."""

Report = tuple[float, "float | None", "str | None"]


class LiveProgress:
    """A running ``tools/call``'s progress to its client: ``session`` is the SDK's
    ``ServerSession`` of the request (its ``report_progress`` sends one), ``aloop`` the
    server's asyncio loop. :meth:`report` from any thread; :meth:`flushed` on ``aloop``."""

    def __init__(self, aloop: asyncio.AbstractEventLoop, session: Any) -> None:
        self.aloop = aloop
        self.session = session
        self.replaced = 0  # reports never sent: a later one came while they waited
        self._lock = threading.Lock()
        self._waiting: deque[Report] = deque()  # reports not sent yet, oldest first
        self._sender: concurrent.futures.Future[None] | None = None  # sending, while there is one to send

    def report(self, done: float, total: float | None, message: str | None) -> None:
        """Send ``(done, total, message)`` once the reports before it have left (it
        replaces the newest waiting one when :data:`MAX_WAITING_REPORTS` wait). Dropped
        once ``aloop`` has closed."""
        with self._lock:
            if len(self._waiting) >= MAX_WAITING_REPORTS:
                self._waiting.pop()
                self.replaced += 1
            self._waiting.append((done, total, message))
            if self._sender is not None:
                return
            try:
                self._sender = asyncio.run_coroutine_threadsafe(self._send(), self.aloop)
            except RuntimeError:  # the asyncio loop has closed
                self._waiting.clear()

    async def flushed(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until every report made so far was sent or failed."""
        with self._lock:
            sender = self._sender
        if sender is not None:
            await asyncio.wait([asyncio.wrap_future(sender)], timeout=timeout_s)

    async def _send(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._waiting:
                        self._sender = None
                        return
                    report = self._waiting.popleft()
                await self.session.report_progress(*report)
        except Exception as exc:  # the connection is closing: what waits is dropped
            logger.debug("progress not sent: {!r}", exc)
            self._stopped()
        except BaseException:  # cancelled: the loop stops
            self._stopped()
            raise

    def _stopped(self) -> None:
        with self._lock:
            self._waiting.clear()
            self._sender = None
