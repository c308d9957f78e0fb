"""Approvals of calls served over MCP (DESIGN §4 "Approvals", §6b): a real ``rho-actors
mcp serve`` process (stdio, and streamable HTTP on loopback) holds a session whose call
requires approval, and a real ``rho-actors approve``/``reject`` process decides it while
the server runs: the session's transcript is locked only for each record, so the decision
is written at once; the server acts on it within a second, runs the call exactly once with
the arguments the approval is bound to, and answers the client's ``tools/call`` with its
result (or the rejection)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from tests import approval_tools
from tests.conftest import WAIT_S, wait_for
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
TOOLS = str(Path(approval_tools.__file__))


def _env(runs: Path) -> dict[str, str]:
    return {**os.environ, "RHO_TEST_RUNS": str(runs),
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}



@contextlib.contextmanager
def _http_server(data: Path, env: dict[str, str], said: Path) -> Iterator[str]:
    """``rho-actors mcp serve --http`` of the approval tools, running: its URL."""
    port = free_port()
    with said.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--http", f"127.0.0.1:{port}",
             "--insecure-no-auth", "--data-dir", str(data)],
            stderr=stderr, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return server.poll() is not None

        assert wait_for(listening), said.read_text()
        assert server.poll() is None, said.read_text()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.wait(WAIT_S)


@contextlib.asynccontextmanager
async def _client(transport: str, data: Path, env: dict[str, str], said: Path) -> AsyncIterator[ClientSession]:
    if transport == "stdio":
        params = StdioServerParameters(command=sys.executable, env=env, cwd=str(ROOT), args=[
            "-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--data-dir", str(data)])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            with anyio.fail_after(WAIT_S):
                await session.initialize()
            yield session
        return
    with _http_server(data, env, said) as url:
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
            with anyio.fail_after(WAIT_S):
                await session.initialize()
            yield session


def _waiting(data: Path) -> list[tuple[str, str, str]]:
    """The calls the sessions' transcripts under ``data`` record as waiting for a decision:
    (session, call id, tool)."""
    found = []
    for path in data.glob(f"sessions/*/{TRANSCRIPT_NAME}"):
        history = load(path)
        found += [(path.parent.name, call_id, track.name) for call_id, track in history.open_calls.items()
                  if track.state == "pending"]
    return found


def _cli(data: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    verb, rest = args[0], args[1:]
    return subprocess.run([sys.executable, "-m", "rho_actors.cli", verb, str(data), *rest], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=WAIT_S * 3, check=False)


def _text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_call_served_over_mcp_is_decided_by_rho_actors_approve_while_the_server_runs(
    tmp_path: Path, transport: str,
) -> None:
    runs = tmp_path / "runs.log"
    runs.touch()
    env, data = _env(runs), tmp_path / "data"
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with _client(transport, data, env, tmp_path / "server.stderr") as client:
            answers: dict[str, types.CallToolResult] = {}
            when: dict[str, float] = {}

            async def call(path: str) -> None:
                answers[path] = await client.call_tool("delete", {"path": path})
                when[path] = time.time()

            with anyio.fail_after(WAIT_S * 3):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(call, "/a")
                    tasks.start_soon(call, "/b")
                    assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: len(_waiting(data)) == 2))
                    assert answers == {}  # both wait for a person: neither ran, neither was answered
                    by_path = {}
                    for session, call_id, _tool in _waiting(data):
                        history = load(data / "sessions" / session / TRANSCRIPT_NAME)
                        [args] = [c.arguments for m in history.messages for c in m.tool_calls if c.id == call_id]
                        by_path[(json.loads(args) if isinstance(args, str) else args)["path"]] = (session, call_id)
                    session, approved = by_path["/a"]
                    decided = await anyio.to_thread.run_sync(_cli, data, env, "approve", session, approved, "--by",
                                                             "ann")
                    assert decided.returncode == 0, decided.stdout + decided.stderr
                    assert f'{approved} of session {session} approved by ann: delete {{"path": "/a"}}' in decided.stdout
                    rejected = await anyio.to_thread.run_sync(_cli, data, env, "reject", session, by_path["/b"][1],
                                                              "--message", "keep /b", "--by", "bob")
                    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
            track = load(data / "sessions" / session / TRANSCRIPT_NAME).calls[approved]
            seen["answered_after_s"] = when["/a"] - track.states["decided"]["at"]
            seen["a"] = (answers["/a"].is_error, _text(answers["/a"]))
            seen["b"] = (answers["/b"].is_error, _text(answers["/b"]))
            again = await anyio.to_thread.run_sync(_cli, data, env, "approve", session, approved)
            seen["again"] = (again.returncode, "decided already: it was approved by ann at 20" in again.stdout)
            seen["tracks"] = {c: load(data / "sessions" / session / TRANSCRIPT_NAME).calls[c].states.get(
                "decided", {}).get("decision") for c in (approved, by_path["/b"][1])}

    anyio.run(main)
    assert seen["a"] == (False, "deleted /a")
    assert seen["b"] == (True, "keep /b")
    assert seen["again"] == (1, True)
    assert runs.read_text().splitlines() == ["delete /a"]  # run once, with the arguments approved; /b never
    assert sorted(seen["tracks"].values()) == ["approved", "rejected"]
    print(f"{transport}: the approved call's result reached the client {seen['answered_after_s']:.3f} s after "
          "rho-actors approve wrote its decision")
