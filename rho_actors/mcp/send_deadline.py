"""How long an HTTP client of ``mcp serve --http`` may leave what the server sends it
untaken: the sending deadline of one connection (:class:`SendDeadline`, kept by
:func:`rho_actors.mcp.guard.connection_protocol`'s uvicorn protocol), as nginx's
``send_timeout``.

uvicorn writes a response into its asyncio transport; once the kernel's send queue is
full (on Linux it grows to ``tcp_wmem``'s largest, 4 MiB) and 64 KiB more wait in the
transport, it pauses writing and the ASGI ``send`` awaits the transport's drain, with
no bound. A client that sent requests (pipelined calls, a long call's progress, a
``GET`` resuming a stream) and stopped reading held, for as long as it liked: the
request's task parked in ``send`` with what it was sending (a call's result), the
connection (a descriptor, a place in its client's ``max_connections_per_client``, the
transport's buffer and the kernel's queue) and the server's stop: uvicorn waits for
every connection to close before it exits, and a transport closed with bytes unsent
waits for them to be sent, so ``SIGTERM`` or ``SIGINT`` left the server running for ever.

So, while the transport holds bytes it could not hand to the kernel, the bytes that
left are counted: those handed to the kernel less its unacknowledged queue (Linux's
``SIOCOUTQ``; elsewhere only what the transport hands on counts), so a client reading a
little at a time from a full kernel queue is progress, as it is. When none left for
``send_timeout_s`` (the time without progress, never a response's whole time) the
connection is aborted, its unsent bytes dropped, and logged once (a warning naming the
peer and the setting). To the app that is a disconnect: its parked ``send`` returns,
the request's task ends, the connection's place is its client's again; the MCP session
stays, and the events its streams sent (a call's result) stay in the event store for a
``GET`` with ``Last-Event-ID`` (:mod:`rho_actors.mcp.events`). Once the server stops
(uvicorn's graceful shutdown tells each connection), the bound is at most
:data:`STOPPING_SEND_TIMEOUT_S`: the stop waits that long without progress for such a
client, not ``send_timeout_s``, and :data:`STOPPING_DRAIN_S` in all: a client taking a
byte a second is progress, and held a stopping server for as long as its bytes lasted
(4 MiB of kernel queue: weeks; nginx bounds a stopping worker's whole time too,
``worker_shutdown_timeout``)."""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from typing import Any, Final

from loguru import logger

__all__ = ["DEFAULT_SEND_TIMEOUT_S", "STOPPING_DRAIN_S", "STOPPING_SEND_TIMEOUT_S", "SendDeadline"]

DEFAULT_SEND_TIMEOUT_S: Final = 60.0
"""Seconds the bytes a connection's client has not taken may wait without any of them
leaving (nginx's ``send_timeout`` is 60)."""

STOPPING_SEND_TIMEOUT_S: Final = 2.0
"""Seconds without progress a stopping server gives a connection's untaken bytes (at most:
a smaller ``send_timeout_s`` stays)."""

STOPPING_DRAIN_S: Final = 10.0
"""Seconds a stopping server gives a connection's untaken bytes in all, progress or not
(from the stop; bytes that left the server's transport by then are the kernel's)."""

_TICKS: Final = 4  # progress is looked at this many times a bound: a cut comes within 1.25 bounds of it
_OUTQ: Final = getattr(termios, "TIOCOUTQ", None)  # SIOCOUTQ on Linux: a TCP socket's unacknowledged bytes


class SendDeadline:
    """The sending deadline of one connection served by ``protocol`` (uvicorn's
    ``H11Protocol``): give uvicorn :meth:`watch`'s transport, call :meth:`close` when the
    connection is lost."""

    def __init__(self, protocol: Any, send_timeout_s: float) -> None:
        self._protocol = protocol
        self._bound = send_timeout_s
        self._raw: asyncio.Transport | None = None
        self._written = 0  # bytes given to the transport
        self._left = 0  # bytes that had left at the last look
        self._since = 0.0  # the loop's time of the last progress seen
        self._timer: asyncio.TimerHandle | None = None
        self._until: float | None = None  # stopping: the loop's time past which nothing waits

    def watch(self, transport: asyncio.Transport) -> asyncio.Transport:
        """``transport`` (the connection's), counting what is written to it."""
        self._raw = transport
        return _Counted(transport, self)

    def close(self) -> None:
        """Stop the clock (the connection is lost): nothing written after arms it again."""
        self._raw = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stopping(self) -> None:
        """The server stops: from now on the bound is at most :data:`STOPPING_SEND_TIMEOUT_S`
        (looked at again at once when bytes wait)."""
        self._bound = min(self._bound, STOPPING_SEND_TIMEOUT_S)
        self._until = asyncio.get_running_loop().time() + STOPPING_DRAIN_S
        if self._timer is not None:
            self._timer.cancel()
            self._look_in(0.0)

    def _wrote(self, size: int) -> None:
        self._written += size
        if self._timer is None and self._raw is not None and self._raw.get_write_buffer_size():
            self._left = self._gone(self._raw)
            self._since = asyncio.get_running_loop().time()
            self._look_in(self._bound / _TICKS)

    def _look_in(self, seconds: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(max(seconds, 0.0), self._look)

    def _look(self) -> None:
        self._timer = None
        raw = self._raw
        if raw is None or not raw.get_write_buffer_size():
            return  # all handed to the kernel (or the connection is gone): armed again by the next write
        now, left = asyncio.get_running_loop().time(), self._gone(raw)
        if self._until is not None and now >= self._until:
            self._expired(raw, STOPPING_DRAIN_S, "STOPPING_DRAIN_S: the server stops")
            return
        if left > self._left:
            self._left, self._since = left, now
        elif now - self._since >= self._bound:
            self._expired(raw, self._bound, "send_timeout_s")
            return
        due = self._since + self._bound if self._until is None else min(self._since + self._bound, self._until)
        self._look_in(min(self._bound / _TICKS, due - now))

    def _gone(self, raw: asyncio.Transport) -> int:
        """Bytes written that left: handed to the kernel and, where it says, acknowledged."""
        unacknowledged = 0
        sock = raw.get_extra_info("socket")
        if _OUTQ is not None and sock is not None:
            try:
                unacknowledged = struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
            except (OSError, ValueError):
                unacknowledged = 0
        return self._written - raw.get_write_buffer_size() - unacknowledged

    def _expired(self, raw: asyncio.Transport, seconds: float, why: str) -> None:
        host, port = self._protocol.client or ("?", "?")
        what = "none of the {} bytes waiting for it was taken" if why == "send_timeout_s" else \
            "the {} bytes waiting for it were not all taken"
        logger.warning("MCP over HTTP: closed the connection of {}:{} (principal {}): " + what + " within {} s ({})",
                       host, port, getattr(self._protocol.client, "principal", None), raw.get_write_buffer_size(),
                       seconds, why)
        raw.abort()


class _Counted(asyncio.Transport):
    """A connection's transport, telling its :class:`SendDeadline` of each write."""

    def __init__(self, raw: asyncio.Transport, deadline: SendDeadline) -> None:
        super().__init__()
        self._raw, self._deadline = raw, deadline

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._raw.write(data)
        self._deadline._wrote(len(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._raw.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._raw.is_closing()

    def close(self) -> None:
        self._raw.close()

    def abort(self) -> None:
        self._raw.abort()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._raw.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._raw.get_protocol()

    def is_reading(self) -> bool:
        return self._raw.is_reading()

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits()

    def write_eof(self) -> None:
        self._raw.write_eof()

    def can_write_eof(self) -> bool:
        return self._raw.can_write_eof()
