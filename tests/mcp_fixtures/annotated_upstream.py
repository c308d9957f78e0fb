"""An MCP server built with the SDK's MCPServer whose tools carry annotations (a title
and hints), for ``tests/test_tool_annotations.py``. Run as a script (stdio)."""

import mcp_types as types
from mcp.server.mcpserver import MCPServer

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


if __name__ == "__main__":
    server.run("stdio")
