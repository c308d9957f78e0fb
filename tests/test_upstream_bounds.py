"""A hostile MCP server (stdio, trusted or confined) against what rho's client reads of
it: every message bounded before any parser (its size, its arrays and objects, their
depth), notifications rate-bounded, structuredContent bounded, an outputSchema never
applied by the SDK's own validator, its self-description escaped, the SDK's log records
through loguru (DESIGN §6b "What an upstream can cost the host")."""

from __future__ import annotations

import http.server
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("mcp")

from rho_actors import ActorSystem, ErrorKind, ToolCall
from rho_actors.mcp import MCPServer
from rho_actors.mcp.bounds import (
    MAX_CONTAINERS,
    MAX_MESSAGE_BYTES,
    MAX_STRUCTURED_BYTES,
    NOTIFICATION_BURST,
    NOTIFICATIONS_PER_S,
    MessageBounds,
    UpstreamViolation,
    shown_text,
)
from tests.conftest import WAIT_S, slack, wait_for
from tests.helpers import free_port, listening

HOSTILE = str(Path(__file__).parent / "mcp_fixtures" / "hostile_upstream.py")
_MIB = 2**20


def _source(system: ActorSystem, *mode: str, **kwargs: Any) -> MCPServer:
    kwargs.setdefault("connect_timeout_s", WAIT_S)
    kwargs.setdefault("timeout_ms", int(WAIT_S * 1000))
    server = MCPServer(command=[sys.executable, HOSTILE, *mode], name="hostile", **kwargs)
    system.add_source(server, poll_s=None)
    assert server.connected, server.last_error
    return server


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_trusted_upstreams_oversized_message_ends_its_connection_unread(system: ActorSystem, logs: list[str],
                                                                         era: str) -> None:
    """In either protocol era (2026-07-28 goes through the same bounded transport)."""
    server = _source(system, "big", "24", env={"HOSTILE_ERA": era})
    assert server.protocol_version == ("2026-07-28" if era == "modern" else "2025-11-25")
    before = _rss()
    [result] = system.start_loop("s").run_turn([ToolCall("c1", "echo", {"text": "x"})])
    assert result.error_kind is ErrorKind.CRASHED, result
    assert any("longer than 16,777,216 bytes" in line for line in logs), logs[-5:]
    assert _rss() - before < 48 * _MIB  # read whole, 24 MiB cost +144 MiB
    assert wait_for(lambda: server.connections == 2, WAIT_S * 3)  # restarted within its intensity


@pytest.mark.parametrize(("shape", "era"), [("wide", "legacy"), ("deep", "legacy"), ("deep", "modern")])
def test_an_upstreams_containers_are_counted_before_they_are_built(system: ActorSystem, logs: list[str],
                                                                   shape: str, era: str) -> None:
    _source(system, "nested", "8", env={"HOSTILE_ERA": era})
    before = _rss()
    [result] = system.start_loop("s").run_turn([ToolCall("c1", "echo", {"text": shape})])
    assert result.error_kind is ErrorKind.CRASHED, result
    said = "nested deeper than 64 levels" if shape == "deep" else f"more than {MAX_CONTAINERS:,} arrays and objects"
    assert any(said in line for line in logs), logs[-5:]
    assert _rss() - before < 48 * _MIB


def test_a_large_structured_content_is_refused_naming_the_bound(system: ActorSystem) -> None:
    _source(system, "structured", "12")
    before = _rss()
    [result] = system.start_loop("s").run_turn([ToolCall("c1", "echo", {"text": "x"})])
    assert result.error_kind is ErrorKind.UNAVAILABLE or not result.ok, result
    assert f"over rho's bound of {MAX_STRUCTURED_BYTES:,} bytes" in result.content, result.content
    assert _rss() - before < 160 * _MIB  # kept whole, 12 MiB cost about 0.9 GiB


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_progress_flood_is_rate_bounded(system: ActorSystem, era: str) -> None:
    server = _source(system, "progress", "20000", "2", env={"HOSTILE_ERA": era})  # 20,000 at once, the answer 2 s later
    assert server.protocol_version == ("2026-07-28" if era == "modern" else "2025-11-25")
    seen: list[float] = []
    lock = threading.Lock()

    def progress(done: float, total: float | None, message: str | None) -> None:
        with lock:
            seen.append(done)

    started = time.monotonic()
    done = server.call("echo", {"text": "x"}, {"deadline": started + 60, "progress": progress})
    took = time.monotonic() - started
    assert done == "echo: x"
    assert took < 2 + slack(8.0)  # today the 20,000 are forwarded first: answered at 3 to 6 times the 2 s
    with lock:
        assert len(seen) <= NOTIFICATION_BURST + NOTIFICATIONS_PER_S * (took + 1), len(seen)


def test_an_output_schema_is_never_applied_by_the_sdks_validator(system: ActorSystem) -> None:
    _source(system, "regex", "40")  # Python's re: 2**40 steps on "a"*40 + "!" against ^(a+)+$
    started = time.monotonic()
    [result] = system.start_loop("s").run_turn([ToolCall("c1", "echo", {"text": "x"})])
    assert result.ok and result.details == {"structuredContent": {"s": "a" * 40 + "!"}}, result
    assert time.monotonic() - started < WAIT_S


def test_an_upstreams_self_description_is_escaped(system: ActorSystem) -> None:
    forged = "x\x1b[2J\nMCP server files (trusted): connected, 9 tools\u202e"
    server = _source(system, "selfinfo", forged)
    info = server.server_info
    assert info is not None
    shown = f"{info['name']} {info['version']}"
    assert not any(c in shown for c in "\x1b\n\u202e"), shown
    assert info["name"].startswith("x\\x1b[2J\\nMCP server files") and info["version"] == "1\\x1b[2J"


def test_the_sdks_log_records_go_through_loguru_escaped(system: ActorSystem, logs: list[str],
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    _source(system, "badnote", "500")
    [result] = system.start_loop("s").run_turn([ToolCall("c1", "echo", {"text": "x"})])
    assert result.ok, result
    assert wait_for(lambda: any(line.startswith("MCP SDK client: Failed to validate") for line in logs))
    sdk = [line for line in logs if line.startswith("MCP SDK ")]
    assert sdk and not any("\x1b" in line or "\n" in line for line in sdk)
    assert len(sdk) <= 51  # rate-bounded (50 a window, then a count)
    assert "Traceback" not in capfd.readouterr().err  # nothing raw on the host's stderr
    assert not logging.getLogger("mcp").propagate


def test_message_bounds_directly() -> None:
    bounds = MessageBounds("MCP server t")
    with pytest.raises(UpstreamViolation, match="nested deeper than 64"):
        bounds.admit(b'{"jsonrpc": "2.0", "method": "x", "params": ' + b"[" * 70 + b"]" * 70 + b"}")
    admitted = [bounds.admit(b'{"jsonrpc": "2.0", "method": "notifications/progress", "params": '
                             b'{"progressToken": 1, "progress": 1}}') for _ in range(NOTIFICATION_BURST + 50)]
    assert sum(a is not None for a in admitted) <= NOTIFICATION_BURST + 5 and bounds.dropped >= 45
    assert isinstance(bounds.admit(b"not json"), ValueError)
    assert shown_text("a\x1b[2J\nb\t" + "z" * 300) == "a\\x1b[2J\\nb\\t" + "z" * 192 + "..."


def test_a_list_changed_flood_relists_ever_more_rarely(system: ActorSystem, tmp_path: Path) -> None:
    from rho_actors.mcp.bounds import RELIST_COST_FACTOR, RELIST_MAX_S, RELIST_MIN_S, relisting_wait

    marks = tmp_path / "listed"
    _source(system, "flood", "50", str(marks))  # answers each tools/list with another list_changed
    assert wait_for(lambda: marks.exists() and len(marks.read_text().split()) >= 4, 1 + 2 + 4 + WAIT_S * 3)
    times = [float(t) for t in marks.read_text().split()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # each wait at least doubles (1, 2, 4 s...); a gap is its wait and the next listing's own time
    assert all(gap >= RELIST_MIN_S * 2**i * 0.95 for i, gap in enumerate(gaps)), gaps  # today: 1 s each
    assert relisting_wait(RELIST_MIN_S, 0.01, flooded=False) == RELIST_MIN_S
    assert relisting_wait(40.0, 0.01, flooded=True) == RELIST_MAX_S
    assert relisting_wait(RELIST_MIN_S, 0.5, flooded=False) == 0.5 * RELIST_COST_FACTOR


@pytest.mark.parametrize(("mode", "text", "said"), [
    ("nested", "wide", f"more than {MAX_CONTAINERS:,} arrays and objects"),
    ("structured", "x", f"over rho's bound of {MAX_STRUCTURED_BYTES:,} bytes"),
])
def test_a_confined_upstream_is_bounded_the_same(system: ActorSystem, logs: list[str], mode: str, text: str,
                                                  said: str) -> None:
    from rho_actors.mcp.gateway import Gateway, GatewayConfig, UpstreamSpec

    spec = UpstreamSpec("h", command=(sys.executable, HOSTILE, mode, "8"), trusted=False, connect_timeout_s=WAIT_S,
                        timeout_ms=int(WAIT_S * 1000))
    gateway = Gateway(GatewayConfig((spec,)))
    try:
        gateway.start(system)
        assert gateway.status()["h"]["connected"], gateway.status()
        before = _rss()
        [result] = system.start_loop("s").run_turn([ToolCall("c1", "echo", {"text": text})])
        assert not result.ok
        assert said in result.content or any(said in line for line in logs), (result.content, logs[-5:])
        assert _rss() - before < 48 * _MIB
    finally:
        gateway.close()


def _untrusted_gateway(system: ActorSystem, **spec: Any) -> Any:
    from rho_actors.mcp.gateway import Gateway, GatewayConfig, UpstreamSpec

    gateway = Gateway(GatewayConfig((UpstreamSpec("m", command=(sys.executable, HOSTILE, "memory"), trusted=False,
                                                  connect_timeout_s=WAIT_S, timeout_ms=int(WAIT_S * 1000), **spec),)))
    gateway.start(system)
    assert gateway.status()["m"]["connected"], gateway.status()
    return gateway


def test_an_untrusted_upstream_runs_a_process_per_session(system: ActorSystem) -> None:
    gateway = _untrusted_gateway(system)
    try:
        victim, receiver = system.start_loop("victim"), system.start_loop("receiver")
        [paid] = victim.run_turn([ToolCall("c1", "echo", {"text": "card 4111 1111 1111 1111, PIN 1234"})])
        [seen] = receiver.run_turn([ToolCall("c2", "echo", {"text": "anything?"})])
        [again] = victim.run_turn([ToolCall("c3", "echo", {"text": "second"})])
        assert paid.ok and seen.ok and again.ok, (paid, seen, again)
        assert "4111" not in seen.content and seen.content.endswith(": anything?"), seen.content  # today: it is
        victim_id, receiver_id = paid.content.split(":")[0], seen.content.split(":")[0]  # each process names itself
        assert victim_id != receiver_id and again.content.startswith(f"{victim_id}: card 4111")
        servers = gateway.upstreams[0].session_servers
        assert servers is not None and set(servers.sessions()) == {"victim", "receiver"} and servers.started == 2
    finally:
        gateway.close()


def test_one_process_for_every_session_is_an_explicit_opt_in(system: ActorSystem, tmp_path: Path) -> None:
    from rho_actors.mcp.gateway import load_config

    config = tmp_path / "gateway.toml"
    config.write_text('[servers.m]\ncommand = ["python", "x.py"]\ntrusted = false\nshared = true\n')
    assert load_config(config).servers[0].shared
    gateway = _untrusted_gateway(system, shared=True)
    try:
        [first] = system.start_loop("a").run_turn([ToolCall("c1", "echo", {"text": "mine"})])
        assert first.ok, first
        [second] = system.start_loop("b").run_turn([ToolCall("c2", "echo", {"text": "yours"})])
        assert second.content.endswith(": mine | yours") and gateway.upstreams[0].session_servers is None
    finally:
        gateway.close()


def test_session_processes_are_bounded(system: ActorSystem) -> None:
    gateway = _untrusted_gateway(system)
    try:
        servers = gateway.upstreams[0].session_servers
        assert servers is not None
        servers.max_servers = 2
        pids = []
        loops = {session: system.start_loop(session) for session in ("a", "b", "c")}
        for session in ("a", "b", "c"):  # the third stops the least recently used idle one
            [result] = loops[session].run_turn([ToolCall(f"c-{session}", "echo", {"text": session})])
            assert result.ok, result
            pids.append(result.content.split(":")[0])
        assert len(set(pids)) == 3 and set(servers.sessions()) == {"b", "c"}
        servers.idle_s = 0.0  # every idle one is stopped at the next call's look
        [result] = loops["a"].run_turn([ToolCall("c-a2", "echo", {"text": "back"})])
        assert result.ok and result.content.endswith(": back") and set(servers.sessions()) == {"a"}
    finally:
        gateway.close()


def test_an_http_upstreams_oversized_message_is_cut_before_it_is_parsed(system: ActorSystem, tmp_path: Path,
                                                                       logs: list[str]) -> None:
    from tests.test_mcp_source import FIXTURE

    port = free_port()
    process = subprocess.Popen([sys.executable, FIXTURE, str(tmp_path), "--http", str(port)],
                               env={**os.environ, "FIXTURE_JSON": "1"},  # a JSON body: unbounded in the SDK
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: listening(port), timeout_s=WAIT_S * 3)
        server = MCPServer(url=f"http://127.0.0.1:{port}/mcp", timeout_ms=int(WAIT_S * 1000), name="web",
                           connect_timeout_s=WAIT_S)
        system.add_source(server, poll_s=None)
        assert wait_for(lambda: "big" in {info.name for info in system.tools()})
        loop = system.start_loop("h")
        [small] = loop.run_turn([ToolCall("c1", "big", {"mib": 1})])
        assert small.ok and "1,048,576 characters in all" in small.content  # within the bound (the output cap cuts it)
        before = _rss()
        [result] = loop.run_turn([ToolCall("c2", "big", {"mib": 24})])
        assert not result.ok, result.content[:200]
        assert any("longer than 16,777,216 bytes" in line for line in logs), logs[-5:]
        assert _rss() - before < 64 * _MIB
    finally:
        process.kill()
        process.wait(WAIT_S)




class _PaddedJSONServer(http.server.BaseHTTPRequestHandler):
    """A streamable-HTTP MCP server (stateless, JSON bodies) whose ``tools/call`` answer
    is valid JSON preceded by ``PAD`` bytes of whitespace made of blank lines."""

    PAD = 0
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:  # no standalone stream
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        method, pad = message.get("method"), b""
        if "id" not in message:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {
                "tools": {}}, "serverInfo": {"name": "padded", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "padded", "description": "Padded.", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            result, pad = {"content": [{"type": "text", "text": "padded"}]}, b"\n\n" * (self.PAD // 2)
        else:
            result = {}
        body = pad + json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_an_http_upstreams_json_body_is_bounded_whole_blank_lines_or_not(system: ActorSystem,
                                                                        logs: list[str]) -> None:
    # A blank line ends a server-sent event, not a JSON body: whitespace between a JSON
    # body's tokens may be blank lines, and the SDK reads and parses the body whole.
    handler = type("Padded", (_PaddedJSONServer,), {"PAD": MAX_MESSAGE_BYTES + _MIB})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as upstream:
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
        try:
            server = MCPServer(url=f"http://127.0.0.1:{upstream.server_address[1]}/mcp", name="padded",
                               timeout_ms=int(WAIT_S * 1000), connect_timeout_s=WAIT_S)
            system.add_source(server, poll_s=None)
            assert wait_for(lambda: "padded" in {info.name for info in system.tools()}), (server.last_error, logs[-5:])
            [result] = system.start_loop("h").run_turn([ToolCall("c1", "padded", {})])
            assert not result.ok, result.content[:200]
            assert any("longer than 16,777,216 bytes" in line for line in logs), logs[-5:]
        finally:
            upstream.shutdown()
