"""Held calls of ``rho-actors mcp serve`` across ``kill -9`` of the server (DESIGN §4
"Approvals", "Background calls"; design mcp "Tasks"): real server processes on
loopback HTTP on one data folder, the SDK's client. Calls held for approval as MCP
tasks (``input_required``) and a ``tools/call`` held for approval are left pending by
the killed server; the next server on the folder takes them back: a client's
``tasks/get`` finds each task again, ``tasks/update`` or ``rho-actors approve/reject``
(while the server runs, or while none ran) ends each with exactly one result, the tool
run at most once, and a task whose call the transcript no longer holds ends
(``held_task_lost``), none left pending. Tasks running when the server was killed end
too: ``failed`` (interrupted), or run again once when their tool is idempotent.

Broke, fixed here: the restarted server knew none of them (``tasks/get``: "unknown
task"), and nothing took the killed server's sessions back: the calls and their tasks
stayed pending for good, and a decision recorded for them was never acted on."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from rho_actors.mcp.sessions import HELD_MARKER
from rho_actors.tasks import records
from tests import held_mcp_tools
from tests.conftest import WAIT_S, wait_for
from tests.helpers import free_port
from tests.test_approvals_served import _waiting
from tests.test_mcp_tasks import Tasks, _create, _ended, _request

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
TOOLS = str(Path(held_mcp_tools.__file__))
APPROVE = {"approval": {"action": "accept", "content": {"approve": True}}}


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(WAIT_S)


def _serve(data: Path, env: dict[str, str], said: Path, servers: list[subprocess.Popen[bytes]]) -> str:
    """A ``rho-actors mcp serve --http`` process on ``data``, listening: its URL."""
    port = free_port()
    with said.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--http", f"127.0.0.1:{port}",
             "--insecure-no-auth", "--data-dir", str(data)],
            stderr=stderr, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
            start_new_session=True)
    servers.append(server)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return server.poll() is not None

    assert wait_for(listening, WAIT_S * 3), said.read_text()
    assert server.poll() is None, said.read_text()
    return f"http://127.0.0.1:{port}/mcp"


@contextlib.asynccontextmanager
async def _client(url: str, mode: str) -> AsyncIterator[Client]:
    async with Client(streamable_http_client(url), mode=mode, extensions=[Tasks()]) as client:
        yield client


def _cli(data: Path, env: dict[str, str], *args: str) -> None:
    verb, rest = args[0], args[1:]
    done = subprocess.run([sys.executable, "-m", "rho_actors.cli", verb, str(data), *rest], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=WAIT_S * 3, check=False)
    assert done.returncode == 0, done.stderr


def _calls_of_tasks(data: Path) -> dict[str, tuple[str, str]]:
    """Each task recorded under ``data``: (its session, its call id)."""
    return {r["task_id"]: (folder.name, r["call_id"]) for folder in data.glob("sessions/*")
            for r in records.read_all(folder)}


def _answers(data: Path) -> dict[str, list[str]]:
    """Each call id of the transcripts under ``data``: the texts of its tool results (one
    of a call that has none yet reads as interrupted)."""
    found: dict[str, list[str]] = {}
    for path in data.glob(f"sessions/*/{TRANSCRIPT_NAME}"):
        for message in load(path).messages:
            if message.role == "tool" and message.tool_call_id is not None:
                found.setdefault(message.tool_call_id, []).append(message.text)
    return found


def test_calls_held_by_a_killed_server_are_taken_back_and_end_once(
        tmp_path: Path, servers: list[subprocess.Popen[bytes]]) -> None:
    runs, data = tmp_path / "runs.log", tmp_path / "data"
    runs.touch()
    hold_file = tmp_path / "hold"
    hold_file.touch()
    env = {**os.environ, "RHO_TEST_RUNS": str(runs), "RHO_TEST_HOLD": str(hold_file),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    url = _serve(data, env, tmp_path / "first.stderr", servers)
    paths = ("/mcp", "/cli", "/offline", "/lost")

    async def hold() -> dict[str, str]:
        with anyio.fail_after(WAIT_S * 3):
            async with _client(url, "2026-07-28") as client:  # each call without a handle: a session of its own
                tasks = {path: (await _create(client, "wipe_later", {"path": path}))[0] for path in paths}
                for name, path in (("crawl", "/c"), ("index", "/i")):  # running when the server is killed
                    tasks[path] = (await _create(client, name, {"path": path}))[0]
                started = {"crawl /c", "index /i"}
                assert await anyio.to_thread.run_sync(
                    lambda: wait_for(lambda: started <= set(runs.read_text().splitlines()), WAIT_S * 3))
            async with _client(url, "legacy") as legacy, anyio.create_task_group() as calls:
                calls.start_soon(legacy.call_tool, "wipe", {"path": "/plain"})  # waits for its decision
                assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: len(_waiting(data)) == 5))
                os.kill(servers[0].pid, signal.SIGKILL)  # while the call waits: no session of the server ends
                await anyio.to_thread.run_sync(servers[0].wait, WAIT_S)
                calls.cancel_scope.cancel()
        return tasks

    with contextlib.suppress(Exception):  # the client's end, its server gone, may raise: what it left is checked
        tasks: dict[str, str] = {}
        tasks.update(anyio.run(hold))
    assert set(tasks) == {*paths, "/c", "/i"}, "the calls were not held"
    assert servers[0].returncode == -signal.SIGKILL
    calls = _calls_of_tasks(data)
    [(plain_session, plain_call, _)] = [w for w in _waiting(data) if w[2] == "wipe"]
    assert sorted(w[1] for w in _waiting(data)) == sorted([plain_call] + [calls[tasks[p]][1] for p in paths])
    _cli(data, env, "approve", *calls[tasks["/offline"]])  # decided while no server ran
    (data / "sessions" / calls[tasks["/lost"]][0] / TRANSCRIPT_NAME).unlink()  # its call held no more
    hold_file.unlink()  # a task run again ends at once

    url = _serve(data, env, tmp_path / "second.stderr", servers)

    async def follow() -> dict[str, dict[str, Any]]:
        ended: dict[str, dict[str, Any]] = {}
        with anyio.fail_after(WAIT_S * 3):
            async with _client(url, "2026-07-28") as client:
                got = await _request(client.session, "tasks/get", taskId=tasks["/mcp"])
                assert (got["status"], list(got.get("inputRequests", ()))) == ("input_required", ["approval"]), got
                await _request(client.session, "tasks/update", taskId=tasks["/mcp"], inputResponses=APPROVE)
                await anyio.to_thread.run_sync(_cli, data, env, "reject", *calls[tasks["/cli"]], "--message",
                                               "keep /cli")
                await anyio.to_thread.run_sync(_cli, data, env, "approve", plain_session, plain_call)
                for path, task_id in tasks.items():
                    ended[path] = await _ended(client.session, task_id)
        return ended

    ended = anyio.run(follow)
    assert (ended["/mcp"]["status"], ended["/mcp"]["result"]["content"][0]["text"]) == ("completed", "wiped /mcp later")
    assert (ended["/offline"]["status"], ended["/offline"]["result"]["content"][0]["text"]) == (
        "completed", "wiped /offline later")
    rejected = ended["/cli"]
    assert rejected["status"] == "completed" and rejected["result"]["isError"], rejected
    assert "rejected" in rejected["result"]["content"][0]["text"], rejected
    lost = ended["/lost"]
    assert lost["status"] == "cancelled" and "holds it no more" in lost["statusMessage"], lost
    assert ended["/c"]["status"] == "failed" and "interrupted" in ended["/c"]["error"]["message"], ended["/c"]
    assert (ended["/i"]["status"], ended["/i"]["result"]["content"][0]["text"]) == ("completed", "indexed /i")
    plain_transcript = data / "sessions" / plain_session / TRANSCRIPT_NAME
    assert wait_for(lambda: load(plain_transcript).calls[plain_call].state == "settled"), "the call did not run"
    answers = _answers(data)
    assert answers[plain_call] == ["wiped /plain"]
    for path in ("/mcp", "/cli", "/offline"):
        assert len(answers[calls[tasks[path]][1]]) == 1, (path, answers)  # one result per call id
    assert _waiting(data) == []
    servers[1].send_signal(signal.SIGTERM)  # a server's stop ends the sessions it took back: none left marked
    assert servers[1].wait(WAIT_S) is not None
    assert list(data.glob(f"sessions/*/{HELD_MARKER}")) == []
    assert sorted(runs.read_text().splitlines()) == ["crawl /c", "index /i", "index /i", "wipe /plain",
                                                     "wipe_later /mcp", "wipe_later /offline"]
