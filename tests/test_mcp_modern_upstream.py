"""An upstream MCP server that speaks protocol 2026-07-28 only (the official SDK's own
server and 2026-07-28 loops: ``mcp_fixtures/modern_upstream.py``) as a source and behind
the gateway, over stdio and HTTP: its tools listed with their annotations and cache
hints, called, its errors mapped, its ``input_required`` questions relayed to the
gateway's own client; a handshake-era upstream keeps its handshake (DESIGN §6b)."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.client import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from rho_actors import ActorSystem, ErrorKind, Loop, ToolCall, ToolResult
from rho_actors.mcp import MCPServer
from tests.conftest import WAIT_S, slack, wait_for
from tests.helpers import free_port

FIXTURES = Path(__file__).parent / "mcp_fixtures"
MODERN = str(FIXTURES / "modern_upstream.py")
LEGACY = str(FIXTURES / "annotated_upstream.py")
HOSTILE = str(FIXTURES / "hostile_upstream.py")



@pytest.fixture
def modern_http(tmp_path: Path) -> Iterator[str]:
    """The modern-only server on streamable HTTP: its URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, MODERN, "--http", str(port), "--marks", str(tmp_path / "marks")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    try:
        assert wait_for(listening, timeout_s=WAIT_S)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait(WAIT_S)


def test_the_fixture_refuses_the_handshake() -> None:
    """The upstream is modern-only indeed: the SDK's own handshake is refused."""
    async def main() -> None:
        with anyio.fail_after(WAIT_S):
            params = StdioServerParameters(command=sys.executable, args=[MODERN])
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                with pytest.raises(MCPError, match="initialize handshake is not accepted"):
                    await session.initialize()

    anyio.run(main)


def _offered(system: ActorSystem) -> dict[str, dict[str, Any]]:
    return {info.name: dict(info.annotations) for info in system.tools()}


def _check_the_source(system: ActorSystem, source: MCPServer, marks: Path) -> None:
    system.add_source(source, poll_s=None)
    assert source.connected, source.last_error
    assert source.protocol_version == "2026-07-28"
    assert source.server_info is not None and source.server_info["name"] == "modern-only"
    offered = _offered(system)
    assert {"lookup", "ask_name", "broken", "hang"} <= set(offered)
    assert offered["lookup"] == {"title": "Look it up", "readOnlyHint": True, "openWorldHint": False}
    loop = system.start_loop("m")
    ok = _answered(loop, "c1", "lookup", {"key": "k"})
    assert ok.ok and ok.content == "value of k"
    bad = _answered(loop, "c2", "broken", {})
    assert bad.error_kind is ErrorKind.TOOL_ERROR and bad.content == "Error executing tool broken"
    asked = _answered(loop, "c3", "ask_name", {})
    assert asked.error_kind is ErrorKind.RAISED, asked
    assert "needed input the call could not give" in asked.content and "not made by an MCP client" in asked.content
    started = time.monotonic()
    [hung] = loop.run_turn([ToolCall("c4", "hang", {"seconds": 30})])
    assert hung.error_kind is ErrorKind.TIMEOUT and time.monotonic() - started < 8.0 + slack(1.0)
    again = _answered(loop, "c5", "lookup", {"key": "still"})
    assert again.ok, again


def _answered(loop: Loop, call_id: str, name: str, arguments: dict[str, Any]) -> ToolResult:
    """``name``'s result, the call made again (a new id) while it met the source's 8 s
    deadline: on a loaded machine the upstream's own process may not answer a quick call
    within it, an outcome of its start, not of rho (bounded by :data:`WAIT_S`)."""
    until = time.monotonic() + WAIT_S
    for attempt in itertools.count():
        [result] = loop.run_turn([ToolCall(f"{call_id}.{attempt}", name, arguments)])
        if result.error_kind is not ErrorKind.TIMEOUT or time.monotonic() > until:
            return result
    raise AssertionError("unreachable")


def test_a_modern_only_server_over_stdio_is_a_source(system: ActorSystem, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    source = MCPServer(command=[sys.executable, MODERN, "--marks", str(marks)], name="modern", timeout_ms=8000,
                       connect_timeout_s=WAIT_S)
    _check_the_source(system, source, marks)
    assert wait_for((tmp_path / "marks.cancelled").exists)  # the deadline cancelled the upstream's call


def test_a_modern_only_server_over_http_is_a_source(system: ActorSystem, tmp_path: Path, modern_http: str) -> None:
    source = MCPServer(url=modern_http, name="modern", timeout_ms=8000, connect_timeout_s=WAIT_S)
    _check_the_source(system, source, tmp_path / "marks")


def test_a_handshake_era_server_keeps_its_handshake(system: ActorSystem) -> None:
    """A server that does not answer ``server/discover`` (rho's stdlib-only hostile
    fixture answers it with nothing usable) is opened with ``initialize``."""
    source = MCPServer(command=[sys.executable, HOSTILE, "plain"], name="old", connect_timeout_s=WAIT_S)
    system.add_source(source, poll_s=None)
    assert source.connected, source.last_error
    assert source.protocol_version is not None and source.protocol_version < "2026"
    [ok] = system.start_loop("o").run_turn([ToolCall("c1", "echo", {"text": "hi"})])
    assert ok.ok and ok.content == "echo: hi"


def test_a_listings_cache_hint_is_honoured(system: ActorSystem, tmp_path: Path) -> None:
    """A listing with ``ttlMs`` is listed again when it runs out (and only then: no
    list_changed comes); one without a hint is not listed again."""
    hinted, plain = tmp_path / "hinted", tmp_path / "plain"
    for marks, extra in ((hinted, ["--ttl-ms", "1000"]), (plain, [])):
        source = MCPServer(command=[sys.executable, MODERN, "--marks", str(marks), *extra], name=marks.name,
                           connect_timeout_s=WAIT_S, ping_interval_s=3600)
        system.add_source(source, poll_s=None)
        assert source.connected, source.last_error
    assert wait_for(lambda: hinted.read_text().count("listed") >= 3)
    assert plain.read_text().count("listed") == 1


def _gateway(tmp_path: Path, upstream: list[str]) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--mcp", " ".join(upstream), "--data-dir", str(tmp_path)])


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_the_gateway_relays_a_modern_upstreams_questions_to_its_client(tmp_path: Path, mode: str) -> None:
    """Behind the gateway, the upstream's ``input_required`` question reaches the
    gateway's own client (a server-initiated request for a handshake-era client, an
    ``input_required`` result of the gateway's for a 2026-07-28 one); the answer goes
    back up, and the upstream's annotations reach the client."""
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def main() -> tuple[Any, Any]:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(_gateway(tmp_path, [sys.executable, MODERN]), mode=mode,
                              elicitation_callback=on_elicit) as client:
                listed = await client.list_tools()
                return listed, await client.call_tool("ask_name", {})

    listed, result = anyio.run(main)
    [lookup] = [t for t in listed.tools if t.name == "lookup"]
    assert lookup.title == "Look it up" and lookup.annotations is not None
    assert lookup.annotations.read_only_hint is True and lookup.annotations.open_world_hint is False
    assert not result.is_error, result
    assert result.content[0].text == "hello Ada"
    assert asked and asked[0] == "What is your name?"


def test_the_gateway_maps_a_modern_upstreams_errors(tmp_path: Path) -> None:
    async def main() -> Any:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(_gateway(tmp_path, [sys.executable, MODERN])) as client:
                return await client.call_tool("broken", {})

    result = anyio.run(main)
    assert result.is_error and "Error executing tool broken" in result.content[0].text


def test_a_legacy_upstream_still_works_behind_the_gateway(tmp_path: Path) -> None:
    async def main() -> Any:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(_gateway(tmp_path, [sys.executable, HOSTILE, "plain"])) as client:
                return await client.call_tool("echo", {"text": "old"})

    result = anyio.run(main)
    assert not result.is_error and result.content[0].text == "echo: old"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_the_gateway_relays_a_handshake_upstreams_own_question(tmp_path: Path, mode: str) -> None:
    """A handshake-era upstream's ``elicitation/create`` (a request of its own, during
    the one call in flight on its connection) reaches the client of that call, of
    either era, and its answer goes back up."""
    config = tmp_path / "gateway.toml"
    config.write_text(f"[servers.old]\ncommand = {json.dumps([sys.executable, LEGACY])}\nmode = \"legacy\"\n"
                      f"connect_timeout_s = {WAIT_S}\n")
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"color": "teal"})

    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--config", str(config), "--data-dir", str(tmp_path / "data")])

    async def main() -> Any:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(params, mode=mode, elicitation_callback=on_elicit) as client:
                return await client.call_tool("ask_color", {})

    result = anyio.run(main)
    assert not result.is_error, result
    assert result.content[0].text == "accept: teal"
    assert asked and asked[0] == "Which colour?"


def test_a_handshake_upstreams_question_without_a_client_is_refused(system: ActorSystem) -> None:
    source = MCPServer(command=[sys.executable, LEGACY], name="old", mode="legacy", connect_timeout_s=WAIT_S)
    system.add_source(source, poll_s=None)
    assert source.protocol_version == "2025-11-25"
    [result] = system.start_loop("q").run_turn([ToolCall("c1", "ask_color", {})])
    assert not result.ok and "no call in flight on this connection has an MCP client" in result.content, result


TASKS = str(FIXTURES / "task_upstream.py")


def test_an_upstreams_task_is_followed_to_its_result(system: ActorSystem, tmp_path: Path) -> None:
    """A server with the tasks extension (SEP-2663) makes a call a task: the call follows
    it (tasks/get) to its result; a tool error in a task is the tool's error."""
    source = MCPServer(command=[sys.executable, TASKS, str(tmp_path)], name="tasks", timeout_ms=20_000,
                       connect_timeout_s=WAIT_S)
    system.add_source(source, poll_s=None)
    assert source.connected, source.last_error
    loop = system.start_loop("t")
    [done] = loop.run_turn([ToolCall("c1", "slow_compute", {"seconds": 0.3})])
    assert done.ok and done.content == "computed after 0.3 s", done
    assert (tmp_path / "task-1").read_text() == "slow_compute"  # it ran as a task
    [failed] = loop.run_turn([ToolCall("c2", "failing_job", {})])
    assert failed.error_kind is ErrorKind.TOOL_ERROR and "failing_job" in failed.content, failed
    [plain] = loop.run_turn([ToolCall("c3", "greet", {"name": "Ada"})])
    assert plain.ok and plain.content == "Hello, Ada!"
    assert not (tmp_path / "task-3").exists()


def _followed_to_its_deadline(system: ActorSystem, tmp_path: Path, name: str) -> Path:
    """A call of ``name`` (60 s of work) on a tasks upstream of its own, ending at its
    deadline (``timeout``, on time) once its task is followed; the upstream's marks
    folder. On a loaded machine a deadline of 1.5 s may come before the task's id
    reached rho (no ``tasks/get`` yet: nothing to cancel): then a fresh upstream and a
    longer deadline, until a ``tasks/get`` came before it."""
    for attempt, timeout_ms in enumerate((1_500, 6_000, 24_000)):
        marks = tmp_path / f"attempt-{attempt}"
        marks.mkdir()
        source = MCPServer(command=[sys.executable, TASKS, str(marks)], name="tasks", timeout_ms=timeout_ms,
                           connect_timeout_s=WAIT_S)
        handle = system.add_source(source, poll_s=None)
        assert source.connected, source.last_error
        started = time.monotonic()
        [hung] = system.start_loop(f"t{attempt}").run_turn([ToolCall("c1", name, {"seconds": 60})])
        assert hung.error_kind is ErrorKind.TIMEOUT, hung
        assert time.monotonic() - started < timeout_ms / 1000 + slack(1.0)
        if (marks / "polled-task-1").exists():
            return marks
        handle.close()
    raise AssertionError("the upstream's task was never followed before the call's deadline")


def test_rhos_deadline_bounds_an_upstreams_task_as_a_whole(system: ActorSystem, tmp_path: Path) -> None:
    """Each tasks/get is answered at once; the call's one deadline still ends the task:
    the result is timeout on time, and the server's task is cancelled (tasks/cancel)."""
    marks = _followed_to_its_deadline(system, tmp_path, "slow_compute")
    assert wait_for((marks / "cancelled").exists)
    assert (marks / "cancelled").read_text() == "task-1"


def test_a_deadline_during_a_poll_still_cancels_the_upstreams_task(system: ActorSystem, tmp_path: Path) -> None:
    """The deadline passing while a ``tasks/get`` is unanswered (a slow server, a loaded
    machine) ends the call and sends ``tasks/cancel`` all the same."""
    marks = _followed_to_its_deadline(system, tmp_path, "slow_polls")  # each tasks/get answered after 5 s
    assert wait_for((marks / "cancelled").exists)
    assert (marks / "cancelled").read_text() == "task-1"
