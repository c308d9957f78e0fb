"""Upstream MCP servers built with the SDK's MCPServer (FastMCP), for the gateway's tests.
Usage: gateway_upstream.py MARKS_DIR alpha|beta [--http PORT].

alpha: echo, hang (writes MARKS_DIR/hang-started, then MARKS_DIR/cancelled when its call
is cancelled), stubborn (ignores cancellation), crash (the process exits mid-call), grow
(adds "grown" and sends tools/list_changed), pid, media (text, audio and an embedded
resource). At start it writes MARKS_DIR/alpha-started (its pid); when the FIFO
MARKS_DIR/gate exists it first waits until someone opens it for writing, then removes
it (so a restarted server stays down until the test lets it up).
beta: echo, read_file (a file's text), connect (a TCP connection to 127.0.0.1:PORT), whoami.
"""

import os
import socket
import sys
from pathlib import Path

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

marks = Path(sys.argv[1])
kind = sys.argv[2]
server = MCPServer(f"gateway-{kind}")


@server.tool()
def echo(text: str) -> str:
    """Give the text back, with the server's kind."""
    return f"{kind}: {text}"


if kind == "alpha":

    @server.tool()
    async def hang(seconds: float) -> str:
        """Sleep for the given seconds (its start and a cancellation are marked)."""
        (marks / "hang-started").write_text("1")
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            (marks / "cancelled").write_text("1")
            raise
        return "woke up"

    @server.tool()
    async def stubborn(seconds: float) -> str:
        """Sleep for the given seconds, whatever cancels it."""
        with anyio.CancelScope(shield=True):
            await anyio.sleep(seconds)
        return "finished"

    @server.tool()
    def crash() -> str:
        """Exit the server process in the middle of the call."""
        os._exit(3)

    def grown() -> str:
        """A tool added at run time."""
        return "grown"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool 'grown' and tell the client (a handshake-era client by a
        notification, a 2026-07-28 one on its subscriptions/listen stream)."""
        server.add_tool(grown)
        await ctx.session.send_tool_list_changed()
        await ctx.notify_tools_changed()
        return "grew"

    @server.tool()
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    @server.tool()
    def media() -> list[types.ContentBlock]:
        """Text, a sound and an embedded resource, in that order."""
        return [types.TextContent(type="text", text="listen"),
                types.AudioContent(type="audio", data="UklGRg==", mime_type="audio/wav"),
                types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                    uri="test://alpha", mime_type="text/plain", text="alpha's notes"))]

else:

    @server.tool()
    def read_file(path: str) -> str:
        """The text of a file."""
        try:
            return Path(path).read_text()
        except OSError as exc:
            raise ToolError(f"read_file: {exc}") from None

    @server.tool()
    def connect(port: int) -> str:
        """Open a TCP connection to 127.0.0.1:port."""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return "connected"
        except OSError as exc:
            raise ToolError(f"connect: {exc}") from None

    @server.tool()
    def whoami() -> str:
        """This server's uid and working folder."""
        return f"{os.getuid()} {os.getcwd()}"


if __name__ == "__main__":
    if kind == "alpha":
        gate = marks / "gate"
        (marks / "alpha-started").write_text(str(os.getpid()))
        if gate.exists():
            with open(gate, "rb"):
                pass
            gate.unlink()
    if len(sys.argv) > 4 and sys.argv[3] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[4]))
    else:
        server.run()
