"""``mcp serve --http`` against clients that stop reading what it sends: raw sockets on
loopback (a small receive buffer, never read) against :func:`rho_actors.mcp.aserve`.
When none of the bytes waiting for a client leaves within the guard's
``send_timeout_s``, the connection is closed (logged once with its peer) and all it held
is released; the session lives on and its stored events are replayed to a resume. A
client reading slowly, a little at a time, is never cut."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from rho_actors import ActorSystem, tool
from rho_actors.mcp import HTTPGuard
from rho_actors.mcp.send_deadline import STOPPING_DRAIN_S, STOPPING_SEND_TIMEOUT_S
from tests.conftest import WAIT_S, read_line, slack, wait_for
from tests.helpers import free_port
from tests.test_mcp_http_guard import ACCEPT, INITIALIZE, TOKEN, Served
from tests.test_mcp_slow_clients import _logged_once, _until_closed, guarded_servers

BOUND_S = 1.0
RESULT_CHARS = 99_000  # a call's result: under the inline output bound (100 000 characters)
BIG_TOOL = '''
from rho_actors import tool

@tool
def big(n: int) -> str:
    """Return n characters."""
    return "x" * n
'''


@tool
def big(n: int) -> str:
    """Return n characters."""
    return "x" * n


@pytest.fixture
def served(system: ActorSystem) -> Iterator[Callable[..., Served]]:
    """``served(**settings)``: :func:`~tests.test_mcp_slow_clients.guarded_servers` of
    ``system`` with ``big`` registered too."""
    system.register(big)
    yield from guarded_servers(system)


def _largest_send_queue() -> int:
    """The most a TCP socket's send buffer grows to (Linux's ``tcp_wmem``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 * 2**20


def _calls_past_the_kernels_queues() -> int:
    """Pipelined calls whose results fill more than the kernel's largest send queue (and
    the client's receive buffer): the server's writing then waits on the client."""
    return _largest_send_queue() // RESULT_CHARS + 16


def _session(url: str) -> dict[str, str]:
    """The headers of a new 2025-11-25 session's requests."""
    headers = {**ACCEPT, "Authorization": f"Bearer {TOKEN}", "MCP-Protocol-Version": "2025-11-25"}
    opened = httpx.post(url, headers=headers, timeout=WAIT_S, json={**INITIALIZE, "params": {
        **INITIALIZE["params"], "protocolVersion": "2025-11-25"}})  # type: ignore[dict-item]
    assert opened.status_code == 200, opened.text
    headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
    httpx.post(url, headers=headers, timeout=WAIT_S, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return headers


def _not_reading(port: int) -> socket.socket:
    """A connection whose client reads (almost) nothing: a small receive buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT_S)
    sock.connect(("127.0.0.1", port))
    return sock


def _pipeline(sock: socket.socket, port: int, headers: dict[str, str], calls: int) -> None:
    """Send ``calls`` calls of ``big`` on ``sock`` at once (ids 2, 3, ...)."""
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    for k in range(calls):
        body = json.dumps({"jsonrpc": "2.0", "id": 2 + k, "method": "tools/call",
                           "params": {"name": "big", "arguments": {"n": RESULT_CHARS}}}).encode()
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{lines}"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


def _primed(sock: socket.socket) -> str:
    """Read the first response's head and its priming event: the event id to resume from."""
    got = b""
    while not (found := re.search(rb"\nid: (\S+)\r?\n", got)):
        chunk = sock.recv(1024)
        assert chunk, got
        got += chunk
    return found.group(1).decode()


def test_a_client_that_stops_reading_is_cut_at_the_send_bound_and_its_session_lives_on(
        served: Callable[..., Served], logs: list[str]) -> None:
    """Before, a client that pipelined calls whose results it never read parked the
    server's ``send`` (uvicorn awaits the transport's drain without a bound): the
    request's task, the connection (a place in the client's share, 4 MiB of kernel queue
    and the transport's buffer) held for ever, and the server's stop with them."""
    server = served(send_timeout_s=BOUND_S)
    headers = _session(server.url)
    with _not_reading(server.port) as sock:
        _pipeline(sock, server.port, headers, _calls_past_the_kernels_queues())
        resume_from = _primed(sock)
        stopped = time.monotonic()  # the client's last read: no progress from here on
        assert wait_for(lambda: any("send_timeout_s" in line for line in logs)), "the connection was not cut"
        assert time.monotonic() - stopped >= BOUND_S  # never before a whole bound without progress
        _until_closed(sock)  # closed (reset: what it had not taken is dropped)
        _logged_once(logs, sock, "send_timeout_s")
    assert wait_for(lambda: not server.guard.stats()["connections"]), server.guard.stats()
    added = httpx.post(server.url, headers=headers, timeout=WAIT_S, json={
        "jsonrpc": "2.0", "id": 1000, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 1, "b": 2}}})
    assert added.status_code == 200 and '"text":"3"' in added.text.replace(" ", ""), added.text
    result = None
    with httpx.stream("GET", server.url, headers={**headers, "Accept": "text/event-stream",
                                                  "Last-Event-ID": resume_from}, timeout=WAIT_S) as replay:
        assert replay.status_code == 200
        for line in replay.iter_lines():
            if line.startswith("data:") and '"id":2,' in line.replace(" ", ""):
                result = line.split(":", 1)[1]
                break
    assert result is not None and "x" * RESULT_CHARS in result


def test_a_client_reading_slowly_is_never_cut(served: Callable[..., Served], logs: list[str]) -> None:
    """The bound is the time without progress: a client taking a few KiB every 0.3 s of a
    response far larger than the kernel's queues reads on for several bounds (its bytes
    leave the kernel's queue long before the server's transport can hand it more)."""
    server = served(send_timeout_s=BOUND_S)
    headers = _session(server.url)
    calls = _calls_past_the_kernels_queues()
    got = b""
    with _not_reading(server.port) as sock:
        _pipeline(sock, server.port, headers, calls)
        until = time.monotonic() + 4 * BOUND_S
        while time.monotonic() < until:
            got += sock.recv(4096)
            time.sleep(0.3 * BOUND_S)
        assert not [line for line in logs if "send_timeout_s" in line], logs
        while got.count(b'"result"') < calls:  # then everything, as fast as it comes
            chunk = sock.recv(1 << 20)
            assert chunk, "the connection was closed"
            got += chunk
    assert not [line for line in logs if "send_timeout_s" in line], logs


def _server_queue(server_port: int, client_port: int) -> int:
    """The bytes in the server's kernel send queue of its connection to ``client_port``."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1].split(":")[1], fields[2].split(":")[1]
        if (int(local, 16), int(remote, 16)) == (server_port, client_port):
            return int(fields[4].split(":")[0], 16)
    return 0


def _parked(server_port: int, client_port: int) -> bool:
    """Whether the server's send queue to ``client_port`` holds more than a quarter of
    the largest one and stayed as it is for half a second: the server writes no more,
    waiting on the client (it sends a result in a few milliseconds while it can)."""
    queued = _server_queue(server_port, client_port)
    for _ in range(10):
        time.sleep(0.05)
        if _server_queue(server_port, client_port) != queued:
            return False
    return queued > _largest_send_queue() // 4


@pytest.mark.parametrize("trickle", [False, True], ids=["reads nothing", "reads a little at a time"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_server_stops_on_a_signal_while_a_client_reads_nothing(tmp_path: Path, signum: int, trickle: bool) -> None:
    """Before, ``rho-actors mcp serve --http`` stopped by a signal waited for the
    connection of a client that read nothing for ever: uvicorn waits for every
    connection to close, and the one closed with bytes unsent waited for them. Now a
    stopping server gives such bytes at most ``STOPPING_SEND_TIMEOUT_S`` without
    progress, whatever its ``send_timeout_s`` (here the default, 60 s), and
    ``STOPPING_DRAIN_S`` in all: before that too, a client taking 64 KiB every half
    second (progress each time) held the stop for as long as its bytes lasted (more
    than a minute here; 4 MiB at a byte a second is weeks)."""
    tools = tmp_path / "big_tool.py"
    tools.write_text(BIG_TOOL)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", str(tools),
                             "--http", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data")],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env={**os.environ, "RHO_MCP_TOKEN": TOKEN})
    done = threading.Event()
    try:
        assert proc.stderr is not None
        assert "serving MCP at" in read_line(proc.stderr, WAIT_S)
        url = f"http://127.0.0.1:{port}/mcp"

        def up() -> bool:
            try:
                return httpx.post(url, timeout=WAIT_S).status_code == 401
            except httpx.TransportError:
                return False

        assert wait_for(up)
        headers = _session(url)
        with _not_reading(port) as sock:
            _pipeline(sock, port, headers, _calls_past_the_kernels_queues())
            client_port = sock.getsockname()[1]
            assert wait_for(lambda: _parked(port, client_port)), "the server's writing did not wait on the client"

            def take_a_little() -> None:
                while not done.wait(0.5):
                    try:
                        if not sock.recv(65536):
                            return
                    except OSError:
                        return

            reader = threading.Thread(target=take_a_little, daemon=True)
            if trickle:
                reader.start()
            signalled = time.monotonic()
            proc.send_signal(signum)
            proc.wait(WAIT_S)  # raises TimeoutExpired while the connection holds the stop
            bound = STOPPING_DRAIN_S if trickle else 1.25 * STOPPING_SEND_TIMEOUT_S
            assert time.monotonic() - signalled < bound + slack(5.0)
            done.set()
            if trickle:
                reader.join(WAIT_S)
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()


def test_the_send_bound_is_the_guards_and_mcp_serves_flag() -> None:
    from rho_actors.cli.commands import build_parser
    from rho_actors.cli.mcp_http import http_guard
    from rho_actors.mcp.send_deadline import DEFAULT_SEND_TIMEOUT_S

    args = build_parser().parse_args(["mcp", "serve", "--http", "127.0.0.1:8000", "--send-timeout", "7.5"])
    assert http_guard(args).stats()["send_timeout_s"] == 7.5
    default = http_guard(build_parser().parse_args(["mcp", "serve", "--http", "127.0.0.1:8000"]))
    assert default.send_timeout_s == DEFAULT_SEND_TIMEOUT_S == 60.0
    with pytest.raises(ValueError, match="send_timeout_s must be more than 0"):
        HTTPGuard(TOKEN, send_timeout_s=0)
