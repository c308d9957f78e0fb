"""A stdio MCP server's stderr, into loguru under the server's name (not onto the host's
terminal raw).

:class:`StderrLog` is a pipe: its write end is the server process's stderr, a daemon
thread reads the other end and logs each line at ``INFO`` as ``MCP server <name>:
<line>`` (with ``extra["mcp_server"]`` set, for a sink to filter on), its control and
bidirectional characters escaped as a confined child's output is (no terminal control
sequence reaches the host's terminal or log through it). Bounded: a line
is cut at :data:`MAX_LINE_BYTES`, at most :data:`MAX_LINES_PER_WINDOW` lines are logged
per :data:`WINDOW_S` seconds (the rest are counted, and the count is logged once the
window ends), control characters are shown escaped (``\\x1b``: a line cannot move the
terminal's cursor, as for every child's output), and the last :data:`KEPT_LINES` lines
are kept for the message of a server that exits (:meth:`StderrLog.last`).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import TextIO, cast

from loguru import logger

from rho_actors.encoding import shown_bytes
from rho_actors.otp.failure_runs import FailureRun

__all__ = ["KEPT_LINES", "MAX_LINES_PER_WINDOW", "MAX_LINE_BYTES", "WINDOW_S", "StderrLog"]

MAX_LINE_BYTES = 2000
"""A longer stderr line is cut (the rest of it is read and dropped)."""
MAX_LINES_PER_WINDOW = 100
"""Lines logged per window at most; more are counted, not logged."""
WINDOW_S = 10.0
"""The window of :data:`MAX_LINES_PER_WINDOW`, in seconds."""
KEPT_LINES = 3
"""The last lines kept for the message of a server that exited."""




class StderrLog:
    """The stderr pipe of one server process (see the module doc). ``writer`` is the
    file to give the process; call :meth:`close_writer` once it is started."""

    def __init__(self, name: str) -> None:
        self.name = name
        read_fd, write_fd = os.pipe()
        self.writer: TextIO = cast(TextIO, os.fdopen(write_fd, "w"))
        self._reader = os.fdopen(read_fd, "rb")
        self._kept: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._lock = threading.Lock()
        self.logged = 0
        self.dropped = 0
        self._window_start, self._in_window, self._skipped = time.monotonic(), 0, 0  # the reader thread's
        self._log = logger.bind(mcp_server=name)
        self.done = threading.Event()  # set when the pipe is at its end (every writer closed it)
        threading.Thread(target=self._read, name=f"{name}-stderr", daemon=True).start()

    def close_writer(self) -> None:
        """Close this process's copy of the write end (idempotent)."""
        if not self.writer.closed:
            self.writer.close()

    def last(self) -> str:
        """The last lines read (at most :data:`KEPT_LINES`, joined by `` | ``)."""
        with self._lock:
            return " | ".join(self._kept)

    def _read(self) -> None:
        """The reader thread: each line logged (bounded: the module doc) until the pipe's
        end. A line whose handling raises what was not expected is logged (the 1st, 2nd,
        4th... of a run: :class:`~rho_actors.otp.failure_runs.FailureRun`) and the next
        line read: the thread ended there, and the server, its stderr no longer read,
        blocked in its own ``write`` once the pipe was full."""
        failures = FailureRun(f"the stderr reader of MCP server {self.name}")
        try:
            with self._reader:
                while True:
                    raw = self._reader.readline(MAX_LINE_BYTES)
                    if not raw:
                        break
                    cut = not raw.endswith(b"\n")
                    while cut:  # the rest of a long line: dropped
                        rest = self._reader.readline(MAX_LINE_BYTES)
                        if not rest or rest.endswith(b"\n"):
                            break
                    try:
                        self._line(raw, cut)
                    except Exception:
                        failures.log_failed("MCP server {}: a stderr line could not be logged; the next is read",
                                            self.name)
                    else:
                        if failures.count:
                            failures.passed()
            self._log_skipped()
        except (OSError, ValueError):  # the pipe closed under us
            pass
        finally:
            self.done.set()

    def _line(self, raw: bytes, cut: bool) -> None:
        """One stderr line: kept, and logged unless its window is full (then counted)."""
        line = shown_bytes(raw.rstrip(b"\r\n")) + (" [cut]" if cut else "")
        if not line.strip():
            return
        with self._lock:
            self._kept.append(line[:300])
        now = time.monotonic()
        if now - self._window_start >= WINDOW_S:
            self._log_skipped()
            self._window_start, self._in_window, self._skipped = now, 0, 0
        if self._in_window < MAX_LINES_PER_WINDOW:
            self._in_window += 1
            self.logged += 1
            self._log.info("MCP server {}: {}", self.name, line)
        else:
            self._skipped += 1
            self.dropped += 1

    def _log_skipped(self) -> None:
        """Log how many lines the window now ending did not log (if any)."""
        if self._skipped:
            self._log.info("MCP server {}: {} more stderr lines were not logged", self.name, self._skipped)
