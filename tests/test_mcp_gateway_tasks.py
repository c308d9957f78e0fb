"""A gateway client's task on an upstream's task (SEP-2663): the official SDK's client
declares the tasks extension to ``mcp serve`` serving a real SDK server that makes tasks
(``tests/mcp_fixtures/task_upstream.py``); the gateway's task follows the upstream's own:
its status, its result, its cancel (which cancels the upstream task) and its questions
(the upstream's ``input_required`` asked of the gateway's client, the answer sent back
with the upstream's ``tasks/update``)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from rho_actors import ActorSystem
from rho_actors.mcp.gateway import specs_from_flags
from tests.conftest import WAIT_S, wait_for
from tests.helpers import served_gateway
from tests.test_mcp_protocol_eras import _elicited, _http_client
from tests.test_mcp_tasks import Tasks, _create, _ended, _request

UPSTREAM = Path(__file__).parent / "mcp_fixtures" / "task_upstream.py"


def test_a_gateway_clients_task_follows_the_upstreams_task(system: ActorSystem, tmp_path: Path) -> None:
    with served_gateway(system, specs_from_flags([shlex.join([sys.executable, str(UPSTREAM), str(tmp_path)])]),
                        tasks=True) as url:
        async def main() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                session = client.session
                quick, _ = await _create(client, "slow_compute", {"seconds": 0.2})
                done = await _ended(session, quick)
                seen["done"] = (done["status"], done["result"]["content"][0]["text"])
                slow, _ = await _create(client, "slow_compute", {"seconds": 60})
                # the gateway follows the upstream's task (a cancel before its CreateTaskResult came
                # back would abandon the tools/call, and the task with it: DESIGN mcp)
                assert wait_for((tmp_path / "polled-task-2").exists)
                seen["working"] = (await _request(session, "tasks/get", taskId=slow))["status"]
                await _request(session, "tasks/cancel", taskId=slow)
                seen["cancelled"] = (await _ended(session, slow))["status"]
                with anyio.fail_after(WAIT_S):  # the upstream's task cancelled too
                    while not (tmp_path / "cancelled").exists():
                        await anyio.sleep(0.05)
                seen["upstream_cancelled"] = (tmp_path / "cancelled").read_text()
                asking, _ = await _create(client, "ask_who", {})
                with anyio.fail_after(WAIT_S):
                    while (waiting := await _request(session, "tasks/get", taskId=asking))["status"] == "working":
                        await anyio.sleep(0.05)
                seen["asked"] = (waiting["status"], {k: r["method"] for k, r in waiting["inputRequests"].items()},
                                 waiting["inputRequests"]["name"]["params"]["message"])
                await _request(session, "tasks/update", taskId=asking,
                               inputResponses={"name": {"action": "accept", "content": {"name": "Ada"}}})
                answered = await _ended(session, asking)
                seen["answered"] = (answered["status"], answered["result"]["content"][0]["text"])
                named, _ = await _create(client, "ask_who", {"key": "approval"})  # rho's own key, asked upstream
                with anyio.fail_after(WAIT_S):
                    while (await _request(session, "tasks/get", taskId=named))["status"] == "working":
                        await anyio.sleep(0.05)
                await _request(session, "tasks/update", taskId=named,
                               inputResponses={"approval": {"action": "accept", "content": {"name": "Bo"}}})
                seen["approval_key"] = (await _ended(session, named))["result"]["content"][0]["text"]
                left, _ = await _create(client, "ask_who", {})  # cancelled while its question waits
                with anyio.fail_after(WAIT_S):
                    while (await _request(session, "tasks/get", taskId=left))["status"] == "working":
                        await anyio.sleep(0.05)
                await _request(session, "tasks/cancel", taskId=left)
                seen["left"] = (await _ended(session, left))["status"]
                with anyio.fail_after(WAIT_S):
                    while not (tmp_path / "cancelled").exists() or (tmp_path / "cancelled").read_text() != "task-5":
                        await anyio.sleep(0.05)
            return seen

        seen = anyio.run(main)
    assert seen == {"done": ("completed", "computed after 0.2 s"), "working": "working", "cancelled": "cancelled",
                    "upstream_cancelled": "task-2",
                    "asked": ("input_required", {"name": "elicitation/create"}, "Your name?"),
                    "answered": ("completed", "Hello, Ada!"), "approval_key": "Hello, Bo!", "left": "cancelled"}
    assert (tmp_path / "task-1").read_text() == "slow_compute"  # each call ran as the upstream's task
    assert not (tmp_path / "answered-task-5").exists()  # the question left unanswered, its task cancelled
    assert (tmp_path / "answered-task-3").read_text() == "{'action': 'accept', 'content': {'name': 'Ada'}}"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_an_upstream_tasks_question_reaches_a_client_that_calls_without_tasks(tmp_path: Path, mode: str) -> None:
    """A client that does not declare the extension gets the call's result; the upstream
    task's question on the way is asked of it (a server-initiated elicitation in the
    handshake era; at 2026-07-28 rho's own input_required, answered by the client's
    retry, which the SDK's client makes)."""
    upstream = shlex.join([sys.executable, str(UPSTREAM), str(tmp_path)])
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--mcp", upstream, "--data-dir", str(tmp_path / "data")],
        env={**os.environ})

    async def main() -> str:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(params, mode=mode, elicitation_callback=_elicited) as client:
                result = await client.call_tool("ask_who", {})
                assert not result.is_error, result
                return "".join(b.text for b in result.content if isinstance(b, types.TextContent))

    assert anyio.run(main) == "Hello, Ada!"
    answered = sorted(p.name for p in tmp_path.glob("answered-*"))
    assert answered, "the upstream's task was never answered"
