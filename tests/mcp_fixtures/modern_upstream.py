"""An MCP server that speaks protocol 2026-07-28 only, built with the official SDK: its
``MCPServer`` served by the SDK's own 2026-07-28 loops, so an ``initialize`` handshake
is refused (``tests/test_mcp_modern_upstream.py``). Run as a script: stdio, or
``--http PORT``; ``--ttl-ms N`` gives ``tools/list`` a cache hint of N ms, and each
listing is noted (a line) in the file of ``--marks PATH``.

Tools: ``lookup`` (annotated: a title and hints), ``ask_name`` (asks the client's user
for a name through an ``input_required`` result: the SDK's ``Resolve``/``Elicit``),
``broken`` (raises: an ``isError`` result), ``hang`` (sleeps ``seconds``; a cancelled
one writes the file of ``--marks`` + ``.cancelled``), ``flood`` (``count`` progress
notifications at once, then its answer).
"""

import sys
from pathlib import Path
from typing import Annotated, Any

import anyio
import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from pydantic import BaseModel

ARGS = sys.argv[1:]


def _option(name: str) -> str | None:
    return ARGS[ARGS.index(name) + 1] if name in ARGS else None


TTL_MS = _option("--ttl-ms")
MARKS = _option("--marks")


async def _note_listings(ctx: Any, call_next: Any) -> Any:
    """Note each ``tools/list`` (a line in the file of ``--marks``)."""
    if MARKS and ctx.method == "tools/list":
        with open(MARKS, "a") as marks:
            marks.write("listed\n")
    return await call_next(ctx)


server = MCPServer("modern-only", version="7", middleware=[_note_listings],
                   cache_hints={"tools/list": CacheHint(ttl_ms=int(TTL_MS))} if TTL_MS else None)


class Name(BaseModel):
    name: str


def _name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


@server.tool(title="Look it up", annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False))
def lookup(key: str) -> str:
    """Read a value."""
    return f"value of {key}"


@server.tool()
def ask_name(who: Annotated[Name, Resolve(_name)]) -> str:
    """Greet the client's user by the name they give."""
    return f"hello {who.name}"


@server.tool()
def broken() -> str:
    """Always fails."""
    raise ValueError("broken on purpose")


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep ``seconds``, then answer."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        if MARKS:
            Path(MARKS + ".cancelled").write_text("cancelled")
        raise
    return "woke"


@server.tool()
async def flood(count: int, ctx: Context) -> str:
    """Report ``count`` progress notifications at once, then answer."""
    for i in range(count):
        await ctx.report_progress(i, count)
    return "flooded"


async def _stdio() -> None:
    from mcp.server.runner import _serve_modern_stream  # the SDK's own 2026-07-28 loop: no handshake
    from mcp.server.stdio import stdio_server

    lowlevel = server._lowlevel_server
    async with stdio_server() as (read, write), lowlevel.lifespan(lowlevel) as state:
        await _serve_modern_stream(lowlevel, read, write, lifespan_state=state, raise_exceptions=False)


def _http(port: int) -> None:
    import uvicorn
    from mcp_types.version import LATEST_MODERN_VERSION, MODERN_PROTOCOL_VERSIONS

    app = server.streamable_http_app()

    async def modern_only(scope: Any, receive: Any, send: Any) -> None:
        """Every request to the SDK's 2026-07-28 entry: one without that version's header
        (an ``initialize``) is refused there, as a modern-only server refuses it."""
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"] if k != b"mcp-protocol-version"]
            said = dict(scope["headers"]).get(b"mcp-protocol-version", b"").decode()
            version = said if said in MODERN_PROTOCOL_VERSIONS else LATEST_MODERN_VERSION
            scope = {**scope, "headers": [*headers, (b"mcp-protocol-version", version.encode())]}
        await app(scope, receive, send)

    uvicorn.run(modern_only, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    if "--http" in ARGS:
        _http(int(ARGS[ARGS.index("--http") + 1]))
    else:
        anyio.run(_stdio)
