"""Tools served to clients of both protocol eras (``tests/test_mcp_protocol_eras.py``)."""

from pathlib import Path
from typing import Any

from rho_actors import tool
from rho_actors.mcp import client_of


@tool(annotations={"title": "Take a note", "readOnlyHint": False, "destructiveHint": False,
                    "idempotentHint": False, "openWorldHint": False})
def note(text: str, ctx: Any) -> str:
    """Append ``text`` to the session's notes (a file in its folder); return the session
    id and every note so far, one a line."""
    notes = Path(ctx["data_dir"]) / "notes.txt"
    with notes.open("a") as out:
        out.write(text + "\n")
    return f"{ctx['session_id']}\n{notes.read_text()}"


@tool(annotations={"readOnlyHint": True})
def ask_name(ctx: Any) -> str:
    """Ask the client's user for a name, then greet them."""
    client = client_of(ctx)
    if client is None:
        raise RuntimeError("this tool must be called over MCP")
    action, content = client.elicit("What is your name?", {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})
    return f"{action}: hello {content.get('name')}"
