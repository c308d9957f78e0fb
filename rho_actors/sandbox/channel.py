"""The framed channel between a parent and one child process (internal).

Both ends speak the same framing, defined here and nowhere else: a frame is a one-byte
type tag (see :mod:`rho_actors.sandbox.wire`), an 8-byte big-endian body length, and the
body. Reads and writes are non-blocking underneath and bounded by a deadline (a
``time.monotonic()`` instant, or ``None`` for none), so the parent never waits past a
call's deadline on a child. A frame longer than the reader's limit is refused as
:class:`Malformed` before its body is read.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import math
import os
import select
import struct
import termios
import time
from typing import Any, Final

__all__ = ["DeadlineReached", "Channel", "Malformed"]

_HEADER: Final = struct.Struct("!cQ")


class DeadlineReached(Exception):
    """The deadline passed before a whole frame arrived (or was written)."""


class Malformed(Exception):
    """The other end sent a frame that breaks the protocol (named in the message)."""


def _poll_timeout_ms(deadline: float | None) -> int | None:
    """A ``poll`` timeout (ms, rounded up; ``None``: no bound) until ``deadline`` (a
    ``time.monotonic()`` instant, ``None``: none); ``DeadlineReached`` once it passed."""
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise DeadlineReached
    return math.ceil(remaining * 1000) if remaining < 1e6 else None


class Channel:
    """One end of a child's pipe (``conn``: a ``multiprocessing`` connection, used only
    for its file descriptor). ``sentinel`` (the parent's end only) is the child's process
    sentinel: when the child is gone and nothing more is readable, :meth:`recv` raises
    ``EOFError``. ``peer`` (a worker's channel: the parent's own copy of the child's end,
    owned from now on) keeps what was written to the child and never read readable after
    the child ended (:meth:`unread_by_child`); the child's end then never reads as closed
    here, its end is the sentinel's."""

    __slots__ = ("_buf", "_fd", "_peer", "_poll", "_sentinel", "conn")

    def __init__(self, conn: Any, sentinel: int | None = None, peer: int = -1) -> None:
        self.conn = conn
        self._peer = peer
        self._fd: int = conn.fileno()
        os.set_blocking(self._fd, False)
        self._sentinel = sentinel
        self._buf = bytearray()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        if sentinel is not None:
            self._poll.register(sentinel, select.POLLIN)

    def _frame(self, max_bytes: int | None) -> tuple[bytes, bytes] | None:
        buf = self._buf
        if len(buf) < _HEADER.size:
            return None
        tag, size = _HEADER.unpack_from(buf)
        if max_bytes is not None and size > max_bytes:
            raise Malformed(f"a message of {size:,} bytes, more than the limit of {max_bytes:,}")
        end = _HEADER.size + size
        if len(buf) < end:
            return None
        with memoryview(buf) as view:  # one copy of the body, not two (a slice, then bytes)
            body = bytes(view[_HEADER.size:end])
        if end == len(buf):
            buf.clear()  # frees the buffer: a 64 MiB frame leaves no 64 MiB behind
        else:
            del buf[:end]
        return tag, body

    def recv(self, deadline: float | None = None, max_bytes: int | None = None) -> tuple[bytes, bytes]:
        """The next whole frame as ``(tag, body)``. Raises :class:`DeadlineReached` at
        ``deadline``, ``EOFError`` when the other end has closed or ended,
        :class:`Malformed` for a frame over ``max_bytes`` (bytes)."""
        while True:
            frame = self._frame(max_bytes)
            if frame is not None:
                return frame
            timeout_ms = _poll_timeout_ms(deadline)
            events = self._poll.poll(timeout_ms)
            if not events:
                continue
            try:
                data = os.read(self._fd, max(1 << 16, min(1 << 24, len(self._buf))))
            except BlockingIOError:
                data = None
            except OSError as exc:  # ECONNRESET and friends: the other end is gone
                raise EOFError(str(exc)) from None
            if data == b"":
                raise EOFError("the other end closed its pipe")
            if data:
                self._buf += data
            elif any(fd == self._sentinel for fd, _ in events):
                raise EOFError("the child process ended")

    @property
    def fd(self) -> int:
        """The pipe's file descriptor (non-blocking)."""
        return self._fd

    @property
    def sentinel(self) -> int | None:
        """The child's process sentinel (the parent's end only)."""
        return self._sentinel

    def read_some(self, max_bytes: int | None = None) -> tuple[bytes, bytes] | None:
        """For a reader that polls this pipe itself: read what is readable now (no wait)
        and return the next whole frame, or ``None`` until one has arrived. Raises
        ``EOFError`` when the other end has closed, :class:`Malformed` for a frame over
        ``max_bytes``. Call it again while it returns frames: a read may bring several."""
        frame = self._frame(max_bytes)
        if frame is not None:
            return frame
        try:
            data = os.read(self._fd, max(1 << 16, min(1 << 24, len(self._buf))))
        except BlockingIOError:
            return None
        except OSError as exc:  # ECONNRESET and friends: the other end is gone
            raise EOFError(str(exc)) from None
        if not data:
            raise EOFError("the other end closed its pipe")
        self._buf += data
        return self._frame(max_bytes)

    def buffered(self, max_bytes: int | None = None) -> tuple[bytes, bytes] | None:
        """The next whole frame already read (no read), or ``None``; raises as :meth:`read_some`."""
        return self._frame(max_bytes)

    def write_some(self, data: memoryview) -> memoryview:
        """Write what the pipe takes now of ``data`` (no wait); what is left. Raises
        ``EOFError`` (the other end is closed)."""
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            return data
        except OSError as exc:  # EPIPE, ECONNRESET
            raise EOFError(str(exc)) from None
        return data[written:]

    @staticmethod
    def frame(tag: bytes, body: bytes) -> memoryview:
        """One frame's bytes, for :meth:`write_some`."""
        return memoryview(_HEADER.pack(tag, len(body)) + body)

    def send(self, tag: bytes, body: bytes, deadline: float | None = None) -> None:
        """Write one whole frame before ``deadline``. Raises :class:`DeadlineReached` or
        ``EOFError`` (the other end is closed)."""
        view = self.frame(tag, body)
        poller: Any = None
        while view:
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                written = 0
            except OSError as exc:  # EPIPE, ECONNRESET
                raise EOFError(str(exc)) from None
            view = view[written:]
            if not view:
                return
            timeout_ms = _poll_timeout_ms(deadline)
            if poller is None:
                poller = select.poll()
                poller.register(self._fd, select.POLLOUT)
                if self._sentinel is not None:
                    poller.register(self._sentinel, select.POLLIN)
            events = poller.poll(timeout_ms)
            if any(fd == self._sentinel for fd, _ in events):
                raise EOFError("the child process ended")

    def has_unread(self) -> bool:
        """Whether bytes read from the pipe wait in this end's buffer (no system call)."""
        return bool(self._buf)

    def quiet(self) -> bool:
        """Whether nothing is readable or left unread and the child is still running
        (no wait). A child that sent more than it was asked for is not quiet."""
        return not self._buf and not self._poll.poll(0)

    def unread_by_child(self) -> int | None:
        """How many bytes written to the child it has not read (``FIONREAD`` of its end,
        the parent's copy: the same after the child ended); ``None`` without that copy.
        More than 0 once the child ended: it never had the whole of the last frame."""
        if self._peer < 0:
            return None
        count = array.array("i", [0])
        try:
            fcntl.ioctl(self._peer, termios.FIONREAD, count, True)
        except OSError:
            return None
        return count[0]

    def close(self) -> None:
        """Close this end (and the parent's copy of the child's end)."""
        with contextlib.suppress(OSError):
            self.conn.close()
        if self._peer >= 0:
            with contextlib.suppress(OSError):
                os.close(self._peer)
            self._peer = -1
