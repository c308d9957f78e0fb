"""A resource's uri in a tool result: one with a lone surrogate or an unsafe character
is refused where it is made, never sent on the plain wire, shown as a line of text when an
upstream sends one, and never ends ``mcp serve``."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from rho_actors import Resource
from rho_actors.sandbox import wire
from tests.conftest import WAIT_S

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
