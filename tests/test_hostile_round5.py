"""Hostile tests of round 5: audio and embedded-resource results, call threads, lazy
session supervisors, the name wait of system actors, the process call backstop."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import anyio
import pytest

from rho_actors import ActorSystem, CallEvent, Loop, Resource, ToolCall, ToolResult, tool
from rho_actors.sandbox import wire
from tests.conftest import WAIT_S

# --------------------------------------------------------------------------- Resource uris

BAD_URIS = ["test://\ud800", "test://a\udfffb", "test://\x9b31m", "test://\x85next", "test://\u202eexe.txt",
            "test://a\u200bb", "test://a\u2028b", "test://\ufeffa"]


@pytest.mark.parametrize("uri", BAD_URIS)
def test_a_resource_uri_with_a_lone_surrogate_or_an_unsafe_character_is_refused(uri: str) -> None:
    with pytest.raises(ValueError, match=r"Resource uri .* is not an absolute URI"):
        Resource(uri, "text/plain", text="t")


@pytest.mark.parametrize("uri", BAD_URIS[2:])  # msgpack cannot carry a lone surrogate at all
def test_the_plain_wire_refuses_a_resource_with_such_a_uri(uri: str) -> None:
    import msgpack
    raw = msgpack.packb({"ok": True, "content": "x", "error_kind": None, "details": None, "images": [],
                         "blocks": [["resource", uri, None, "t", None]]}, use_bin_type=True)
    with pytest.raises(wire.WireError, match=r"result\.blocks\[0\]: Resource uri"):
        wire.PlainCodec().decode(raw)


def test_an_upstreams_resource_with_such_a_uri_becomes_a_line_of_text() -> None:
    import mcp_types as types

    from rho_actors.mcp.content import rho_value

    result = types.CallToolResult(content=[
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="test://\u202eexe.txt", mime_type="text/plain", text="t")),
        types.TextContent(type="text", text="after")])
    value = rho_value(result)
    assert isinstance(value, str)
    assert value.startswith("[an embedded resource that cannot be kept ('test://\\u202eexe.txt'): Resource uri")
    assert value.endswith("\nafter") and "\u202e" not in value


TOOLS = '''
from rho_actors import Resource, tool

@tool
def surrogate_uri() -> Resource:
    """A resource whose uri holds a lone surrogate."""
    return Resource("test://\\ud800", "text/plain", text="t")

@tool
def fine() -> str:
    """Fine."""
    return "fine"
'''


def test_mcp_serve_survives_a_tool_returning_a_resource_whose_uri_cannot_be_sent(tmp_path: Path) -> None:
    """Before: the uri reached the stdio writer, whose JSON failed: the server process died."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    tools = tmp_path / "tools.py"
    tools.write_text(TOOLS)

    import mcp_types as types

    async def main() -> tuple[types.CallToolResult, types.CallToolResult]:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "rho_actors.cli", "mcp", "serve", "--tools", str(tools), "--data-dir", str(tmp_path / "d")])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            with anyio.fail_after(WAIT_S):
                await session.initialize()
                bad = await session.call_tool("surrogate_uri", {})
                good = await session.call_tool("fine", {})
        return bad, good

    bad, good = anyio.run(main)
    [bad_text], [good_text] = bad.content, good.content
    assert isinstance(bad_text, types.TextContent) and isinstance(good_text, types.TextContent)
    assert bad.is_error and "Resource uri 'test://\\\\ud800' is not an absolute URI" in bad_text.text
    assert not good.is_error and good_text.text == "fine"


# --------------------------------------------------------------------------- call threads and the host's callbacks

GATE = threading.Event()


def _echo_system(tmp_path: Path) -> tuple[ActorSystem, Loop, Loop]:
    @tool(timeout_ms=5000)
    def gated(x: str) -> str:
        """Echo ``x`` once the test opens the gate."""
        GATE.wait(WAIT_S)
        return x

    @tool(timeout_ms=3000)
    def echo(x: str) -> str:
        """Echo ``x``."""
        return x

    @tool(timeout_ms=3000, concurrency="exclusive")
    def one_at_a_time(x: str) -> str:
        """Echo ``x``, one call of a turn after another."""
        return x

    system = ActorSystem(data_dir=tmp_path)
    system.register(echo)
    system.register(one_at_a_time)
    system.register(gated)
    return system, system.start_loop("a"), system.start_loop("b")


def _inner(loop: Loop, call_id: str, got: list[tuple[bool, str]], done: threading.Event) -> None:
    [result] = loop.run_turn([ToolCall(call_id, "echo", '{"x": "inner"}')], timeout_s=WAIT_S)
    got.append((result.ok, result.content))
    done.set()


@pytest.mark.parametrize("tool_name", ["echo", "one_at_a_time"])
def test_a_turn_run_from_on_result_gets_its_calls_run(tmp_path: Path, tool_name: str) -> None:
    """Before: the inner call was held back for the callback's call thread, which waited
    for it: it timed out after 3 s without having run."""
    system, a, b = _echo_system(tmp_path)
    with system:
        got: list[tuple[bool, str]] = []
        done = threading.Event()
        calls = [ToolCall(f"c{i}", tool_name, '{"x": "outer"}') for i in range(2)]

        def on_result(index: int, _result: ToolResult) -> None:
            if index == 0:
                _inner(b, "in", got, done)

        future = a.submit_turn(calls, on_result=on_result)
        assert [r.content for r in future.result(timeout=WAIT_S)] == ["outer", "outer"]
        assert done.wait(WAIT_S)
    assert got == [(True, "inner")]


def test_a_turn_run_from_a_futures_done_callback_gets_its_calls_run(tmp_path: Path) -> None:
    system, a, b = _echo_system(tmp_path)
    with system:
        got: list[tuple[bool, str]] = []
        done = threading.Event()
        GATE.clear()
        future = a.submit_turn([ToolCall("c1", "gated", '{"x": "outer"}')])
        future.add_done_callback(lambda _f: _inner(b, "in", got, done))  # before the call ends: on its thread
        GATE.set()
        assert done.wait(WAIT_S)
    assert got == [(True, "inner")]


def test_a_turn_run_from_an_event_subscriber_gets_its_calls_run(tmp_path: Path) -> None:
    system, a, b = _echo_system(tmp_path)
    with system:
        got: list[tuple[bool, str]] = []
        done = threading.Event()

        def on_event(event: object) -> None:
            if (isinstance(event, CallEvent) and event.session_id == "a" and event.kind == "finished"
                    and not done.is_set()):
                _inner(b, "in", got, done)

        system.subscribe(on_event)
        a.run_turn([ToolCall("c1", "one_at_a_time", '{"x": "outer"}'),
                    ToolCall("c2", "one_at_a_time", '{"x": "outer"}')], timeout_s=WAIT_S)
        assert done.wait(WAIT_S)
    assert got == [(True, "inner")]
