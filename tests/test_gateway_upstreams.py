"""What an upstream MCP server can do to the gateway and the host, bounded: an endless
tools/list, a list_changed flood, two tools under one name, server names that would make
two namespaced names meet, an outputSchema too costly to check, terminal controls on its
stderr; a namespaced tool keeps its outputSchema."""

from __future__ import annotations

import itertools
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from rho_actors import ActorSystem
from tests.conftest import WAIT_S

HOSTILE = str(Path(__file__).parent / "mcp_fixtures" / "hostile_upstream.py")


def test_an_upstream_listing_endless_pages_of_tools_is_bounded(system: ActorSystem) -> None:
    from rho_actors.mcp.gateway import Gateway, GatewayConfig, UpstreamSpec
    from rho_actors.mcp.source import MAX_TOOLS

    spec = UpstreamSpec("many", command=(sys.executable, HOSTILE, "many", "50"), trusted=False,
                        connect_timeout_s=WAIT_S)
    gateway = Gateway(GatewayConfig((spec,)))
    try:
        gateway.start(system)
        assert gateway.status()["many"]["connected"], gateway.status()
        served = gateway.status()["many"]["tools"]
        assert len(served) == MAX_TOOLS  # 100 pages of 50 were offered: the first 4096 kept
        assert "t0_0" in served and "t81_45" in served and "t81_46" not in served
        assert len(system.tools()) == MAX_TOOLS
    finally:
        gateway.close()


def test_an_upstream_cannot_serve_two_tools_under_one_name(system: ActorSystem) -> None:
    from rho_actors import ToolCall
    from rho_actors.mcp.gateway import Gateway, GatewayConfig, UpstreamSpec

    # "h" lists echo and "h__echo"; "g" lists echo too, so h's echo is served as h__echo
    upstreams = (UpstreamSpec("h", command=(sys.executable, HOSTILE, "selfname", "0", "h"), trusted=False),
                 UpstreamSpec("g", command=(sys.executable, HOSTILE, "plain"), trusted=False))
    gateway = Gateway(GatewayConfig(upstreams))
    try:
        gateway.start(system)
        status = gateway.status()
        assert status["h"]["tools"] == {"h__echo": "echo", "h__h__echo": "h__echo"}, status
        loop = system.start_loop("names")
        [own, other] = loop.run_turn([ToolCall("c1", "h__echo", {"text": "x"}),
                                      ToolCall("c2", "h__h__echo", {"text": "y"})])
        assert own.ok and own.content == "echo: x" and other.ok and other.content == "h__echo: y"
    finally:
        gateway.close()


def _load(load: Any, text: str) -> Any:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    try:
        return load(f.name)
    finally:
        os.unlink(f.name)


def test_server_names_cannot_make_two_namespaced_names_meet() -> None:
    from rho_actors.mcp.gateway import GatewayConfigError, _Names, load_config
    from rho_actors.mcp.names import default_name

    # with servers "a" and "a_", a's "_x" and a_'s "x" were both "a___x"
    for bad in ("a_", "a__b"):
        with pytest.raises(GatewayConfigError, match="without '__' and not ending in '_'"):
            _load(load_config, f"[servers.{bad}]\ncommand = 'x'\n")
    assert default_name(["python", "-m", "my__srv_"]) == "my_srv"
    names = _Names("namespace", host=(), servers={"a", "a-b"})
    names.update("a", {"b__x", "a__y"})
    assert names.served("a", "a__y", prefix=False) == "a__a__y" and names.served("a", "b__x", prefix=True) == "a__b__x"


def test_an_mcp_servers_stderr_cannot_send_terminal_controls_to_the_log() -> None:
    from loguru import logger

    from rho_actors.mcp.stderr_log import StderrLog

    seen: list[str] = []
    logger.enable("rho_actors")
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="INFO",  # this server's lines only
                      filter=lambda record: record["extra"].get("mcp_server") == "inky")
    try:
        log = StderrLog("inky")
        log.writer.write("\x1b]0;owned\x07title \x1b[2J\x9bcleared\u202eevil\n")
        log.close_writer()
        assert log.done.wait(WAIT_S)
    finally:
        logger.remove(sink)
        logger.disable("rho_actors")
    [line] = seen
    assert not any(c in line + log.last() for c in "\x1b\x07\x9b\u202e"), repr(line)
    assert line.startswith("MCP server inky: ") and "title" in line and "cleared" in line


class _Catastrophic:
    """A tool whose outputSchema has a pattern Python's re takes exponential time on."""

    @staticmethod
    def name() -> str:
        return "catastrophic"

    @staticmethod
    def description() -> str:
        return "Answer a structured value."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {}}

    @staticmethod
    def output_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        from rho_actors import Details

        return Details("a structured value", {"structuredContent": {"a": "a" * 40 + "!"}})


def test_an_output_schema_is_checked_in_linear_time_and_within_the_declaration_bounds(system: ActorSystem) -> None:
    from rho_actors import ToolCall
    from rho_actors.mcp.call_results import call_tool_result, output_schema

    class Huge(_Catastrophic):
        @staticmethod
        def name() -> str:
            return "huge"

        @staticmethod
        def output_schema() -> dict[str, Any]:  # valid JSON Schema, far past the bounds of a parameter schema
            return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}

    system.register(_Catastrophic)
    system.register(Huge)
    assert output_schema(system, "huge") is None
    schema = output_schema(system, "catastrophic")
    assert schema == _Catastrophic.output_schema()  # RE2 takes the pattern: it is served
    [result] = system.start_loop("redos").run_turn([ToolCall("c1", "catastrophic", {})])
    verdict: list[Any] = []
    checking = threading.Thread(target=lambda: verdict.append(call_tool_result(result, schema)), daemon=True)
    checking.start()
    checking.join(WAIT_S)  # Python's re would take hours over 40 a's: serving's event loop would hang
    assert verdict, "checking a result against its outputSchema did not finish"
    [answer] = verdict
    assert answer.is_error and "does not match its outputSchema" in answer.content[0].text
    assert "$.a" in answer.content[0].text


def test_a_list_changed_flood_relists_at_a_bounded_rate(system: ActorSystem, tmp_path: Path) -> None:
    from rho_actors.mcp import MCPServer
    from rho_actors.mcp.source import RELIST_MIN_S
    from tests.conftest import wait_for

    marks = tmp_path / "listed"
    # answers every tools/list with another list_changed: unbounded, the host relists back to back
    server = MCPServer(command=[sys.executable, HOSTILE, "flood", "0", str(marks)], name="flood",
                       connect_timeout_s=WAIT_S)
    handle = system.add_source(server, poll_s=None)
    try:
        assert server.connected, server.last_error
        assert wait_for(lambda: marks.exists() and len(marks.read_text().split()) >= 3, RELIST_MIN_S * 3 + WAIT_S)
        times = [float(t) for t in marks.read_text().split()]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= RELIST_MIN_S * 0.9, gaps
        assert "echo" in {t.name for t in system.tools()}
    finally:
        handle.close()


def test_a_namespaced_upstream_tool_keeps_its_output_schema() -> None:
    from rho_actors.mcp.gateway import _Served
    from rho_actors.mcp.source import MCPTool

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    tool = MCPTool(None, {"name": "count", "description": "Count.", "inputSchema": {"type": "object"},  # type: ignore[arg-type]
                          "outputSchema": schema})
    served = _Served(tool, "files__count")
    assert served.name() == "files__count" and served.output_schema() == schema
