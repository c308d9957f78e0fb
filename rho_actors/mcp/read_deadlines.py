"""How long an HTTP client of ``mcp serve --http`` may take to send a request: the
reading deadlines of one connection (:class:`ReadDeadlines`, kept by
:func:`rho_actors.mcp.guard.connection_protocol`'s uvicorn protocol).

uvicorn bounds only the idle time between two requests of a kept-alive connection
(``timeout_keep_alive``) and a header's size (h11, 16 KiB); the MCP SDK bounds a body's
size (4 MiB). Nothing bounded the time a request's reading takes: a client sending its
headers a byte at a time, never finishing them, or a body at a byte a second, held its
connection (and, past the headers, a request of the SDK's) for as long as it liked
(slowloris). So, as nginx's ``client_header_timeout`` and ``client_body_timeout``:

- a request's headers must have arrived whole ``header_timeout_s`` after its first byte
  (the first request of a connection: after the connection was accepted);
- its body ``body_timeout_s`` after its headers. Unlike nginx's bound (between two
  reads), this one is the whole body's: a byte a second never times out between reads.
  The clock stops while the server itself is not reading (uvicorn pauses a connection
  whose buffered body its request has not taken yet).

Past either bound the connection is closed, answered ``408`` naming the bound first when
part of a request came and no answer was begun, and logged once (a warning naming the
peer and the setting). A bound does not run while the server answers (a response, an
SSE stream, a slow call), nor between requests (that is uvicorn's keep-alive)."""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any, Final, Literal

import h11
from loguru import logger

from rho_actors.mcp.plain_answers import answer_and_close

__all__ = ["DEFAULT_BODY_TIMEOUT_S", "DEFAULT_HEADER_TIMEOUT_S", "ReadDeadlines"]

DEFAULT_HEADER_TIMEOUT_S: Final = 20.0
"""Seconds a request's headers may take to arrive whole (nginx's ``client_header_timeout``
is 60; Apache's ``mod_reqtimeout`` 20 to 40)."""
DEFAULT_BODY_TIMEOUT_S: Final = 60.0
"""Seconds a request's body may take to arrive whole, from the end of its headers (the
SDK's largest body, 4 MiB, at about 70 KB/s)."""

Phase = Literal["header", "body"]


class ReadDeadlines:
    """The reading deadlines of one connection served by ``protocol`` (uvicorn's
    ``H11Protocol``): call :meth:`check` after anything that may have moved the
    connection's request on (data received, a response completed), :meth:`close` when
    the connection is lost."""

    def __init__(self, protocol: Any, header_timeout_s: float, body_timeout_s: float) -> None:
        self._protocol = protocol
        self._bounds: dict[Phase, float] = {"header": header_timeout_s, "body": body_timeout_s}
        self._phase: Phase | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._fresh = True  # no request of this connection has been read yet

    def check(self) -> None:
        """Arm the bound of what the connection is reading now (its clock runs on while
        that is unchanged), or none when it reads no request."""
        phase = self._reading()
        if phase == self._phase:
            return
        self.close()
        self._phase = phase
        if phase is not None:
            self._arm(self._bounds[phase])

    def close(self) -> None:
        """Stop the clock (the connection is lost, or reads no request now)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = None

    def _reading(self) -> Phase | None:
        conn: h11.Connection = self._protocol.conn
        if conn.their_state is not h11.IDLE:
            self._fresh = False
        if conn.their_state is h11.SEND_BODY:
            return "body"
        if conn.their_state is h11.IDLE and (self._fresh or conn.trailing_data[0]):
            return "header"  # a first request awaited, or a later one begun
        return None

    def _arm(self, seconds: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._timer = None
        protocol, phase = self._protocol, self._phase
        transport: asyncio.Transport = protocol.transport
        if phase is None or transport.is_closing():
            return
        if phase == "body" and protocol.flow.read_paused:  # the server is not reading: not the client's time
            self._arm(self._bounds["body"])
            return
        setting = f"{phase}_timeout_s"
        seconds = self._bounds[phase]
        what = "request headers" if phase == "header" else "request body"
        begun = phase == "body" or bool(protocol.conn.trailing_data[0])
        host, port = protocol.client or ("?", "?")
        peer = f"{host}:{port}"
        if begun:
            logger.warning("MCP over HTTP: closed the connection of {} (principal {}): its {} did not arrive "
                           "whole within {} s ({})", peer, getattr(protocol.client, "principal", None),
                           what, seconds, setting)
        else:
            logger.warning("MCP over HTTP: closed the connection of {}: it sent no request within {} s ({})",
                           peer, seconds, setting)
        cycle = protocol.cycle if phase == "body" else None
        self.close()
        if begun and (cycle is None or not cycle.response_started):
            if cycle is not None:
                cycle.response_started = True  # nothing more is written on it: the connection closes now
            answer_and_close(transport, HTTPStatus.REQUEST_TIMEOUT,
                             f"Request Timeout: the {what} did not arrive within {seconds:g} s ({setting})")
        else:
            transport.close()
