"""A tool's annotations (MCP's title and four hints) end to end: declared with
``@tool(annotations=...)`` or an ``annotations()`` callback and checked, listed by ``mcp
serve``, kept from an upstream MCP server by a source and passed on by the gateway."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from rho_actors import tool
from rho_actors.declarations.formats import declaration
from tests.conftest import WAIT_S


def test_annotations_are_checked_when_a_tool_is_declared() -> None:
    with pytest.raises(ValueError, match=r"@tool: annotations: unknown key\(s\) 'readonly'"):
        tool(annotations={"readonly": True})
    with pytest.raises(TypeError, match="destructiveHint must be a bool, not a str"):
        tool(annotations={"destructiveHint": "yes"})
    with pytest.raises(ValueError, match="title is 201 characters; at most 200"):
        tool(annotations={"title": "x" * 201})
    with pytest.raises(TypeError, match="annotations must be a mapping"):
        tool(annotations=["readOnlyHint"])  # type: ignore[call-overload]

    @tool(annotations={"title": "Add\x1b[31m up", "readOnlyHint": True, "idempotentHint": True})
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    served = declaration(add, "mcp")
    assert served is not None
    assert served["title"] == "Add[31m up"  # control characters removed, as from a description
    assert served["annotations"] == {"title": "Add[31m up", "readOnlyHint": True, "idempotentHint": True}
    assert declaration(add, "neutral")["annotations"]["readOnlyHint"] is True  # type: ignore[index]
    assert "annotations" not in declaration(add, "openai")["function"]  # type: ignore[index]


class _Odd:
    """A tool whose annotations() says something no MCP client understands."""

    @staticmethod
    def name() -> str:
        return "odd"

    @staticmethod
    def description() -> str:
        return "A tool with odd annotations."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {}}

    @staticmethod
    def annotations() -> Any:
        return {"readOnlyHint": "surely"}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return "odd"


def test_a_tool_whose_annotations_fail_the_checks_is_offered_without_them() -> None:
    served = declaration(_Odd, "mcp")
    assert served is not None and "annotations" not in served and "title" not in served


def test_mcp_serve_lists_its_tools_and_an_upstreams_annotations(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    fixtures = Path(__file__).parent / "mcp_fixtures"
    upstream = f"{sys.executable} {fixtures / 'annotated_upstream.py'}"
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--tools", str(fixtures / "era_tools.py"), "--mcp", upstream,
        "--data-dir", str(tmp_path)])

    async def main() -> dict[str, Any]:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(params) as client:
                return {t.name: t for t in (await client.list_tools()).tools}

    tools = anyio.run(main)
    note, lookup, wipe = tools["note"], tools["lookup"], tools["wipe"]
    assert note.title == "Take a note" and note.annotations is not None
    assert (note.annotations.read_only_hint, note.annotations.destructive_hint, note.annotations.open_world_hint) \
        == (False, False, False)
    assert tools["ask_name"].annotations is not None and tools["ask_name"].annotations.read_only_hint is True
    assert lookup.title == "Look it up" and lookup.annotations is not None  # the upstream's, passed on
    assert (lookup.annotations.read_only_hint, lookup.annotations.open_world_hint) == (True, False)
    assert wipe.title == "Wipe everything" and wipe.annotations is not None
    # its idempotentHint is not passed on: `--mcp` does not trust the upstream's hints, and what is served is
    # the tool's declared idempotence
    assert (wipe.annotations.destructive_hint, wipe.annotations.idempotent_hint) == (True, None)


def test_a_loops_offer_keeps_the_annotations(system: Any) -> None:
    @tool(annotations={"title": "Echo", "readOnlyHint": True})
    def echo(text: str) -> str:
        """Give the text back."""
        return text

    system.register(echo)
    loop = system.start_loop("annotated")
    assert [dict(info.annotations) for info in loop.offered()] == [{"title": "Echo", "readOnlyHint": True}]
    assert [dict(info.annotations) for info in loop.offered()] == [{"title": "Echo", "readOnlyHint": True}]  # cached


# --- idempotence: one fact (docs/design/tool-contract.md "Idempotence") ------------------------


class _Put:
    """A class tool declaring its idempotence as a bool attribute."""

    idempotent = True

    @staticmethod
    def name() -> str:
        return "put"

    @staticmethod
    def description() -> str:
        return "Store a value."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {}}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return "stored"


class _Hinted(_Put):
    """A class tool saying it only as MCP's hint (no idempotent())."""

    idempotent = None  # type: ignore[assignment]

    @staticmethod
    def annotations() -> dict[str, Any]:
        return {"idempotentHint": True}


class _Contradicted(_Put):
    """A class tool whose idempotent() and hint disagree: idempotent() is the fact."""

    idempotent = False

    @staticmethod
    def annotations() -> dict[str, Any]:
        return {"readOnlyHint": False, "idempotentHint": True}


def test_a_tools_declared_idempotence_is_the_idempotent_hint_it_is_served_with() -> None:
    from rho_actors.declarations.checks import check_declaration, read_declaration

    @tool(idempotent=True)
    def fetch(url: str) -> str:
        """Fetch a page."""
        return url

    @tool(annotations={"idempotentHint": True, "readOnlyHint": True})
    def peek(key: str) -> str:
        """Read a value."""
        return key

    @tool
    def append(line: str) -> str:
        """Append a line."""
        return line

    def served(t: Any) -> Any:
        found = declaration(t, "mcp")
        assert found is not None
        return found.get("annotations", {})

    def policy(t: Any) -> Any:
        return check_declaration(read_declaration(t)).policy

    assert served(fetch) == {"idempotentHint": True} and policy(fetch).idempotent
    assert served(peek) == {"readOnlyHint": True, "idempotentHint": True}  # the hint declares it...
    assert peek.idempotent() is True and policy(peek).retries is not None  # ...and its calls are retried
    assert served(append) == {} and not policy(append).idempotent
    assert served(_Put) == {"idempotentHint": True} and policy(_Put).idempotent
    assert served(_Hinted) == {"idempotentHint": True} and policy(_Hinted).idempotent
    assert served(_Contradicted) == {"readOnlyHint": False} and not policy(_Contradicted).idempotent
    with pytest.raises(ValueError, match="@tool: annotations say idempotentHint=False but idempotent=True; the tool's "
                                         "idempotence is one fact"):
        tool(idempotent=True, annotations={"idempotentHint": False})


def test_an_upstream_servers_idempotent_hint_is_taken_and_served_only_where_trusted() -> None:
    pytest.importorskip("mcp")
    from rho_actors.declarations.checks import check_declaration, read_declaration
    from rho_actors.mcp import MCPServer
    from rho_actors.mcp.source import MCPTool

    said = {"name": "wipe", "description": "Wipe it.", "inputSchema": {"type": "object"},
            "annotations": {"destructiveHint": True, "idempotentHint": True}}
    trusted = check_declaration(read_declaration(MCPTool(MCPServer(command=["srv"], idempotent_hints=True), said)))
    wary = check_declaration(read_declaration(MCPTool(MCPServer(command=["srv"]), said)))
    assert trusted.policy.idempotent and dict(trusted.annotations) == {"destructiveHint": True,
                                                                       "idempotentHint": True}
    assert not wary.policy.idempotent and dict(wary.annotations) == {"destructiveHint": True}  # not vouched for
