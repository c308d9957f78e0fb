"""An HTTP answer the server's connection writes itself, straight to its transport, for
a request no ASGI app will see (``mcp serve --http``): ``503`` to a connection past its
client's ``max_connections_per_client`` (:func:`rho_actors.mcp.guard.connection_protocol`),
``408`` to a request that did not arrive within its bound
(:mod:`rho_actors.mcp.read_deadlines`). A plain-text body naming what was wrong, and
``connection: close``: the connection is closed after it."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

__all__ = ["answer_and_close"]


def answer_and_close(transport: asyncio.Transport, status: HTTPStatus, text: str) -> None:
    """Write ``status`` with ``text`` (a line is added) as its plain-text body on
    ``transport``, then close it (what is written is still sent)."""
    body = f"{text}\n".encode()
    head = (f"HTTP/1.1 {status.value} {status.phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode("ascii")
    transport.write(head + body)
    transport.close()
