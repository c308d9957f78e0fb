"""What an upstream MCP server sends beside its results reaches the gateway's clients:
its log messages, relayed to the client whose call is in flight, in either era."""

from __future__ import annotations

import asyncio
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
                result = await client.call_tool("chatty", {})
                while len(heard) < 2:  # the SDK's client hands each notification to a task of its own
                    await anyio.sleep(0.01)
                return result

    result = anyio.run(main)
    assert not result.is_error and result.content[0].text == "done"
    assert [(h.level, h.data) for h in heard] == [("info", "starting"), ("warning", {"step": 2})]
    assert heard[0].logger is not None and heard[0].logger.endswith("/work")  # the server's name, then its logger
    assert heard[1].logger is not None and "/" not in heard[1].logger


def test_a_log_message_is_relayed_before_a_response_read_after_it_can_end_its_call() -> None:
    """The SDK's session hands a notification to a task of its own, which the response
    read after it can overtake: the call would end, and its log go to the host's log.
    The connection's relay takes log messages off the wire in the order read."""
    from mcp.shared.message import SessionMessage

    from rho_actors.mcp.connection import _relay

    log = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/message",
                                     params={"level": "info", "data": "starting"})
    bad = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"level": "loud"})
    response = types.JSONRPCResponse(jsonrpc="2.0", id=1, result={})
    seen: list[str] = []

    async def main() -> None:
        read_send, read = anyio.create_memory_object_stream[Any](8)
        send, received = anyio.create_memory_object_stream[Any](0)
        for message in (log, bad, response):
            read_send.send_nowait(SessionMessage(message))
        read_send.close()
        ended, wake = asyncio.Event(), asyncio.Event()
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_relay, read, send, ended, wake,
                                 lambda params: seen.append(f"log {params.data}"), "up")
                async with received:
                    async for item in received:
                        seen.append(type(item.message).__name__)
        assert ended.is_set()

    anyio.run(main)
    assert seen == ["log starting", "JSONRPCResponse"]  # the malformed one: a warning in the host's log


def test_a_call_listens_for_its_servers_log_messages_before_its_request_is_sent() -> None:
    """A server may log before the request's send has returned: the served call's client
    is listening from before the send until its upstream call ends, then no longer."""
    import threading

    from rho_actors.mcp.relay import listen, relay_log

    class Client:
        def __init__(self) -> None:
            self.heard: list[Any] = []

        def log(self, level: str, data: Any, logger: str | None = None, *, wait: bool = True) -> bool:
            self.heard.append((level, data, logger))
            return True

    lock, listeners, client = threading.Lock(), {}, Client()  # type: ignore[var-annotated]
    heard = listen(lock, listeners, client)
    relay_log(lock, listeners, "up", types.LoggingMessageNotificationParams(level="info", data="at once"))
    heard(None)  # the call's done callback
    relay_log(lock, listeners, "up", types.LoggingMessageNotificationParams(level="info", data="after it"))
    assert client.heard == [("info", "at once", "up")] and listeners == {}
    assert listen(lock, listeners, None)() is None and listeners == {}  # no client: nothing to relay to
