"""Tools served as MCP tasks (``tests/test_mcp_tasks.py``)."""

from typing import Any

from rho_actors import tool
from rho_actors.mcp import client_of


@tool(background=True, background_timeout_ms=60_000)
def crawl(seconds: float, ctx: Any) -> str:
    """Work for ``seconds`` (until cancelled), then say so."""
    if ctx["cancel"].wait(seconds):
        return "cancelled"
    return f"crawled for {seconds} s"


@tool(background=True, background_timeout_ms=60_000)
def confirm(path: str, ctx: Any) -> str:
    """Ask the user to confirm deleting ``path``, then answer what was decided."""
    client = client_of(ctx)
    if client is None:
        raise RuntimeError("this tool must be called over MCP")
    action, content = client.elicit(f"Delete {path}?", {
        "type": "object", "properties": {"sure": {"type": "boolean"}}, "required": ["sure"]}, key="sure")
    return f"{action}: sure={content.get('sure')}"


@tool(background="optional")
def report(topic: str) -> str:
    """Write a report on ``topic`` (a task when the client asks for one)."""
    return f"report on {topic}"


@tool(background=True)
def broken(ctx: Any) -> str:
    """Fail, as a tool does (a task completed with isError)."""
    raise ValueError("the report could not be written")


@tool(background=True, requires_approval=True)
def wipe(path: str) -> str:
    """Wipe ``path`` (a person approves each call first)."""
    return f"wiped {path}"
