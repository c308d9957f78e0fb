"""Calls of MCP clients held for approval (DESIGN §4 "Approvals", design mcp "Tasks"):
``mcp serve`` on loopback HTTP, the SDK's client. A decision that lands between the held
call's turn and the request's wait for it (made so with the wait's own hook, no sleep)
answers the request with the decided result, not the stale ``pending_approval``; a held
call that would be a task while the task registry is full is refused (the registry's own
``tasks_bound``, retryable once a task ends) and does not stay pending; and a held call
whose MCP session ends is rejected, recorded so, instead of waiting for ever."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types

from rho_actors import ActorSystem, TaskSettings, tool
from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from rho_actors.mcp.sessions import SESSION_ENDED, Session
from tests.conftest import WAIT_S, wait_for
from tests.test_approvals_served import _waiting
from tests.test_mcp_protocol_eras import _http_client, _served_http
from tests.test_mcp_tasks import Tasks, _create

RELEASE = threading.Event()


@tool(requires_approval=True)
def wipe(path: str) -> str:
    """Wipe a path (held for approval)."""
    return f"wiped {path}"


@tool(background=True, requires_approval=True)
def wipe_later(path: str) -> str:
    """Wipe a path as a task (held for approval)."""
    return f"wiped {path} later"


@tool(background=True, timeout_ms=600_000)
def occupy() -> str:
    """Hold a task slot until the test releases it."""
    RELEASE.wait(WAIT_S)
    return "released"


def _text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def _decisions(data: Path) -> dict[str, dict[str, Any]]:
    """Each decided call of the sessions under ``data``: its ``decided`` record."""
    found: dict[str, dict[str, Any]] = {}
    for path in data.glob(f"sessions/*/{TRANSCRIPT_NAME}"):
        found |= {c: t.states["decided"] for c, t in load(path).calls.items() if "decided" in t.states}
    return found


def test_a_decision_before_the_request_waits_for_it_answers_with_the_decided_result(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    system.register(wipe)
    waits = Session.decided

    async def decided_first(self: Session, pending: Any, waiting: Any, data_dir: Any) -> Any:
        # the decision lands after the held call's turn answered, before the request waits for it
        await anyio.to_thread.run_sync(lambda: self.loop.approve(pending.call_id, decided_by="ann"))
        return await waits(self, pending, waiting, data_dir)

    monkeypatch.setattr(Session, "decided", decided_first)
    with _served_http(system) as (url, _guard):
        async def main() -> types.CallToolResult:
            async with _http_client(url, "legacy") as client:
                with anyio.fail_after(WAIT_S):
                    return await client.call_tool("wipe", {"path": "/tmp/x"})

        result = anyio.run(main)
    assert (result.is_error, _text(result)) == (False, "wiped /tmp/x")


def test_a_held_task_call_past_the_task_bound_is_refused_and_not_left_pending(tmp_path: Path) -> None:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, tasks=TaskSettings(max_tasks=1))
    RELEASE.clear()
    try:
        system.register(occupy)
        system.register(wipe_later)
        with _served_http(system) as (url, _guard):
            async def main() -> tuple[Any, Any]:
                async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                    await _create(client, "occupy", {})  # the one task the system may have open
                    with anyio.fail_after(WAIT_S):
                        refused = await client.session.call_tool("wipe_later", {"path": "/a"}, allow_claimed=True)
                    RELEASE.set()
                    assert wait_for(lambda: not system.stats()["tasks"]["open"])
                    again, _ = await _create(client, "wipe_later", {"path": "/a"})  # a slot free: a held task
                    return refused, again

            refused, again = anyio.run(main)
        assert isinstance(refused, types.CallToolResult) and refused.is_error, refused
        assert "background calls are open in the system; the bound is 1 (max_tasks)" in _text(refused)
        assert [tool for _session, _call, tool in _waiting(tmp_path / "data")] == ["wipe_later"]  # the second only
        assert again.startswith("t_")
    finally:
        RELEASE.set()
        system.stop()


def test_a_held_call_of_an_mcp_session_that_ends_is_rejected(system: ActorSystem) -> None:
    system.register(wipe)
    data = system.data_dir
    with _served_http(system) as (url, _guard):
        async def main() -> str:
            async with _http_client(url, "legacy") as client, anyio.create_task_group() as calls:
                calls.start_soon(client.call_tool, "wipe", {"path": "/b"})
                assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: len(_waiting(data)) == 1))
                [(_session, call_id, _tool)] = _waiting(data)
                calls.cancel_scope.cancel()
            return call_id  # the client is gone: its session ended (DELETE of its Mcp-Session-Id)

        call_id = anyio.run(main)
        assert wait_for(lambda: call_id in _decisions(data)), "the held call still waits"
    decided = _decisions(data)[call_id]
    assert (decided["decision"], decided["decided_by"], decided["message"]) == (
        "rejected", "rho-actors mcp serve", SESSION_ENDED)
    assert _waiting(data) == []


def test_a_held_call_is_announced_to_a_person_and_a_client_only_once_it_is_recorded(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log line naming ``rho-actors approve`` for a held call, and the task an MCP
    client is given for a held background call (``input_required``, asking its
    ``approval``), come only once the call's ``pending`` record is in the transcript: a
    decision made at once, from another process, finds it. Before: both came as the
    held call's turn answered, its record written after on a pool thread (forced here:
    the record waits, briefly, for the announcement), and a decision right then was
    refused "no call waits for a decision"."""
    from loguru import logger

    from rho_actors.loop import approval_journal, decisions
    from rho_actors.loop.decisions import decide

    system.register(wipe)
    system.register(wipe_later)
    data = system.data_dir
    announced = threading.Event()
    real = decisions.record_held

    def record_held(*args: Any) -> None:
        announced.wait(1.0)  # a second, not an outcome's bound: after the fix nothing is announced meanwhile
        real(*args)

    monkeypatch.setattr(approval_journal, "record_held", record_held)
    logged: list[list[tuple[str, str, str]]] = []

    def sink(message: Any) -> None:
        logged.append(_waiting(data))  # what the transcript says as the command is logged
        announced.set()

    logger.enable("rho_actors")
    sink_id = logger.add(sink, level="INFO", filter=lambda r: "waits for a decision" in r["message"])
    try:
        with _served_http(system) as (url, _guard):
            async def main() -> tuple[types.CallToolResult, list[tuple[str, str, str]], str]:
                async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                    task_id, created = await _create(client, "wipe_later", {"path": "/t"})
                    at_creation = _waiting(data)
                    announced.set()
                    assert created["status"] == "input_required", created
                    [(session, call_id, _tool)] = await _recorded(data, "wipe_later")  # (before: only later)
                    decide(data, session, call_id, "approved", decided_by="ann")
                    announced.clear()
                    async with anyio.create_task_group() as calls:
                        answer: list[types.CallToolResult] = []

                        async def call() -> None:
                            answer.append(await client.call_tool("wipe", {"path": "/x"}))

                        calls.start_soon(call)
                        with anyio.fail_after(WAIT_S):
                            while not logged:
                                await anyio.sleep(0.01)
                        [(session, call_id, _tool)] = await _recorded(data, "wipe")
                        await anyio.to_thread.run_sync(
                            lambda: decide(data, session, call_id, "approved", decided_by="ann"))
                    return answer[0], at_creation, task_id

            result, at_creation, task_id = anyio.run(main)
    finally:
        logger.remove(sink_id)
        logger.disable("rho_actors")
    assert [tool for _s, _c, tool in at_creation] == ["wipe_later"] and task_id.startswith("t_")
    assert [tool for _s, _c, tool in logged[0]] == ["wipe"], logged
    assert (result.is_error, _text(result)) == (False, "wiped /x")


async def _recorded(data: Path, name: str) -> list[tuple[str, str, str]]:
    """The calls of tool ``name`` the transcripts under ``data`` record as waiting, once there are any."""
    def found() -> list[tuple[str, str, str]]:
        return [w for w in _waiting(data) if w[2] == name]

    assert await anyio.to_thread.run_sync(lambda: wait_for(lambda: bool(found()))), name
    return found()
