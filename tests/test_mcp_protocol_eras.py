"""One ``mcp serve`` for both protocol eras: the official SDK's ``Client`` in its ``auto``,
``legacy`` and explicit-version (2026-07-28) modes, over stdio (``rho-actors mcp serve``,
a subprocess) and over HTTP on loopback: one rho session per client (its folder and
transcript kept across requests: a 2026-07-28 client names it by the handle each result
carries), a tool's questions to the user in either era, and a session that another
client holding the same token cannot use."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from rho_actors import ActorSystem
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript
from rho_actors.mcp import HTTPGuard, aserve
from rho_actors.mcp.sessions import SESSION_META_KEY
from tests.conftest import WAIT_S, wait_for
from tests.helpers import listening
from tests.mcp_fixtures import era_tools

TOOLS = str(Path(era_tools.__file__))
TOKEN = "a-test-token-of-32-characters-xx"
MODES = ("auto", "legacy", "2026-07-28")
NOBODY = 65534
SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")  # nobody may not run the venv's


def _text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


async def _elicited(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada"})


async def _two_notes(client: Client, modern_handles: bool) -> tuple[str, str, str | None]:
    """Two calls of ``note`` in one session: the second names the first's session when
    ``modern_handles``; returns both texts and the handle the first result carried."""
    first = await client.call_tool("note", {"text": "one"})
    handle = (first.meta or {}).get(SESSION_META_KEY)
    meta: Any = {SESSION_META_KEY: handle} if modern_handles else None
    second = await client.call_tool("note", {"text": "two"}, meta=meta)
    assert not first.is_error and not second.is_error, (_text(first), _text(second))
    return _text(first), _text(second), handle



@contextlib.contextmanager
def _served_http(system: ActorSystem) -> Iterator[tuple[str, HTTPGuard]]:
    system.register(era_tools.note)
    system.register(era_tools.ask_name)
    guard = HTTPGuard(TOKEN)
    ready = threading.Event()
    loops: list[Any] = []

    async def run(port: int) -> None:
        loops.append(asyncio.get_running_loop())
        ready.set()
        await aserve(system, http=("127.0.0.1", port), guard=guard)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])

    def target() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(run(port))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert ready.wait(WAIT_S)
    assert wait_for(lambda: listening(port))
    try:
        yield f"http://127.0.0.1:{port}/mcp", guard
    finally:
        loops[0].call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loops[0])])
        thread.join(WAIT_S)


@contextlib.asynccontextmanager
async def _http_client(url: str, mode: str, seen: list[str] | None = None, **options: Any) -> AsyncIterator[Client]:
    """The SDK's client of ``url``; ``seen`` gets each ``Mcp-Session-Id`` the server gives."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})

    async def remember(response: Any) -> None:
        if seen is not None and response.headers.get("mcp-session-id"):
            seen.append(response.headers["mcp-session-id"])

    http.event_hooks["response"].append(remember)
    transport = streamable_http_client(url, http_client=http)
    async with Client(transport, mode=mode, elicitation_callback=_elicited, **options) as client:
        yield client


def _transcript_calls(folder: Path) -> list[str]:
    with Transcript(folder / TRANSCRIPT_NAME) as transcript:
        messages = transcript.history.messages
    return [json.dumps(m.tool_calls[0].arguments) for m in messages if m.role == "assistant"]


@pytest.mark.parametrize("mode", MODES)
def test_http_a_client_of_either_era_keeps_one_session_and_is_asked_for_input(system: ActorSystem,
                                                                            mode: str) -> None:
    with _served_http(system) as (url, _guard):
        async def main() -> str:
            with anyio.fail_after(WAIT_S * 3):
                async with _http_client(url, mode) as client:
                    modern = client.protocol_version == "2026-07-28"
                    assert modern == (mode != "legacy")
                    listed = await client.list_tools()
                    assert {t.name for t in listed.tools} == {"note", "ask_name"}
                    if modern:  # a listing says how long it may be kept (SEP-2549)
                        assert listed.ttl_ms is not None and listed.cache_scope == "private"
                    first, second, handle = await _two_notes(client, modern_handles=modern)
                    assert (handle is not None) == modern
                    session_id = first.splitlines()[0]
                    assert second.splitlines() == [session_id, "one", "two"]  # one folder, both notes
                    assert session_id.startswith("mcp-") and (handle is None or handle not in session_id)
                    meta: Any = {SESSION_META_KEY: handle} if modern else None
                    asked = await client.call_tool("ask_name", {}, meta=meta)
                    assert _text(asked) == "accept: hello Ada", _text(asked)
                    return session_id

        session_id = anyio.run(main)
    folder = system.data_dir / "sessions" / session_id
    calls = _transcript_calls(folder)
    assert calls[:2] == ['{"text": "one"}', '{"text": "two"}'] and calls[-1] == "{}"


@pytest.mark.parametrize("mode", MODES)
def test_stdio_a_client_of_either_era_keeps_one_session_and_is_asked_for_input(tmp_path: Path, mode: str) -> None:
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--data-dir", str(tmp_path)],
        env={**os.environ})

    async def main() -> None:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(params, mode=mode, elicitation_callback=_elicited) as client:
                assert (client.protocol_version == "2026-07-28") == (mode != "legacy")
                first, second, _ = await _two_notes(client, modern_handles=False)  # the process is the client
                assert second.splitlines() == [first.splitlines()[0], "one", "two"]
                asked = await client.call_tool("ask_name", {})
                assert _text(asked) == "accept: hello Ada", _text(asked)

    anyio.run(main)


_INTRUDER = f"WAIT_S = {WAIT_S}  # tests/conftest.py's bound, in this child too\n" + """
import http.client, json, sys, urllib.parse
url, token, how, name, source_port, forwarded = sys.argv[1:7]
body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "note", "arguments": {"text": "intruder"}}}
headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json",
           "Accept": "application/json, text/event-stream"}
if how == "handle":
    headers.update({"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "note"})
    body["params"]["_meta"] = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                               "io.modelcontextprotocol/clientCapabilities": {}, "rho-actors/session": name}
else:
    headers["MCP-Protocol-Version"] = "2025-11-25"
    headers["Mcp-Session-Id"] = name
if forwarded:
    headers["X-Forwarded-For"] = forwarded
parts = urllib.parse.urlsplit(url)
connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WAIT_S,
                                        source_address=("127.0.0.1", int(source_port)))
connection.request("POST", parts.path, json.dumps(body), headers)
answer = connection.getresponse()
print(answer.status, answer.read().decode()[:2000])
"""


def _intrude(url: str, how: str, name: str, source_port: int = 0, forwarded: str = "") -> str:
    """A second client: the same token, from another uid (``nobody``), naming a session;
    its connection from 127.0.0.1:``source_port`` (0: any), with ``X-Forwarded-For:
    forwarded`` when given."""
    assert SYSTEM_PYTHON is not None
    run = subprocess.run([SYSTEM_PYTHON, "-c", _INTRUDER, url, TOKEN, how, name, str(source_port), forwarded],
                         user=NOBODY, cwd="/",
                         capture_output=True, text=True, timeout=WAIT_S * 2, check=False)
    assert run.returncode == 0, run.stderr
    return str(run.stdout)


def _refused(system: ActorSystem, guard: Any, mode: str, first: str, said: str, third: str) -> None:
    """The intruder (``said``: what it was answered) was refused, and the session's own
    client (``first``, ``third``: its notes) and folder saw nothing of it."""
    assert "intruder" not in third and third.splitlines()[1:] == ["one", "two", "three"]
    if mode == "legacy":
        assert said.startswith("404 ") and guard.stats()["refused_foreign"] == 1, said
    else:
        assert "unknown session handle" in said, said
    folder = system.data_dir / "sessions" / first.splitlines()[0]
    assert "intruder" not in (folder / "notes.txt").read_text()


@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM_PYTHON is None,
                    reason="a second client of another uid needs root to start, and a system python3")
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_http_another_client_with_the_same_token_cannot_name_a_session(system: ActorSystem, mode: str) -> None:
    async def intrude(url: str, how: str, name: str) -> str:
        return await anyio.to_thread.run_sync(_intrude, url, how, name)

    _intruded(system, mode, intrude)


def _intruded(system: ActorSystem, mode: str, intrude: Callable[[str, str, str], Awaitable[str]]) -> None:
    """A session's own client notes "one" and "two"; ``intrude(url, how, name)`` (``how``:
    ``"handle"`` or ``"header"``, ``name``: the session's) sends the intruder and returns
    what it was answered; the client then notes "three": checked by :func:`_refused`."""
    with _served_http(system) as (url, guard):
        async def main() -> tuple[str, str, str]:
            with anyio.fail_after(WAIT_S * 3):
                seen: list[str] = []
                async with _http_client(url, mode, seen) as client:
                    first, _, handle = await _two_notes(client, modern_handles=mode != "legacy")
                    name = handle if handle is not None else seen[0]
                    said = await intrude(url, "handle" if handle else "header", str(name))
                    meta: Any = {SESSION_META_KEY: handle} if handle else None
                    third = await client.call_tool("note", {"text": "three"}, meta=meta)
                    return first, said, _text(third)

        first, said, third = anyio.run(main)
        _refused(system, guard, mode, first, said, third)


def _kept_alive(url: str) -> socket.socket:
    """A connection of this process (its uid) to ``url``'s server that has made one
    authenticated request (a 2026-07-28 ``tools/list``, answered) and stays open. Its
    port is below the kernel's ephemeral range: once it is closed, no other process's
    connection is given that port before the intruder binds it (as on a busy machine)."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        low = int(f.read().split()[0])
    for port in random.sample(range(max(1024, low - 8000), low), 200):
        try:
            sock.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    sock.settimeout(WAIT_S)
    sock.connect((str(parts.hostname), int(parts.port or 80)))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    sock.sendall((f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {TOKEN}\r\n"
                  "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                  "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    answer = b""
    while b"note" not in answer:  # the listing names the tool: answered in full enough
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    return sock


@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM_PYTHON is None,
                    reason="a second client of another uid needs root to start, and a system python3")
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("attack", ["reused_port", "forwarded_for"])
def test_http_another_uid_cannot_take_a_connections_client(system: ActorSystem, mode: str, attack: str) -> None:
    """The client a connection is (its uid, asked of the kernel once per connection) is
    that connection's: a connection of another uid from the same address and port, once
    the first closed, is asked again; and an ``X-Forwarded-For`` naming a live connection
    of this uid renames no one."""
    async def intrude(url: str, how: str, name: str) -> str:
        ours = _kept_alive(url)
        port = int(ours.getsockname()[1])
        if attack == "reused_port":  # closed at once (RST, no TIME_WAIT): its port is free to reuse
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            ours.close()
            return await anyio.to_thread.run_sync(_intrude, url, how, name, port)
        with ours:
            return await anyio.to_thread.run_sync(functools.partial(_intrude, url, how, name,
                                                                    forwarded=f"127.0.0.1:{port}"))

    _intruded(system, mode, intrude)


def test_http_a_2026_client_hears_of_a_changed_tool_list_on_its_listen_stream(system: ActorSystem) -> None:
    with _served_http(system) as (url, _guard):
        async def main() -> set[str]:
            with anyio.fail_after(WAIT_S * 3):
                async with _http_client(url, "2026-07-28") as client:
                    assert (await client.list_tools()).tools
                    async with client.listen(tools_list_changed=True) as listening:
                        await anyio.to_thread.run_sync(system.unregister, "ask_name")
                        async for event in listening:
                            assert type(event).__name__ == "ToolsListChanged", event
                            break
                    return {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}

        assert anyio.run(main) == {"note"}
