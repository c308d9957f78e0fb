"""The MCP route, no adapter at all: the frameworks' own MCP clients (the OpenAI Agents
SDK's ``MCPServerStdio``, pydantic-ai's ``MCPToolset``) consuming ``rho-actors mcp
serve`` over stdio, in a real agent run each."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")
pytest.importorskip("agents")
pytest.importorskip("pydantic_ai")

from agents import Agent, RunConfig, Runner
from agents.mcp import MCPServerStdio
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.function import FunctionModel

from tests.conftest import WAIT_S
from tests.mcp_fixtures import served_tools
from tests.test_integration_openai_agents import ScriptedModel
from tests.test_integration_pydantic_ai import Script

ARGS = ["-m", "rho_actors.cli", "mcp", "serve", "--tools", str(Path(served_tools.__file__))]
CALLS = [("c_add", "add", {"a": 2, "b": 3}), ("c_boom", "boom", {}), ("c_slow", "slow", {})]


def test_the_agents_sdk_mcp_client_runs_rho_served_tools(tmp_path: Path) -> None:
    async def run() -> tuple[ScriptedModel, str]:
        params = {"command": sys.executable, "args": [*ARGS, "--data-dir", str(tmp_path)]}
        async with MCPServerStdio(params=params, client_session_timeout_seconds=WAIT_S) as server:  # type: ignore[arg-type]
            model = ScriptedModel([CALLS, "served"])
            agent = Agent(name="a", model=model, mcp_servers=[server])
            result = await Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True))
            return model, str(result.final_output)

    model, final = asyncio.run(asyncio.wait_for(run(), 2 * WAIT_S))
    assert final == "served"
    assert {"add", "boom", "slow"} <= set(model.offered[0])
    assert "5" in model.outputs["c_add"]
    assert "boom went the tool" in model.outputs["c_boom"]
    assert "did not finish within its timeout of 300 ms" in model.outputs["c_slow"]


def test_pydantic_ais_mcp_toolset_runs_rho_served_tools(tmp_path: Path) -> None:
    transport = StdioTransport(command=sys.executable, args=[*ARGS, "--data-dir", str(tmp_path)])
    script = Script([CALLS, "served"])
    toolset = MCPToolset(transport, tool_error_behavior="failed", init_timeout=WAIT_S, read_timeout=WAIT_S)
    agent = PydanticAgent(FunctionModel(script), toolsets=[toolset])

    async def run() -> str:
        async with agent:
            return str((await agent.run("go")).output)

    assert asyncio.run(asyncio.wait_for(run(), 2 * WAIT_S)) == "served"
    assert {"add", "boom", "slow"} <= set(script.offered[0])
    assert script.outputs["c_add"] == "5"
    assert "boom went the tool" in script.outputs["c_boom"]
    assert "did not finish within its timeout of 300 ms" in script.outputs["c_slow"]
