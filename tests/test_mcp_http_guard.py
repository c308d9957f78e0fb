"""``mcp serve --http`` behind its guard: the SDK's own clients (in this process, and in
subprocesses killed with SIGKILL) against :func:`rho_actors.mcp.aserve` on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import httpx2 as httpx
import psutil
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from rho_actors import ActorSystem
from rho_actors.mcp import HTTPGuard, aserve, peers
from rho_actors.mcp import guard as guard_module
from tests.conftest import WAIT_S, read_line, slack, wait_for
from tests.helpers import free_port
from tests.mcp_fixtures import served_tools

TOKEN = "a-test-token-of-32-characters-xx"
CLIENT = str(Path(__file__).parent / "mcp_fixtures" / "http_client.py")
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}



class Served:
    def __init__(self, system: ActorSystem, guard: HTTPGuard, host: str = "127.0.0.1") -> None:
        self.system, self.guard, self.port = system, guard, free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._loops: list[asyncio.AbstractEventLoop] = []

        async def run() -> None:
            self._loops.append(asyncio.get_running_loop())
            await aserve(system, http=(host, self.port), guard=guard)

        def target() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                asyncio.run(run())

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

        def listening() -> bool:
            try:
                socket.create_connection(("::1" if host == "::" else "127.0.0.1", self.port), 0.2).close()
                return True
            except OSError:
                return False

        assert wait_for(listening)

    def stop(self) -> None:
        if self._loops:
            loop = self._loops[0]
            loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loop)])
        self.thread.join(WAIT_S)


@pytest.fixture
def served(system: ActorSystem) -> Iterator[Callable[..., Served]]:
    system.register(served_tools.add)
    system.register(served_tools.WaitForCancel)
    started: list[Served] = []

    def start(host: str = "127.0.0.1", **settings: Any) -> Served:
        started.append(Served(system, HTTPGuard(TOKEN, **settings), host))
        return started[-1]

    yield start
    for one in started:
        one.stop()


def _session_folders(system: ActorSystem) -> list[Path]:
    folder = system.data_dir / "sessions"
    return sorted(folder.iterdir()) if folder.exists() else []


def _client(token: str | None) -> httpx.AsyncClient:
    return create_mcp_http_client(headers={"Authorization": f"Bearer {token}"} if token else None)


MODERN_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}
MODERN_HEADERS = {**ACCEPT, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}


def test_a_loopback_clients_uid_is_asked_of_the_kernel_once_per_connection(
        served: Callable[..., Served], monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, int]] = []
    kernels = peers.socket_uid

    def counted(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
        asked.append(local)
        return kernels(local, remote)

    monkeypatch.setattr(guard_module, "socket_uid", counted)
    one = served()

    async def main() -> None:
        with anyio.fail_after(WAIT_S * 2):
            for _ in range(2):  # two connections, three requests each (kept alive)
                async with _client(TOKEN) as http:
                    for _ in range(3):
                        answer = await http.post(one.url, json=MODERN_LIST, headers=MODERN_HEADERS)
                        assert answer.status_code == 200 and "add" in answer.text, answer.text

    anyio.run(main)
    # one look-up a connection, each its own port: the two clients' and the fixture's probe (served() waits
    # for the port with a connection, asked as it is accepted, maybe only after served() returned)
    assert len(asked) == len(set(asked)) and len(asked) in (2, 3), asked


def test_requests_without_the_token_get_401_before_any_session_is_made(served: Callable[..., Served]) -> None:
    server = served()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"}):
        answer = httpx.post(server.url, json=INITIALIZE, headers={**ACCEPT, **headers}, timeout=WAIT_S)
        assert answer.status_code == 401, (headers, answer.text)
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert "mcp-session-id" not in answer.headers
        assert "Authorization: Bearer" in answer.json()["error"]["message"]
    assert httpx.get(server.url, headers=ACCEPT, timeout=WAIT_S).status_code == 401
    stats = server.guard.stats()
    assert stats["sessions"] == 0 and stats["refused_unauthenticated"] == 5 and stats["auth"] is True
    assert _session_folders(server.system) == []

    async def main() -> None:
        refused = server.guard.stats()["refused_unauthenticated"]
        with anyio.fail_after(WAIT_S):  # the SDK's client without the token: refused by the guard
            with pytest.raises(Exception):
                async with streamable_http_client(server.url, http_client=_client(None)) as (read, write), \
                        ClientSession(read, write) as session:
                    await session.initialize()
        assert server.guard.stats()["refused_unauthenticated"] > refused  # the 401, not another failure
        assert server.guard.stats()["sessions"] == 0
        with anyio.fail_after(WAIT_S):  # and with it: served
            async with streamable_http_client(server.url, http_client=_client(TOKEN)) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool("add", {"a": 2, "b": 3})
                assert not result.is_error and result.content[0].text == "5"  # type: ignore[union-attr]
                assert server.guard.stats()["rho_sessions"] == 1

    anyio.run(main)
    assert len(_session_folders(server.system)) == 1


def test_a_client_gets_at_most_its_share_of_sessions_and_the_caps_are_settings(served: Callable[..., Served]) -> None:
    server = served(max_sessions_per_client=3, max_sessions=5)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(3):
                read, write = await stack.enter_async_context(
                    streamable_http_client(server.url, http_client=_client(TOKEN)))
                session = await stack.enter_async_context(ClientSession(read, write))
                with anyio.fail_after(WAIT_S):
                    await session.initialize()
            async with _client(TOKEN) as raw:
                refused = await raw.post(server.url, json=INITIALIZE, headers=ACCEPT)
            assert refused.status_code == 429 and "at most 3 per client" in refused.json()["error"]["message"]
            stats = server.guard.stats()
            assert stats["sessions"] == 3 and stats["clients"] == {f"uid:{os.getuid()}": 3}
            assert stats["max_sessions_per_client"] == 3 and stats["max_sessions"] == 5
            assert stats["refused_at_cap"] == 1
        # the clients ended their sessions (DELETE): their places are free again
        assert wait_for(lambda: server.guard.stats()["sessions"] == 0)
        async with streamable_http_client(server.url, http_client=_client(TOKEN)) as (read, write), \
                ClientSession(read, write) as session:
            with anyio.fail_after(WAIT_S):
                await session.initialize()

    anyio.run(main)
    with pytest.raises(ValueError, match="token"):
        HTTPGuard()
    with pytest.raises(ValueError, match="max_sessions_per_client"):
        HTTPGuard(TOKEN, max_sessions_per_client=0)


_POOLED = ("AnyIO worker thread", "rho_actors-idle", "asyncio_")
HOLD_S = 3.0  # how long the killed clients' calls run on a quiet machine (slack() on this one)


def _threads() -> set[str]:
    """This process's threads other than idle ones of bounded pools (anyio's, asyncio's
    executor, the actors' idle pool: each ends them itself)."""
    return {f"{t.name}#{t.ident}" for t in threading.enumerate() if not t.name.startswith(_POOLED)}


def _fds() -> list[str]:
    """This process's open descriptors, by what they are."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found


def test_calls_of_clients_killed_mid_call_run_on_and_their_sessions_are_reaped_within_client_gone_s(
        served: Callable[..., Served]) -> None:
    """A dropped connection is no cancellation (MCP 2025-11-25): each call runs to its end
    (here 3 s), then its session, whose client is gone, is stopped."""
    server = served(client_gone_s=1.0)
    # the calls still run while the test looks at them, however busy the machine (15 s: the tool's maximum)
    hold_s = min(slack(HOLD_S), 15.0)
    me = psutil.Process()
    fds, threads, before = me.num_fds(), _threads(), _fds()
    clients = [subprocess.Popen([sys.executable, CLIENT, server.url, TOKEN, "4", str(hold_s)], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}) for _ in range(2)]
    try:
        for client in clients:  # 8 sessions, each with a call running on the server
            assert client.stdout is not None and read_line(client.stdout, WAIT_S).strip() == "READY"
        assert server.guard.stats()["rho_sessions"] == 8
        # a precondition (the sessions hold resources), by threads: new ones are this test's, whereas the
        # process's fd count also moves as other tests' leftovers close theirs (34 at once, seen under xdist)
        assert len(_threads() - threads) >= 8
    finally:
        for client in clients:
            client.send_signal(signal.SIGKILL)
            client.wait(WAIT_S)
            assert client.stdout is not None
            client.stdout.close()
    killed = time.monotonic()
    assert wait_for(lambda: server.guard.stats()["rho_sessions"] == 0 and me.num_fds() <= fds
                    and not _threads() - threads, timeout_s=WAIT_S), (
        server.guard.stats(), sorted(set(_fds()) - set(before)), _threads() - threads)
    assert time.monotonic() - killed < hold_s + slack(1.0 + 5.0)
    stats = server.guard.stats()
    assert stats["reaped"] == 8
    # each call ran to its end: none was cancelled when its client's connection closed
    sessions = server.system.data_dir / "sessions"
    assert not list(sessions.glob("*/cancelled")) and len(list(sessions.glob("*/finished"))) == 8


def test_rho_actors_mcp_serve_http_prints_its_token_and_refuses_requests_without_it(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RHO_MCP_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", served_tools.__file__,
                             "--http", f"127.0.0.1:{port}", "--data-dir", str(tmp_path), "--max-sessions-per-client",
                             "2"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stderr is not None
        line = read_line(proc.stderr, WAIT_S)
        assert line.startswith("MCP bearer token: "), line
        token = line.split(": ", 1)[1].strip()
        assert len(token) >= 32
        assert "serving MCP at" in read_line(proc.stderr)
        url = f"http://127.0.0.1:{port}/mcp"

        def answer(headers: dict[str, str]) -> int:
            try:
                return httpx.post(url, json=INITIALIZE, headers={**ACCEPT, **headers}, timeout=WAIT_S).status_code
            except httpx.TransportError:
                return 0

        assert wait_for(lambda: answer({}) == 401, timeout_s=WAIT_S)
        assert answer({"Authorization": f"Bearer {token}"}) == 200
    finally:
        proc.kill()
        proc.wait(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()


def test_the_http_settings_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from rho_actors.cli import build_parser, main
    from rho_actors.mcp import guard

    tools = ["mcp", "serve", "--tools", served_tools.__file__]
    assert main([*tools, "--http", "0.0.0.0:8123", "--insecure-no-auth"]) == 2
    assert "only allowed on a loopback address" in capsys.readouterr().err
    assert main([*tools, "--http", "127.0.0.1:8123", "--max-sessions", "0"]) == 2
    assert "expected a number more than 0" in capsys.readouterr().err
    os.environ["RHO_MCP_TOKEN"] = "short"
    try:
        assert main([*tools, "--http", "127.0.0.1:8123"]) == 2
        assert "at least 16 characters" in capsys.readouterr().err
    finally:
        del os.environ["RHO_MCP_TOKEN"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["mcp", "serve", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert f"default {guard.DEFAULT_MAX_SESSIONS};" in shown
    assert f"default {guard.DEFAULT_MAX_SESSIONS_PER_CLIENT};" in shown
    assert f"(default {guard.DEFAULT_MAX_CONNECTIONS_PER_CLIENT}; then 503 and closed)" in shown
    assert f"(default {guard.DEFAULT_IDLE_TIMEOUT_S:g})" in shown
    assert f"(default {guard.DEFAULT_CLIENT_GONE_S:g})" in shown


def test_a_call_whose_connection_drops_runs_on_and_its_result_is_fetched_with_last_event_id(
        served: Callable[..., Served]) -> None:
    """MCP 2025-11-25: a disconnect is no cancellation. The client's POST connection drops
    mid-call; the call runs to its end, and the client, reconnecting with the last event
    id it saw, gets the result from the server's event store."""
    server = served()
    headers = {**ACCEPT, "Authorization": f"Bearer {TOKEN}", "MCP-Protocol-Version": "2025-11-25"}
    opened = httpx.post(server.url, headers=headers, timeout=WAIT_S, json={**INITIALIZE, "params": {
        **INITIALIZE["params"], "protocolVersion": "2025-11-25"}})  # type: ignore[dict-item]
    assert opened.status_code == 200, opened.text
    headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    httpx.post(server.url, headers=headers, timeout=WAIT_S, json=initialized)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "wait_for_cancel", "arguments": {"hold_s": 1.0}}}
    seen = None
    with httpx.stream("POST", server.url, headers=headers, json=call, timeout=WAIT_S) as answer:
        for line in answer.iter_lines():
            if line.startswith("id:"):
                seen = line.split(":", 1)[1].strip()  # the priming event: where to resume from
                break
    assert seen, "the call's stream was not primed"  # leaving the block drops the connection mid-call
    sessions = server.system.data_dir / "sessions"
    assert wait_for(lambda: len(list(sessions.glob("*/finished"))) == 1)
    assert not list(sessions.glob("*/cancelled"))
    result = None
    with httpx.stream("GET", server.url, headers={**headers, "Accept": "text/event-stream", "Last-Event-ID": seen},
                      timeout=WAIT_S) as replay:
        assert replay.status_code == 200
        for line in replay.iter_lines():
            if line.startswith("data:") and '"id":2' in line.replace(" ", ""):
                result = line.split(":", 1)[1]
                break
    assert result is not None and "not cancelled" in result, result


@pytest.mark.skipif(os.geteuid() != 0, reason="a client of another uid needs root to start")
@pytest.mark.parametrize("table", [False, True], ids=["sock_diag", "proc_table"])
def test_a_client_that_closed_its_socket_is_not_taken_for_root(monkeypatch: pytest.MonkeyPatch, table: bool) -> None:
    """A client that sends its request and closes at once leaves a TIME_WAIT socket, which
    the kernel reports with uid 0: the guard must not take it for root (a client of uid
    ``nobody`` would then pass as the owner of root's sessions)."""
    if table:
        monkeypatch.setattr(peers, "_diag_uid", lambda *_: (_ for _ in ()).throw(OSError("no sock_diag")))
    with socket.create_server(("127.0.0.1", 0)) as server:
        ready, closed = os.pipe()
        pid = os.fork()
        if pid == 0:  # the client: uid nobody, connects, sends, closes
            try:
                os.setuid(65534)
                with socket.create_connection(server.getsockname()) as client:
                    client.sendall(b"POST /mcp HTTP/1.1\r\n\r\n")
                os.write(closed, b"x")
            finally:
                os._exit(0)
        connection, peer = server.accept()
        with connection:
            assert os.read(ready, 1) == b"x"
            os.waitpid(pid, 0)
            assert connection.recv(64).startswith(b"POST")
            port = f":{peer[1]:04X}"  # the client's socket, orphaned: its FIN acknowledged, it is a TIME_WAIT one
            assert wait_for(lambda: any(row[1].endswith(port) and row[3] in ("05", "06") for row in peers._rows()))
            scope = {"type": "http", "client": peer, "server": connection.getsockname()}
            assert guard_module._client(scope) == "ip:127.0.0.1"  # no uid: not root's



def _as_nobody(port: int, request: bytes, address: str = "127.0.0.1") -> str:
    """The status line ``request`` gets from ``address``:``port`` sent by a forked child of
    uid ``nobody`` (another local user)."""
    answer, written = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(65534)
            with socket.create_connection((address, port), WAIT_S) as client:
                client.sendall(request)
                os.write(written, client.recv(65536).split(b"\r\n", 1)[0] or b"closed")
        finally:
            os._exit(0)
    os.close(written)
    try:
        with os.fdopen(answer, "rb") as read:
            return read.read().decode("latin-1")
    finally:
        os.waitpid(pid, 0)


def _raw_post(port: int, body: dict[str, Any], *headers: str) -> bytes:
    data = json.dumps(body).encode()
    head = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Authorization: Bearer {TOKEN}",
            "Accept: application/json, text/event-stream", "Content-Type: application/json",
            "MCP-Protocol-Version: 2025-06-18", *headers, f"Content-Length: {len(data)}", "Connection: close"]
    return "\r\n".join(head).encode() + b"\r\n\r\n" + data


@pytest.mark.skipif(os.geteuid() != 0, reason="a client of another uid needs root to start")
def test_a_request_naming_two_sessions_is_refused_not_routed_to_the_first(served: Callable[..., Served]) -> None:
    """The guard checks the session a request names against its client; the SDK routes by
    the first ``Mcp-Session-Id`` header: a client of another uid naming root's session and,
    after it, one nobody owns must not reach root's session."""
    server = served()
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 2, "b": 3}}}

    async def main() -> None:
        async with _client(TOKEN) as http:
            opened = await http.post(server.url, json=INITIALIZE, headers=ACCEPT)
            assert opened.status_code == 200, opened.text
            victim = opened.headers["mcp-session-id"]
            headers = {**ACCEPT, "Mcp-Session-Id": victim, "MCP-Protocol-Version": "2025-06-18"}
            await http.post(server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
            for named in ((victim, "0" * 32), ("0" * 32, victim), (victim, victim)):
                request = _raw_post(server.port, call, *(f"Mcp-Session-Id: {one}" for one in named))
                status = await anyio.to_thread.run_sync(_as_nobody, server.port, request)
                assert status.split()[1:2] in (["400"], ["404"]), (named, status)
            mine = await http.post(server.url, json={**call, "id": 3}, headers=headers)
            assert mine.status_code == 200 and '"5"' in mine.text.replace(" ", ""), mine.text

    anyio.run(main)


def _local_addresses() -> list[str]:
    """This host's addresses that are not loopback ones (its interfaces')."""
    found = {info.address for infos in psutil.net_if_addrs().values() for info in infos
             if info.family in (socket.AF_INET, socket.AF_INET6) and "%" not in info.address}
    return sorted(a for a in found if not peers.is_loopback(a))


@pytest.mark.skipif(os.geteuid() != 0, reason="a client of another uid needs root to start")
@pytest.mark.parametrize("bound", ["::", "0.0.0.0"])
def test_a_local_client_is_its_uid_by_any_address_it_connects_through(served: Callable[..., Served],
                                                                      bound: str) -> None:
    """Served on every address, a local client reaches the server through loopback or
    through one of this host's own addresses: either way it is its uid, never the
    address that every local user connecting through it shares."""
    server = served(host=bound)
    six = bound == "::"
    addresses = ["::1" if six else "127.0.0.1", *[a for a in _local_addresses() if (":" in a) == six][:1]]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 2, "b": 3}}}

    async def main() -> None:
        for address in addresses:
            url = f"http://{'[' + address + ']' if ':' in address else address}:{server.port}/mcp"
            async with _client(TOKEN) as http:
                opened = await http.post(url, json=INITIALIZE, headers=ACCEPT)
                assert opened.status_code == 200, opened.text
                root = opened.headers["mcp-session-id"]
                request = _raw_post(server.port, call, f"Mcp-Session-Id: {root}")
                status = await anyio.to_thread.run_sync(_as_nobody, server.port, request, address)
                assert status.split()[1:2] == ["404"], (address, status)
        assert set(server.guard.stats()["clients"]) == {f"uid:{os.getuid()}"}, server.guard.stats()

    anyio.run(main)


def _holding_as_nobody(port: int, count: int, opened: threading.Event, check: threading.Event) -> list[str]:
    """A forked child of uid ``nobody`` opens ``count`` connections, each sending the start of
    a request and never the rest (slowloris), sets ``opened``; once ``check`` is set, the
    first line each one got (``held``: none, still open), then it closes them."""
    answer, written = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(65534)
            held = [socket.create_connection(("127.0.0.1", port), WAIT_S) for _ in range(count)]
            for one in held:
                one.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            os.write(written, b"opened\n")
            os.read(go_read, 1)
            lines = []
            for one in held:
                one.setblocking(False)
                try:
                    lines.append(one.recv(65536).split(b"\r\n", 1)[0].decode("latin-1") or "closed")
                except BlockingIOError:
                    lines.append("held")
            os.write(written, ("\n".join(lines) + "\n").encode())
        finally:
            os._exit(0)
    os.close(written)
    os.close(go_read)
    try:
        with os.fdopen(answer, "r") as read:
            assert read.readline() == "opened\n"
            opened.set()
            assert check.wait(WAIT_S)
            os.write(go_write, b"!")
            return read.read().splitlines()
    finally:
        os.close(go_write)
        os.waitpid(pid, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="a client of another uid needs root to start")
def test_a_client_holding_connections_gets_its_share_and_every_other_client_is_served(
        served: Callable[..., Served]) -> None:
    """Connections cost the server a descriptor each before any request (and its token) is
    read: a local client of uid ``nobody`` holding requests it never finishes took one
    descriptor per connection for as long as it liked, until the server could accept no
    other client's (nor open a transcript: every call failing). Past
    ``max_connections_per_client`` a client's connection is answered 503 naming the bound
    and closed at once; every other client is served meanwhile."""
    server = served(max_connections_per_client=4)
    opened, check = threading.Event(), threading.Event()
    got: list[list[str]] = []
    holder = threading.Thread(target=lambda: got.append(_holding_as_nobody(server.port, 10, opened, check)))
    holder.start()
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    try:
        assert opened.wait(WAIT_S)

        async def main() -> None:
            async with _client(TOKEN) as http:
                response = await http.post(server.url, json=INITIALIZE, headers=ACCEPT)
                assert response.status_code == 200, response.text
                headers = {**ACCEPT, "Mcp-Session-Id": response.headers["mcp-session-id"],
                           "MCP-Protocol-Version": "2025-06-18"}
                mine = await http.post(server.url, json=call, headers=headers)
                assert mine.status_code == 200 and '"5"' in mine.text.replace(" ", ""), mine.text

        anyio.run(main)
        assert wait_for(lambda: server.guard.stats()["refused_connections"] == 6)
    finally:
        check.set()
        holder.join(WAIT_S)
    [lines] = got
    assert sorted(lines) == ["HTTP/1.1 503 Service Unavailable"] * 6 + ["held"] * 4, lines
    stats = server.guard.stats()
    assert stats["max_connections_per_client"] == 4
    assert wait_for(lambda: "uid:65534" not in server.guard.stats()["connections"])  # its share back once closed
