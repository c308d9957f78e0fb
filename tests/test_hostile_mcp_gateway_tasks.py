"""A gateway client's task on a hostile upstream's task (SEP-2663, design mcp "MCP Tasks,
consumed"): a real SDK server (``tests/mcp_fixtures/hostile_task_upstream.py``) answers
malformed task creations and statuses, fails its tasks with huge messages, and answers a
call's creation only after the gateway's client cancelled it. The gateway's client (the
SDK's, over HTTP, declaring the extension) gets a ``failed`` task whose error names the
upstream and what was wrong, the upstream's task is cancelled whenever its id is known,
poll intervals are clamped, and a cancel that came before the upstream's task id is
applied once the id arrives, while a plain call's cancel reaches the upstream at once."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from rho_actors import ActorSystem
from rho_actors.mcp.gateway import UpstreamSpec
from rho_actors.mcp.upstream_tasks import MAX_POLL_S
from tests.conftest import WAIT_S, slack, wait_for
from tests.helpers import served_gateway
from tests.test_mcp_protocol_eras import _http_client
from tests.test_mcp_tasks import Tasks, _create, _ended, _request

UPSTREAM = Path(__file__).parent / "mcp_fixtures" / "hostile_task_upstream.py"


def _hostile(marks: Path, connect_timeout_s: float = 30.0) -> list[UpstreamSpec]:
    """The hostile task upstream (named ``hostile``, its marks in ``marks``)."""
    return [UpstreamSpec("hostile", command=(sys.executable, str(UPSTREAM), str(marks)),
                         connect_timeout_s=connect_timeout_s)]


def _upstream_task(marks: Path, tool: str) -> str:
    """The id of the upstream's task made for ``tool``'s call."""
    assert wait_for(lambda: any(p.read_text() == tool for p in marks.glob("task-*")))
    return next(p.name for p in marks.glob("task-*") if p.read_text() == tool)


def test_a_malformed_or_failed_upstream_task_fails_the_clients_task_and_is_cancelled(system: ActorSystem,
                                                                                     tmp_path: Path) -> None:
    with served_gateway(system, _hostile(tmp_path), tasks=True) as url:
        async def main() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                for tool in ("no_task_id", "number_task_id", "unknown_status", "result_not_object", "upstream_fails",
                             "negative_poll", "huge_poll"):
                    task_id, _ = await _create(client, tool, {})
                    with anyio.fail_after(WAIT_S + MAX_POLL_S):
                        ended = await _ended(client.session, task_id)
                    seen[tool] = ended
            return seen

        seen = anyio.run(main)
    for tool, said in (("no_task_id", "taskId"), ("number_task_id", "taskId"), ("unknown_status", "'exploded'"),
                       ("result_not_object", "result")):
        ended = seen[tool]
        assert ended["status"] == "failed", (tool, ended)
        message = ended["error"]["message"]
        assert "MCP server hostile" in message and "not a valid task" in message and said in message, (tool, message)
    failed = seen["upstream_fails"]
    assert failed["status"] == "failed", failed  # not completed with isError: the upstream's task failed
    assert "disk on fire" in failed["error"]["message"] and "MCP server hostile" in failed["error"]["message"]
    assert len(failed["error"]["message"]) < 3000 and len(failed["statusMessage"]) <= 500
    for tool in ("negative_poll", "huge_poll"):  # clamped: polled at once, and not after 10^12 ms
        assert seen[tool]["status"] == "completed" and seen[tool]["result"]["content"][0]["text"] == f"{tool} done"
    for tool in ("unknown_status", "result_not_object"):  # its id known: the upstream's task is cancelled
        assert wait_for((tmp_path / f"cancelled-{_upstream_task(tmp_path, tool)}").exists), tool


def test_a_cancel_before_the_upstream_task_id_is_known_cancels_the_upstream_task(system: ActorSystem,
                                                                                tmp_path: Path) -> None:
    with served_gateway(system, _hostile(tmp_path), tasks=True) as url:
        async def main() -> str:
            async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                task_id, _ = await _create(client, "late_task", {})
                upstream = _upstream_task(tmp_path, "late_task")  # its tools/call is in flight upstream
                await _request(client.session, "tasks/cancel", taskId=task_id)
                status = str((await _ended(client.session, task_id))["status"])
                (tmp_path / "release").touch()  # now the upstream answers the call with its task
                with anyio.fail_after(WAIT_S):
                    while not (tmp_path / f"cancelled-{upstream}").exists():
                        await anyio.sleep(0.05)
                return status

        assert anyio.run(main) == "cancelled"


def test_a_cancel_of_a_plain_call_on_a_tasks_server_reaches_it_at_once(system: ActorSystem, tmp_path: Path) -> None:
    # the answer of a cancelled call is awaited connect_timeout_s for a task made late; the
    # cancel itself must not wait for that (the plain call ran on for it)
    with served_gateway(system, _hostile(tmp_path, connect_timeout_s=WAIT_S * 10), tasks=True) as url:
        async def main() -> tuple[str, float]:
            async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                task_id, _ = await _create(client, "plain_wait", {})
                assert wait_for((tmp_path / "started-plain_wait").exists)  # in flight upstream
                cancelled_at = time.monotonic()
                await _request(client.session, "tasks/cancel", taskId=task_id)
                with anyio.fail_after(WAIT_S):
                    while not (tmp_path / "cancelled-plain_wait").exists():
                        await anyio.sleep(0.02)
                took = time.monotonic() - cancelled_at
                return str((await _ended(client.session, task_id))["status"]), took

        status, took = anyio.run(main)
    assert status == "cancelled"
    assert took < slack(2.0), f"the upstream saw the cancel {took:.1f} s after the client's"
