"""An MCP server built with the SDK's MCPServer (FastMCP), for the tests of
rho_actors.mcp consuming servers. Usage: fixture_server.py MARKS_DIR [--http PORT]
(with FIXTURE_JSON=1 in its environment, its HTTP answers are JSON bodies, not SSE).

Tools: echo, fail (an isError result), hang (sleeps; writes MARKS_DIR/cancelled when
its call is cancelled), crash (the process exits mid-call), grow (adds the tool "grown"
and sends tools/list_changed), shout (writes to stderr), weather (structured content),
env (the server's environment), big (a text of N MiB), a tool named "bad name!" whose declaration fails rho's
checks.
"""

import json
import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

marks = Path(sys.argv[1])
server = MCPServer("fixture")


@server.tool()
def echo(text: str) -> str:
    """Give the text back."""
    return text


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep for the given seconds."""
    (marks / "hang-started").write_text("1")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        (marks / "cancelled").write_text("1")
        raise
    return "woke up"


@server.tool()
def big(mib: int) -> str:
    """A text of ``mib`` MiB."""
    return "x" * (mib * 2**20)


@server.tool()
def fail() -> str:
    """Fail as a tool does (the server answers with isError)."""
    raise ToolError("failed on purpose")


@server.tool()
def crash() -> str:
    """Exit the server process in the middle of the call."""
    (marks / "crashed").write_text(str(os.getpid()))
    os._exit(3)


def grown() -> str:
    """A tool added at run time."""
    return "grown"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool 'grown' and tell the client (a handshake-era client by a notification,
    a 2026-07-28 one on its subscriptions/listen stream)."""
    server.add_tool(grown)
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()
    return "grew"


@server.tool()
def shout(text: str) -> str:
    """Write the text to stderr, then give it back."""
    print(f"stderr says: {text}", file=sys.stderr, flush=True)
    return text


@server.tool()
def weather(city: str) -> dict[str, object]:
    """The weather of a city, as structured content."""
    return {"city": city, "celsius": 21}


@server.tool()
def env() -> str:
    """The server's environment as JSON."""
    return json.dumps(dict(os.environ))


def bad() -> str:
    """A tool whose name rho refuses."""
    return "never offered"


server.add_tool(bad, name="bad name!")

if __name__ == "__main__":
    (marks / "started").write_text(str(os.getpid()))
    if len(sys.argv) > 3 and sys.argv[2] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]),
                   json_response=os.environ.get("FIXTURE_JSON") == "1")
    else:
        server.run()
