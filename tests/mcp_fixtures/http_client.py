"""An MCP client over streamable HTTP (the SDK's), for the tests of ``mcp serve --http``.

Usage: http_client.py URL TOKEN SESSIONS [HOLD_S]. Opens SESSIONS sessions with the
bearer TOKEN, starts a ``wait_for_cancel`` call in each (holding at most HOLD_S seconds
when given), prints ``READY`` once every call has reported progress (it is running on
the server), then waits to be killed.
"""

import sys
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.conftest import WAIT_S

url, token, sessions = sys.argv[1], sys.argv[2], int(sys.argv[3])
hold = {"hold_s": float(sys.argv[4])} if len(sys.argv) > 4 else {}


async def one(running: list[int]) -> None:
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with streamable_http_client(url, http_client=client) as (read, write), ClientSession(read, write) as session:
        await session.initialize()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            running.append(1)

        arguments: dict[str, Any] = dict(hold)
        await session.call_tool("wait_for_cancel", arguments, progress_callback=on_progress)
        await anyio.sleep_forever()


async def main() -> None:
    running: list[int] = []
    async with anyio.create_task_group() as tasks:
        for _ in range(sessions):
            tasks.start_soon(one, running)
        with anyio.fail_after(WAIT_S):  # every session's call running, or this client fails
            while len(running) < sessions:
                await anyio.sleep(0.02)
        print("READY", flush=True)


anyio.run(main)
