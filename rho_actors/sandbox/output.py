"""What untrusted children print, shown by the host (internal; DESIGN §5 "Output").

Every child started clean (:mod:`rho_actors.sandbox.clean`) writes its standard output
and error into one pipe whose other end is read here, by one daemon thread for all
children (:data:`PUMP`). Each line is logged through loguru at ``INFO`` as
``output of <label>: <text>`` (``label`` names the child: ``tool T session S`` for a
worker once it serves a scope), with the ``worker_output`` extra set to the label, so a
sink can route or drop it. The child's text is never written raw anywhere:

- control characters (an escape sequence, a carriage return) are shown escaped
  (``\\x1b``), so a line cannot move the cursor or pose as one of the host's own;
- a line is cut at :data:`MAX_LINE_BYTES` (the rest follows as further lines);
- each child gets :data:`RATE_BYTES_PER_S` bytes a second, after a burst of
  :data:`BURST_BYTES`, each line costing :data:`LINE_COST_BYTES` more (a log record
  costs the host per line, not per byte): beyond that its pipe is not read until its
  budget refills (what one read brought waits, and is logged as the budget allows), so
  a child that floods blocks in its own ``write`` (a worker then reaches its call's
  deadline) and costs the host nothing.

A stream whose reading raises unexpectedly is logged and dropped (:meth:`OutputPump._read_or_drop`):
the pump reads on for every other child.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import threading
import time
from typing import Final

from loguru import logger

from rho_actors.encoding import shown_bytes

__all__ = ["BURST_BYTES", "LINE_COST_BYTES", "MAX_LINE_BYTES", "PUMP", "RATE_BYTES_PER_S", "OutputPump", "OutputStream"]

MAX_LINE_BYTES: Final = 2_000
"""A longer line is logged in pieces of at most this many bytes."""
RATE_BYTES_PER_S: Final = 64 * 2**10
"""What one child may have logged per second, once its burst is spent."""
BURST_BYTES: Final = 256 * 2**10
"""What one child may have logged at once."""
LINE_COST_BYTES: Final = 256
"""What each logged line costs a child's budget beyond its bytes: a record costs the host
the same whatever its length, so a child printing empty lines gets 256 a second, not
65,536 (after a burst of 1,024)."""
_READ_BYTES: Final = 1 << 16


class OutputStream:
    """One child's output pipe, as the pump reads it; ``label`` (settable) names the
    child in each logged line. Lines read wait in ``pending`` (at most one read's worth)
    until the budget lets them be logged; the pipe is not read while any wait."""

    __slots__ = ("_partial", "closed", "fd", "label", "paused_until", "pending", "tokens", "when")

    def __init__(self, fd: int, label: str) -> None:
        self.fd = fd
        self.label = label
        self.tokens = float(BURST_BYTES)
        self.when = time.monotonic()
        self.paused_until = 0.0
        self.closed = False
        self.pending: collections.deque[bytes] = collections.deque()
        self._partial = b""

    def _refill(self, now: float) -> None:
        self.tokens = min(float(BURST_BYTES), self.tokens + (now - self.when) * RATE_BYTES_PER_S)
        self.when = now

    def feed(self, data: bytes) -> None:
        """Queue the whole lines of ``data`` (a partial line waits, up to the line cap)."""
        buf = self._partial + data
        lines = buf.split(b"\n")
        self._partial = lines.pop()
        while len(self._partial) > MAX_LINE_BYTES:
            lines.append(self._partial[:MAX_LINE_BYTES])
            self._partial = self._partial[MAX_LINE_BYTES:]
        for line in lines:
            for start in range(0, max(1, len(line)), MAX_LINE_BYTES):
                self.pending.append(line[start:start + MAX_LINE_BYTES])

    def drain(self, now: float) -> None:
        """Log queued lines while the budget lasts, each costing its bytes and
        :data:`LINE_COST_BYTES`; when lines remain, pause until it has refilled."""
        self._refill(now)
        while self.pending and self.tokens > 0:
            line = self.pending.popleft()
            self.tokens -= len(line) + LINE_COST_BYTES
            self._log(line)
        if self.tokens <= 0 or self.pending:
            self.paused_until = now + (LINE_COST_BYTES - min(self.tokens, 0.0)) / RATE_BYTES_PER_S

    def flush(self) -> None:
        """At the end of the pipe: the partial line, then what the budget allows of the
        queue now; the rest is counted in one line, not logged."""
        if self._partial:
            self.pending.append(self._partial)
            self._partial = b""
        self.drain(time.monotonic())
        if self.pending:
            left, self.pending = len(self.pending), collections.deque()
            logger.bind(worker_output=self.label).info(
                "output of {}: ({:,} more lines not shown: over its output budget)", self.label, left)

    def _log(self, line: bytes) -> None:
        logger.bind(worker_output=self.label).info("output of {}: {}", self.label, shown_bytes(line))


class OutputPump:
    """Reads the output pipes of children (see the module doc); one daemon thread,
    started on the first :meth:`add`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, OutputStream] = {}
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._pid = 0

    def add(self, fd: int, label: str) -> OutputStream:
        """Read ``fd`` (the read end of a child's output pipe; closed here at its end)
        from now on; the stream, whose ``label`` may be changed later."""
        stream = OutputStream(fd, label)
        os.set_blocking(fd, False)
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                self._streams = {}
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="rho-child-output", daemon=True)
                self._thread.start()
            self._streams[fd] = stream
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")
        return stream

    def _run(self) -> None:
        while True:
            now = time.monotonic()
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            timeout: float | None = None
            with self._lock:
                streams = list(self._streams.values())
            for stream in streams:
                if stream.paused_until <= now and stream.pending:
                    self._drain(stream, now)  # what waits is logged before the pipe is read again
                if stream.paused_until > now:
                    wait = stream.paused_until - now
                    timeout = wait if timeout is None else min(timeout, wait)
                else:
                    poller.register(stream.fd, select.POLLIN)
            events = poller.poll(None if timeout is None else max(1, int(timeout * 1000) + 1))
            for fd, _ in events:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_r, 4096):
                            pass
                    continue
                with self._lock:
                    stream_or_none = self._streams.get(fd)
                if stream_or_none is not None:
                    self._read_or_drop(stream_or_none)

    def _read_or_drop(self, stream: OutputStream) -> None:
        """:meth:`_read`; a stream whose read fails unexpectedly is logged and dropped
        (its pipe closed: its child's next write ends it), never the end of the pump,
        which reads every child's output: without it each child blocks in its own
        ``write`` once its pipe is full."""
        try:
            self._read(stream)
        except Exception:
            logger.exception("reading the output of {} failed; its pipe is closed, other output is read on",
                             stream.label)
            with self._lock:
                self._streams.pop(stream.fd, None)
            if not stream.closed:
                stream.closed = True
                with contextlib.suppress(OSError):
                    os.close(stream.fd)

    @staticmethod
    def _drain(stream: OutputStream, now: float) -> None:
        try:
            stream.drain(now)
        except Exception:  # a sink that fails must not stop the pump
            stream.pending.clear()

    def _read(self, stream: OutputStream) -> None:
        now = time.monotonic()
        try:
            data = os.read(stream.fd, _READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(Exception):  # a sink that fails must not stop the pump
                stream.flush()
            with self._lock:
                self._streams.pop(stream.fd, None)
            stream.closed = True
            os.close(stream.fd)
            return
        stream.feed(data)
        self._drain(stream, now)  # over budget: not read again until it has refilled


PUMP: Final = OutputPump()
"""The one pump of this process."""
