"""MCP Tasks served to hostile clients (``rho_actors.mcp.tasks``): a client of another
principal naming a task by its id is answered as for an id the server does not know (no
existence oracle) and changes nothing; task ids are unguessable; one session's open
tasks are bounded, the refusal naming the bound; ended tasks are forgotten after their
ttl (a client creating tasks without end does not grow the server's memory)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.shared.exceptions import MCPError

from rho_actors import ActorSystem, TaskSettings, ToolCall
from rho_actors.cli.commands import build_parser
from rho_actors.cli.mcp_http import http_guard as _http_guard
from rho_actors.mcp import HTTPGuard
from rho_actors.mcp import tasks as served_tasks
from rho_actors.mcp.guard import DEFAULT_MAX_TASKS_PER_CLIENT
from rho_actors.mcp.tasks import EXTENSION, ServedTask, ServedTasks
from tests.conftest import WAIT_S, wait_for
from tests.mcp_fixtures import task_tools
from tests.test_mcp_protocol_eras import NOBODY, SYSTEM_PYTHON, TOKEN, _http_client, _served_http
from tests.test_mcp_tasks import Tasks, _code, _create, _ended, _extensions, _request

_INTRUDER = f"WAIT_S = {WAIT_S}  # tests/conftest.py's bound, in this child too\n" + """
import json, sys, urllib.request, urllib.error
url, token, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
said = []
for n, (method, params) in enumerate(calls):
    params["_meta"] = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                       "io.modelcontextprotocol/clientCapabilities": {
                           "extensions": {"io.modelcontextprotocol/tasks": {}}}}
    body = {"jsonrpc": "2.0", "id": n + 1, "method": method, "params": params}
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
               "Mcp-Method": method}
    if "taskId" in params:
        headers["Mcp-Name"] = params["taskId"]
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    data, text = [], ""
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as answer:
            for raw in answer:  # up to the answer, or a listen stream's acknowledgement (it stays open)
                line = raw.decode()
                text += line
                if line.startswith("data:") and line[5:].strip():
                    data.append(line[5:].strip())
                    if "id" in json.loads(data[-1]) or "subscriptions/acknowledged" in data[-1]:
                        break
    except urllib.error.HTTPError as refused:
        text = refused.read().decode()
    said.append(data or [text])
print(json.dumps(said))
"""


def _intrude(url: str, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """``calls`` (method, params) sent at 2026-07-28 by a client of another uid
    (``nobody``) with the same token, declaring the tasks extension: each answer."""
    assert SYSTEM_PYTHON is not None
    run = subprocess.run([SYSTEM_PYTHON, "-c", _INTRUDER, url, TOKEN, json.dumps(calls)], user=NOBODY, cwd="/",
                         capture_output=True, text=True, timeout=WAIT_S * 2, check=False)
    assert run.returncode == 0, run.stderr
    return [json.loads(found[-1]) for found in json.loads(run.stdout)]


def _unnamed(answer: dict[str, Any], *task_ids: str) -> dict[str, Any]:
    """``answer`` without its request id, each of ``task_ids`` written ``ID``."""
    text = json.dumps({k: v for k, v in answer.items() if k != "id"})
    for task_id in task_ids:
        text = text.replace(task_id, "ID")
    found: dict[str, Any] = json.loads(text)
    return found


@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM_PYTHON is None,
                    reason="a second client of another uid needs root to start, and a system python3")
def test_another_principal_naming_a_task_is_answered_as_for_an_unknown_id_and_changes_nothing(
        system: ActorSystem) -> None:
    for name in ("crawl", "confirm"):
        system.register(getattr(task_tools, name))
    unknown = "t_" + "0" * 32
    with _served_http(system) as (url, _guard):
        async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            with anyio.fail_after(WAIT_S * 3):
                async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                    session = client.session
                    slow, _ = await _create(client, "crawl", {"seconds": 60})
                    asking, _ = await _create(client, "confirm", {"path": "/srv/x"})
                    while (await _request(session, "tasks/get", taskId=asking))["status"] != "input_required":
                        await anyio.sleep(0.05)
                    answer = {"sure": {"action": "accept", "content": {"sure": False}}}
                    calls: list[tuple[str, dict[str, Any]]] = []
                    for task_id in (slow, asking, unknown):
                        calls += [("tasks/get", {"taskId": task_id}),
                                  ("tasks/update", {"taskId": task_id, "inputResponses": answer}),
                                  ("tasks/cancel", {"taskId": task_id})]
                    said = await anyio.to_thread.run_sync(_intrude, url, calls)
                    after = {"slow": (await _request(session, "tasks/get", taskId=slow))["status"],
                             "asking": await _request(session, "tasks/get", taskId=asking)}
                    await _request(session, "tasks/update", taskId=asking,
                                   inputResponses={"sure": {"action": "accept", "content": {"sure": True}}})
                    while (done := await _request(session, "tasks/get", taskId=asking))["status"] != "completed":
                        await anyio.sleep(0.05)
                    after["answered"] = done["result"]["content"][0]["text"]
                    await _request(session, "tasks/cancel", taskId=slow)
                    return [_unnamed(a, slow, asking, unknown) for a in said], after

        said, after = anyio.run(main)
    assert said[6]["error"]["code"] == -32602 and "unknown task 'ID'" in said[6]["error"]["message"], said[6]
    assert said[:3] == said[6:9] and said[3:6] == said[6:9], said  # as an unknown id: no existence oracle
    assert after["slow"] == "working"  # not cancelled
    assert after["asking"]["status"] == "input_required" and set(after["asking"]["inputRequests"]) == {"sure"}
    assert after["answered"] == "accept: sure=True"  # the intruder's answer was not taken


@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM_PYTHON is None,
                    reason="a second client of another uid needs root to start, and a system python3")
def test_another_principal_listening_for_a_task_hears_nothing_of_it(system: ActorSystem) -> None:
    """A ``subscriptions/listen`` naming another principal's task acknowledges it as it
    acknowledges an unknown id (left out: no existence oracle), so no notifications/tasks
    of it go to that stream."""
    system.register(task_tools.crawl)
    unknown = "t_" + "0" * 32
    with _served_http(system) as (url, _guard):
        async def main() -> list[dict[str, Any]]:
            with anyio.fail_after(WAIT_S * 3):
                async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                    slow, _ = await _create(client, "crawl", {"seconds": 60})
                    calls: list[tuple[str, dict[str, Any]]] = [
                        ("subscriptions/listen", {"notifications": {"taskIds": [task_id], "toolsListChanged": True}})
                        for task_id in (slow, unknown)]
                    said = await anyio.to_thread.run_sync(_intrude, url, calls)
                    await _request(client.session, "tasks/cancel", taskId=slow)
                    return said

        said = anyio.run(main)
    assert [a["method"] for a in said] == ["notifications/subscriptions/acknowledged"] * 2, said
    assert said[0]["params"]["notifications"] == said[1]["params"]["notifications"] == {"toolsListChanged": True}


def test_task_ids_are_128_random_bits(system: ActorSystem) -> None:
    system.register(task_tools.report)
    loop = system.start_loop("s1")
    acks = loop.run_turn([ToolCall(f"c{n}", "report", json.dumps({"topic": str(n)})) for n in range(24)],
                         background=True)
    ids = [ack.details["task_id"] for ack in acks]
    assert all(re.fullmatch(r"t_[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == len(ids), ids
    # uuid4 fixes 6 of its 128 bits (its version nibble is always 4): every bit is random here
    assert {i[2 + 12] for i in ids} != {"4"}, ids


def test_one_session_s_open_tasks_are_bounded_and_the_refusal_names_the_bound(system: ActorSystem) -> None:
    system.register(task_tools.crawl)
    bound = system.task_registry.settings.max_tasks_per_session
    with _served_http(system) as (url, _guard):
        async def main() -> tuple[list[str], Any]:
            with anyio.fail_after(WAIT_S * 3):
                async with _http_client(url, "legacy", extensions=_extensions("legacy")) as client:
                    made = [(await _create(client, "crawl", {"seconds": 60}))[0] for _ in range(bound)]
                    refused = await client.call_tool("crawl", {"seconds": 60})
                    for task_id in made:
                        await _request(client.session, "tasks/cancel", taskId=task_id)
                    return made, refused

        made, refused = anyio.run(main)
    assert len(set(made)) == bound
    text = refused.content[0].text
    assert refused.is_error and "max_tasks_per_session" in text and str(bound) in text, text


def _ended_or_gone(served: ServedTasks, task_id: str) -> bool:
    with served._lock:
        found = served._tasks.get(task_id)
    return found is None or found.ended


def _served(system: ActorSystem, loop: Any) -> tuple[ServedTasks, Any]:
    """The system's tasks as ``mcp serve`` serves them, and a stand-in of an MCP session
    (what a :class:`ServedTask` needs of one: its loop)."""
    served = ServedTasks(system.task_registry, lambda result: None)  # type: ignore[arg-type,return-value]

    class Session:
        pass

    session = Session()
    session.loop = loop  # type: ignore[attr-defined]
    return served, session


def test_ended_tasks_are_forgotten_after_their_ttl(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, tasks=TaskSettings(task_ttl_s=0.0))
    monkeypatch.setattr(served_tasks, "_PRUNE_EVERY", 4)
    try:
        system.register(task_tools.report)
        loop = system.start_loop("s1")
        served, session = _served(system, loop)
        for n in range(40):
            [ack] = loop.run_turn([ToolCall(f"c{n}", "report", json.dumps({"topic": str(n)}))], background=True)
            served.created(ServedTask("local", session, "report"), ack, None)
            assert wait_for(functools.partial(_ended_or_gone, served, ack.details["task_id"]))
        assert len(served._tasks) <= 8, len(served._tasks)
        served.close()
    finally:
        system.stop()



def test_a_task_ended_and_forgotten_before_its_create_result_is_still_answered(tmp_path: Any) -> None:
    """A task whose ttl passed before its ``CreateTaskResult`` was made (a ttl of 0, or a
    short one under load) gets one with what it ended as, not a ``TaskError``."""
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, tasks=TaskSettings(task_ttl_s=0.0))
    try:
        system.register(task_tools.report)
        loop = system.start_loop("s1")
        served, session = _served(system, loop)
        [ack] = loop.run_turn([ToolCall("c1", "report", json.dumps({"topic": "x"}))], background=True)
        task_id = ack.details["task_id"]

        def forgotten() -> bool:
            try:
                system.task_registry.get("s1", loop.data_dir, task_id)
            except LookupError:
                return True
            return False

        assert wait_for(forgotten)  # it ended, and its ttl of 0 passed, before the result below is made
        created = served.created(ServedTask("local", session, "report"), ack, None)
        assert created["resultType"] == "task" and created["taskId"] == task_id
        assert created["status"] == "completed", created
        served.close()
    finally:
        system.stop()


def _huge_update(url: str, task_id: str, chunked: bool) -> tuple[int, str]:
    """A 2026-07-28 ``tasks/update`` of 5 MiB of answers (streamed without a
    ``Content-Length`` when ``chunked``): its HTTP status and body."""
    params = {"taskId": task_id, "inputResponses": {"sure": {"action": "accept", "content": {"x": "y" * (5 << 20)}}},
              "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}}}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/update", "params": params}).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
               "Mcp-Method": "tasks/update", "Mcp-Name": task_id}
    content: Any = (body[i:i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    answer = httpx.post(url, content=content, headers=headers, timeout=WAIT_S)
    return answer.status_code, answer.text


def test_a_huge_tasks_update_is_refused_before_it_is_parsed(system: ActorSystem) -> None:
    system.register(task_tools.confirm)
    with _served_http(system) as (url, _guard):
        async def main() -> dict[str, Any]:
            with anyio.fail_after(WAIT_S * 3):
                async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                    session = client.session
                    asking, _ = await _create(client, "confirm", {"path": "/srv/x"})
                    while (await _request(session, "tasks/get", taskId=asking))["status"] != "input_required":
                        await anyio.sleep(0.05)
                    said: dict[str, Any] = {}
                    for chunked in (False, True):
                        said[f"chunked={chunked}"] = await anyio.to_thread.run_sync(_huge_update, url, asking, chunked)
                    said["still"] = (await _request(session, "tasks/get", taskId=asking))["status"]
                    await _request(session, "tasks/update", taskId=asking,
                                   inputResponses={"sure": {"action": "accept", "content": {"sure": True}}})
                    while (done := await _request(session, "tasks/get", taskId=asking))["status"] != "completed":
                        await anyio.sleep(0.05)
                    said["answered"] = done["result"]["content"][0]["text"]
                    return said

        said = anyio.run(main)
    for chunked in (False, True):
        status, text = said[f"chunked={chunked}"]
        assert status == 413, (chunked, status, text[:300])
    assert said["still"] == "input_required" and said["answered"] == "accept: sure=True"


def test_one_client_s_open_tasks_are_bounded_over_all_its_sessions(system: ActorSystem) -> None:
    system.register(task_tools.crawl)
    with _served_http(system) as (url, guard):
        guard.max_tasks_per_client = 3

        async def main() -> dict[str, Any]:
            said: dict[str, Any] = {}
            with anyio.fail_after(WAIT_S * 3):
                async with _http_client(url, "legacy", extensions=_extensions("legacy")) as first, \
                        _http_client(url, "2026-07-28", extensions=[Tasks()]) as second:
                    mine = [(await _create(first, "crawl", {"seconds": 60}))[0] for _ in range(2)]
                    other, _ = await _create(second, "crawl", {"seconds": 60})  # a new session: same client
                    said["refused"] = await _code(_create(second, "crawl", {"seconds": 60}))
                    said["refused_first"] = await _code(_create(first, "crawl", {"seconds": 60}))
                    await _request(first.session, "tasks/cancel", taskId=mine[0])
                    said["cancelled"] = (await _ended(first.session, mine[0]))["status"]
                    again, _ = await _create(second, "crawl", {"seconds": 60})  # room again
                    said["again"] = (await _request(second.session, "tasks/get", taskId=again))["status"]
                    for task_id in (again, other):
                        await _request(second.session, "tasks/cancel", taskId=task_id)
                    await _request(first.session, "tasks/cancel", taskId=mine[1])
            return said

        said = anyio.run(main)
    for key in ("refused", "refused_first"):
        code, text = said[key]
        assert code == types.INVALID_REQUEST and "max_tasks_per_client" in text and "at most 3" in text, said
    assert said["cancelled"] == "cancelled" and said["again"] == "working"


def test_mcp_serve_takes_max_tasks_per_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHO_MCP_TOKEN", TOKEN)
    args = build_parser().parse_args(["mcp", "serve", "--http", "127.0.0.1:8000", "--max-tasks-per-client", "5"])
    assert _http_guard(args).max_tasks_per_client == 5
    assert _http_guard(build_parser().parse_args(["mcp", "serve", "--http", "127.0.0.1:8000"])).max_tasks_per_client \
        == DEFAULT_MAX_TASKS_PER_CLIENT
    with pytest.raises(ValueError, match="max_tasks_per_client must be more than 0, got 0"):
        HTTPGuard(TOKEN, max_tasks_per_client=0)


def test_concurrent_calls_of_one_client_cannot_pass_its_task_bound_together(system: ActorSystem) -> None:
    system.register(task_tools.crawl)
    with _served_http(system) as (url, guard):
        guard.max_tasks_per_client = 3

        async def main() -> tuple[list[str], list[tuple[int, str]]]:
            made: list[str] = []
            refused: list[tuple[int, str]] = []
            with anyio.fail_after(WAIT_S * 3):
                async with _http_client(url, "legacy", extensions=_extensions("legacy")) as client:
                    async def one() -> None:
                        try:
                            made.append((await _create(client, "crawl", {"seconds": 60}))[0])
                        except MCPError as exc:
                            refused.append((exc.code, str(exc)))

                    async with anyio.create_task_group() as group:
                        for _ in range(10):
                            group.start_soon(one)
                    for task_id in made:
                        await _request(client.session, "tasks/cancel", taskId=task_id)
            return made, refused

        made, refused = anyio.run(main)
    assert len(made) == 3 and len(refused) == 7, (made, refused)
    assert all(code == types.INVALID_REQUEST and "max_tasks_per_client" in text for code, text in refused)
