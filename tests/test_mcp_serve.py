"""rho serving MCP: the SDK's own client against ``rho-actors mcp serve`` (stdio, a
subprocess) and against :func:`rho_actors.mcp.aserve` over streamable HTTP (127.0.0.1)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from rho_actors import ActorSystem, tool
from rho_actors.mcp import HTTPGuard, aserve
from tests.conftest import WAIT_S, read_line
from tests.helpers import free_port
from tests.mcp_fixtures import served_tools

TOOLS = str(Path(served_tools.__file__))
TOKEN = "a-test-token-of-32-characters-xx"



@asynccontextmanager
async def stdio_session(tmp_path: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--data-dir", str(tmp_path)],
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        with anyio.fail_after(WAIT_S):
            await session.initialize()
        yield session


def _text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def test_stdio_list_call_and_every_error_kind(tmp_path: Path) -> None:
    async def main() -> None:
        async with stdio_session(tmp_path) as session:
            with anyio.fail_after(WAIT_S):
                listed = await session.list_tools()
                names = {t.name for t in listed.tools}
                assert {"add", "slow", "boom", "refuse", "secret", "picture", "wait_for_cancel"} <= names
                add = next(t for t in listed.tools if t.name == "add")
                assert add.input_schema["properties"]["a"]["type"] == "integer"

                ok = await session.call_tool("add", {"a": 1, "b": 2})
                assert not ok.is_error and _text(ok) == "3"

                bad = await session.call_tool("add", {"a": "one"})
                assert bad.is_error and '$.a: "one" is not of type "integer"' in _text(bad)
                unknown = await session.call_tool("nope", {})
                assert unknown.is_error and "unknown tool 'nope'" in _text(unknown)
                timeout = await session.call_tool("slow", {})
                assert timeout.is_error and "did not finish within its timeout of 300 ms" in _text(timeout)
                raised = await session.call_tool("boom", {})
                assert raised.is_error and "RuntimeError: boom went the tool" in _text(raised)
                refused = await session.call_tool("refuse", {})
                assert refused.is_error and _text(refused) == "refused on purpose"

                secret = await session.call_tool("secret", {})
                assert not secret.is_error and "host-only-secret" not in secret.model_dump_json()
                picture = await session.call_tool("picture", {})
                images = [b for b in picture.content if isinstance(b, types.ImageContent)]
                assert _text(picture) == "a picture"
                assert [base64.b64decode(i.data) for i in images] == [served_tools.PNG]
                assert images[0].mime_type == "image/png"

                # bad input from the client: a protocol error, and the server goes on
                with pytest.raises(MCPError) as err:
                    await session.send_request(types.CompleteRequest(params=types.CompleteRequestParams(
                        ref=types.PromptReference(type="ref/prompt", name="p"),
                        argument=types.CompletionArgument(name="a", value="b"))), types.CompleteResult)
                assert err.value.code == types.METHOD_NOT_FOUND
                prompts = await session.list_prompts()
                assert prompts.prompts == []  # it serves tools: no prompt, no resource
                huge = await _expect_error(session.call_tool("add", {"a": 1, "pad": "x" * 1_100_000}))
                assert huge.code == types.INVALID_PARAMS and "at most 1000000" in huge.error.message
                assert _text(await session.call_tool("add", {"a": 2})) == "2"

    anyio.run(main)


def test_stdio_progress_and_client_cancel(tmp_path: Path) -> None:
    async def main() -> None:
        async with stdio_session(tmp_path) as session:
            with anyio.fail_after(WAIT_S):
                # progress, then a client-side cancel: notifications/cancelled reaches the turn
                reports: list[tuple[float, float | None, str | None]] = []
                got_progress = anyio.Event()

                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    reports.append((progress, total, message))
                    got_progress.set()

                async with anyio.create_task_group() as tasks:
                    async def call() -> None:
                        await session.call_tool("wait_for_cancel", {}, progress_callback=on_progress)

                    tasks.start_soon(call)
                    await got_progress.wait()
                    tasks.cancel_scope.cancel()  # the SDK sends notifications/cancelled
                assert reports == [(1.0, 2.0, "half way")]
                assert _text(await session.call_tool("add", {"a": 5})) == "5"
                # the turn was cancelled: the tool saw ctx["cancel"] (not its 20 s deadline)
                marks = tmp_path / "sessions"
                while not list(marks.glob("*/cancelled")):
                    await anyio.sleep(0.02)

    anyio.run(main)


async def _expect_error(awaitable: Any) -> MCPError:
    try:
        await awaitable
    except MCPError as err:
        return err
    raise AssertionError("no protocol error")


@tool
def extra() -> str:
    """A tool unregistered during the test."""
    return "extra"


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


def _serve_http(system: ActorSystem, port: int) -> tuple[threading.Thread, list[asyncio.AbstractEventLoop]]:
    loops: list[asyncio.AbstractEventLoop] = []

    async def run() -> None:
        loops.append(asyncio.get_running_loop())
        await aserve(system, http=("127.0.0.1", port), guard=HTTPGuard(TOKEN))

    def target() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # how the test stops serving
            asyncio.run(run())

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, loops


async def _connect_http(url: str, bound: float = WAIT_S) -> None:
    with anyio.fail_after(bound):
        while True:
            try:
                with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])), 0.2):
                    return
            except OSError:
                await anyio.sleep(0.02)


def test_http_list_changed_and_a_100_call_burst(system: ActorSystem) -> None:
    system.register(add)
    system.register(extra)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    thread, loops = _serve_http(system, port)

    async def main() -> None:
        await _connect_http(url)
        changed = anyio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        client = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
        async with streamable_http_client(url, http_client=client) as (read, write), \
                ClientSession(read, write, message_handler=on_message) as session:
            with anyio.fail_after(WAIT_S):
                init = await session.initialize()
                assert init.capabilities.tools is not None and init.capabilities.tools.list_changed
                assert {t.name for t in (await session.list_tools()).tools} == {"add", "extra"}
                await anyio.to_thread.run_sync(system.unregister, "extra")
                await changed.wait()
                assert {t.name for t in (await session.list_tools()).tools} == {"add"}

                results: dict[int, types.CallToolResult] = {}

                async def one(i: int) -> None:
                    results[i] = await session.call_tool("add", {"a": i, "b": 1})

                async with anyio.create_task_group() as tasks:
                    for i in range(100):
                        tasks.start_soon(one, i)
                assert {i: _text(r) for i, r in results.items()} == {i: str(i + 1) for i in range(100)}
                assert not any(r.is_error for r in results.values())

    try:
        anyio.run(main)
    finally:
        if loops:  # stop serving: cancel the server's tasks
            loops[0].call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loops[0])])
        thread.join(WAIT_S)
    assert not thread.is_alive()
    sessions = list((system.data_dir / "sessions").iterdir())
    assert [p.name.startswith("mcp-") for p in sessions] == [True]
    # the session's transcript of calls: each call and its result, readable as a conversation
    from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript

    with Transcript(sessions[0] / TRANSCRIPT_NAME) as transcript:
        messages = transcript.history.messages
    calls = [m.tool_calls[0] for m in messages if m.role == "assistant"]
    answers = {m.tool_call_id: m.text for m in messages if m.role == "tool"}
    assert len(calls) == 100 and all(c.name == "add" for c in calls)
    assert {answers[c.id] for c in calls} == {str(i + 1) for i in range(100)}


def test_rho_actors_mcp_serve_needs_tools(capsys: pytest.CaptureFixture[str]) -> None:
    from rho_actors.cli import main

    assert main(["mcp", "serve"]) == 2
    assert "--tools" in capsys.readouterr().err
    assert main(["mcp", "serve", "--tools", TOOLS, "--http", "nowhere"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err


def test_stdio_bad_lines_get_json_rpc_errors_and_the_server_goes_on(tmp_path: Path) -> None:
    """Lines that are no JSON-RPC message are answered at once (-32700 / -32600, id null),
    never left for the client to time out on; the next request is served."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--data-dir", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    deep = '{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines = ["this is not json", "{}", "[1, 2]", deep]
    try:
        for line in lines:
            proc.stdin.write(line.encode() + b"\n")
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}).encode() + b"\n")
        proc.stdin.flush()
        answers: list[dict[str, Any]] = []
        for _ in range(len(lines) + 1):  # (select on the pipe would miss answers already buffered)
            answers.append(json.loads(read_line(proc.stdout)))
        errors = [a for a in answers if "error" in a]
        assert [(e["id"], e["error"]["code"]) for e in errors] == [
            (None, -32700), (None, -32600), (None, -32600), (None, -32700)
        ], errors
        [ok] = [a for a in answers if a.get("id") == 1]
        assert ok["result"]["serverInfo"]["name"] == "rho-actors"
    finally:
        proc.kill()
        proc.wait(WAIT_S)


@tool
def served_echo(text: str) -> str:
    """Say ``text`` back."""
    return text


def test_a_call_cancelled_while_its_session_starts_leaves_nothing_bound(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2026-07-28 client that closes its request while the server starts the request's
    session (its transcript being opened, in a worker thread that a cancel waits for)
    leaves no call bound: its progress entry and its ``client_of`` binding are gone, as
    after any other end of the request (else each such request leaks both for good)."""
    import importlib
    from types import SimpleNamespace

    from rho_actors.agent.transcript import Transcript
    from rho_actors.mcp import client_requests
    from rho_actors.mcp.sessions import Session

    serve = importlib.import_module("rho_actors.mcp.serve")
    kept = importlib.import_module("rho_actors.mcp.served_sessions")

    scopes: list[anyio.CancelScope] = []

    class Cancelled(Transcript):  # the client's cancel arrives while the transcript opens
        def open(self, **kwargs: Any) -> Any:
            anyio.from_thread.run_sync(scopes[0].cancel)
            return super().open(**kwargs)

    monkeypatch.setattr(kept, "Transcript", Cancelled)

    ctx = SimpleNamespace(protocol_version="2026-07-28", request_id=7, request=None, params={}, session=None,
                          close_sse_stream=None)

    async def main(served: Any) -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await serve._call_tool(served, ctx, types.CallToolRequestParams(name="served_echo",
                                                                               arguments={"text": "hi"}))
        assert scope.cancelled_caught

    with ActorSystem(data_dir=tmp_path) as system:
        system.register(served_echo)
        served = kept.Served(system, (), 1 << 20)
        anyio.run(main, served)
        [session] = served.sessions
        assert isinstance(session, Session)
        sid = session.loop.session_id
        assert served.progress == {}
        assert [key for key in client_requests._live if key[0] == sid] == []
        assert session.calls == 0


def test_a_call_is_served_by_the_tool_set_it_started_with(tmp_path: Path) -> None:
    """``tools/call`` reads the tool set once: a tool re-registered while its call runs
    (a new version whose outputSchema the running version's result does not match) does
    not mix the two versions in one call: the result is checked against the schema of
    the version that ran it (before, the schema was read again after the run: the new
    version's, and the client got an error result for a result its tool declared)."""
    import importlib
    from types import SimpleNamespace

    serve = importlib.import_module("rho_actors.mcp.serve")
    kept = importlib.import_module("rho_actors.mcp.served_sessions")

    def weather(unit: str, system: ActorSystem | None = None) -> type:
        class Weather:
            @staticmethod
            def name() -> str:
                return "weather"

            @staticmethod
            def description() -> str:
                return f"The weather in {unit}."

            @staticmethod
            def parameter_schema() -> dict[str, Any]:
                return {"type": "object", "properties": {}}

            @staticmethod
            def output_schema() -> dict[str, Any]:
                return {"type": "object", "properties": {unit: {"type": "number"}}, "required": [unit]}

            @staticmethod
            def run(args: dict[str, Any], ctx: Any) -> Any:
                if system is not None:  # the next version is registered while this call runs
                    system.unregister("weather")
                    system.register(weather("kelvin"))
                return {unit: 21.5}
        return Weather

    ctx = SimpleNamespace(protocol_version="2026-07-28", request_id=7, request=None, params={}, session=None,
                          close_sse_stream=None)
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(weather("celsius", system))
        served = kept.Served(system, (), 1 << 20)

        async def main() -> Any:
            with anyio.fail_after(WAIT_S):
                return await serve._call_tool(served, ctx, types.CallToolRequestParams(name="weather", arguments={}))

        result = anyio.run(main)
        assert not result.is_error, _text(result)
        assert result.structured_content == {"celsius": 21.5}
        assert system.tool_set().entries["weather"].info.description == "The weather in kelvin."
