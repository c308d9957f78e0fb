"""An MCP server built with the SDK's MCPServer whose tools carry annotations (a title
and hints), and one that logs (``chatty``), for ``tests/test_tool_annotations.py`` and
``tests/test_mcp_gateway_relay.py``. Run as a script: stdio, or ``--http PORT``."""

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("annotated")


@server.tool(title="Look it up", annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False))
def lookup(key: str) -> str:
    """Read a value."""
    return f"value of {key}"


@server.tool(annotations=types.ToolAnnotations(title="Wipe everything", destructive_hint=True,
                                               idempotent_hint=True))
def wipe() -> str:
    """Destroy everything (pretend)."""
    return "wiped"


@server.tool()
async def chatty(ctx: Context) -> str:
    """Log two messages, then answer."""
    await ctx.info("starting", logger_name="work")
    await ctx.warning({"step": 2})
    return "done"


class Color(BaseModel):
    color: str


@server.tool()
async def ask_color(ctx: Context) -> str:
    """Ask the client's user for a colour."""
    answer = await ctx.elicit("Which colour?", Color)
    return f"{answer.action}: {answer.data.color}" if answer.action == "accept" else answer.action


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--http":  # streamable HTTP on 127.0.0.1:PORT
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
