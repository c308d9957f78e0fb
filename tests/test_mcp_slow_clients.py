"""``mcp serve --http`` against slow clients (slowloris): raw sockets on loopback against
:func:`rho_actors.mcp.aserve`. A request's headers must arrive whole within the guard's
``header_timeout_s`` and its body within ``body_timeout_s``; past either the connection
is answered ``408`` (when part of a request came) and closed, and logged once with its
peer; a client dribbling bytes gains no time by it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2 as httpx
import pytest

from rho_actors import ActorSystem
from rho_actors.mcp import HTTPGuard
from tests.conftest import WAIT_S, slack
from tests.mcp_fixtures import served_tools
from tests.test_mcp_http_guard import ACCEPT, INITIALIZE, TOKEN, Served

BOUND_S = 1.0


def guarded_servers(system: ActorSystem) -> Iterator[Callable[..., Served]]:
    """``start(**settings)``: ``system`` (with ``add``) served over HTTP on loopback behind
    an :class:`HTTPGuard` of those settings; each one started is stopped at the end."""
    system.register(served_tools.add)
    started: list[Served] = []

    def start(**settings: Any) -> Served:
        started.append(Served(system, HTTPGuard(TOKEN, **settings)))
        return started[-1]

    yield start
    for one in started:
        one.stop()


@pytest.fixture
def served(system: ActorSystem) -> Iterator[Callable[..., Served]]:
    """``served(**settings)``: :func:`guarded_servers` of ``system``."""
    yield from guarded_servers(system)


def _connect(server: Served) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), WAIT_S)


def _until_closed(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything the server sent until it closed the connection (bounded by WAIT_S), and
    whether it was reset (the server closed with bytes of ours unread, as a client still
    dribbling has sent: the kernel then drops what we had not read yet)."""
    sock.settimeout(WAIT_S)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        return got, True
    return got, False


def _dribble(sock: socket.socket, data: bytes, every_s: float) -> threading.Thread:
    """Send ``data`` a byte each ``every_s`` (the attack's pace) until it is sent or the
    server closed the connection."""

    def run() -> None:
        for byte in data:
            try:
                sock.send(bytes([byte]))
            except OSError:
                return
            time.sleep(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _request(body: bytes = b"", length: int | None = None, auth: bool = True) -> bytes:
    head = (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\n")
    if auth:
        head += f"Authorization: Bearer {TOKEN}\r\n".encode()
    return head + b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


def _served_still(server: Served) -> None:
    answer = httpx.post(server.url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {TOKEN}"},
                        timeout=WAIT_S)
    assert answer.status_code == 200, answer.text


def _closed_within(sock: socket.socket, bound_s: float, started: float) -> tuple[bytes, bool]:
    got = _until_closed(sock)
    elapsed = time.monotonic() - started
    assert bound_s * 0.9 <= elapsed < bound_s + slack(2.0), elapsed
    return got


def _logged_once(logs: list[str], sock: socket.socket, setting: str) -> None:
    port = sock.getsockname()[1]
    said = [line for line in logs if f"127.0.0.1:{port}" in line]
    assert len(said) == 1 and setting in said[0], said


@pytest.mark.parametrize("dribbled", [True, False], ids=["dribbled", "stalled"])
def test_headers_not_whole_at_the_header_bound_are_answered_408_and_closed(
        served: Callable[..., Served], logs: list[str], dribbled: bool) -> None:
    """Before, a client sending its request line and headers a byte every 0.2 s, or part
    of them and then nothing, held its connection for as long as it liked: uvicorn bounds
    only the idle time between requests (``timeout_keep_alive``), not a request's reading."""
    server = served(header_timeout_s=BOUND_S)
    with _connect(server) as sock:
        started = time.monotonic()
        if dribbled:
            _dribble(sock, _request(b"{}") * 50, 0.2)
        else:
            sock.sendall(_request(b"{}")[:40])
        got, reset = _closed_within(sock, BOUND_S, started)
        _logged_once(logs, sock, "header_timeout_s")
    if not (dribbled and reset):  # a reset may drop the answer: the connection is closed all the same
        assert got.startswith(b"HTTP/1.1 408 ") and b"(header_timeout_s)" in got, got
    _served_still(server)


def test_a_connection_that_sends_nothing_is_closed_at_the_header_bound(
        served: Callable[..., Served], logs: list[str]) -> None:
    server = served(header_timeout_s=BOUND_S)
    with _connect(server) as sock:
        started = time.monotonic()
        assert _closed_within(sock, BOUND_S, started) == (b"", False)  # no request began: nothing to answer
        _logged_once(logs, sock, "sent no request")
    _served_still(server)


@pytest.mark.parametrize("dribbled", [True, False], ids=["dribbled", "stalled"])
@pytest.mark.parametrize("auth", [True, False], ids=["authorized", "answered-401-first"])
def test_a_body_not_whole_at_the_body_bound_is_cut(
        served: Callable[..., Served], logs: list[str], auth: bool, dribbled: bool) -> None:
    """A body sent at a few bytes a second held its connection (and, authorized, a request
    of the SDK's) until it was whole: 4 MiB at that pace is weeks. Unauthorized, the
    ``401`` is answered at once but uvicorn reads (and drops) the rest of the body, each
    byte resetting its keep-alive clock: the connection was held as long."""
    server = served(body_timeout_s=BOUND_S)
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}' + b" " * 1000
    with _connect(server) as sock:
        sock.sendall(_request(length=len(body), auth=auth) + body[:10])
        started = time.monotonic()
        if dribbled:
            _dribble(sock, body[10:], 0.2)
        got, reset = _closed_within(sock, BOUND_S, started)
        _logged_once(logs, sock, "body_timeout_s")
    if not (dribbled and reset):
        assert got.startswith(b"HTTP/1.1 408 " if auth else b"HTTP/1.1 401 "), got
        assert not auth or b"(body_timeout_s)" in got, got
    _served_still(server)


def test_a_request_in_time_and_an_idle_kept_alive_connection_are_served_as_before(
        served: Callable[..., Served], logs: list[str]) -> None:
    """The bounds are the reading's only: a response that takes longer than them (an SSE
    stream, a slow call) and the wait between two requests of a kept-alive connection
    (uvicorn's ``timeout_keep_alive``) are not cut by them."""
    server = served(header_timeout_s=30.0, body_timeout_s=30.0)
    with _connect(server) as sock:
        sock.sendall(_request(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}', auth=False))
        sock.settimeout(WAIT_S)
        assert sock.recv(4096).startswith(b"HTTP/1.1 401 ")
    _served_still(server)
    assert not [line for line in logs if "timeout_s" in line], logs


def test_the_bounds_are_the_guards_and_mcp_serves_flags() -> None:
    from rho_actors.cli.commands import build_parser
    from rho_actors.cli.mcp_http import http_guard
    from rho_actors.mcp.read_deadlines import DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S

    args = build_parser().parse_args(["mcp", "serve", "--http", "127.0.0.1:8000", "--header-timeout", "3",
                                      "--body-timeout", "4.5"])
    stats = http_guard(args).stats()
    assert (stats["header_timeout_s"], stats["body_timeout_s"]) == (3.0, 4.5)
    default = http_guard(build_parser().parse_args(["mcp", "serve", "--http", "127.0.0.1:8000"]))
    assert (default.header_timeout_s, default.body_timeout_s) == (DEFAULT_HEADER_TIMEOUT_S, DEFAULT_BODY_TIMEOUT_S)
    with pytest.raises(ValueError, match="body_timeout_s must be more than 0"):
        HTTPGuard(TOKEN, body_timeout_s=0)
