"""What an upstream MCP server sends beside its results reaches the gateway's clients:
its log messages, relayed to the client whose call is in flight, in either era."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import WAIT_S

FIXTURES = Path(__file__).parent / "mcp_fixtures"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_the_gateway_relays_an_upstreams_log_messages_to_the_calling_client(tmp_path: Path, mode: str) -> None:
    upstream = f"{sys.executable} {FIXTURES / 'annotated_upstream.py'}"
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--mcp", upstream, "--data-dir", str(tmp_path)])
    heard: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(params)

    async def main() -> Any:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(params, mode=mode, logging_callback=on_log, log_level="debug") as client:
                return await client.call_tool("chatty", {})

    result = anyio.run(main)
    assert not result.is_error and result.content[0].text == "done"
    assert [(h.level, h.data) for h in heard] == [("info", "starting"), ("warning", {"step": 2})]
    assert heard[0].logger is not None and heard[0].logger.endswith("/work")  # the server's name, then its logger
    assert heard[1].logger is not None and "/" not in heard[1].logger
