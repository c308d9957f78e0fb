"""Host control of turns and prompts: cancelling from asyncio and from a thread reaches
each running call (``ctx["cancel"]``, process workers killed) and is recorded; the
caller's contextvars reach the tools."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken, ToolCall, tool
from rho_actors.agent import aprompt, prompt
from rho_actors.model import Reply, ScriptedModel
from rho_actors.tool import ErrorKind
from rho_actors.transcript import TRANSCRIPT_NAME, read_records

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")
STARTED = threading.Event()
SAW_CANCEL = threading.Event()


@tool(timeout_ms=20_000)
def wait_for_cancel(ctx: Mapping[str, Any]) -> str:
    """Block until cancelled."""
    STARTED.set()
    if ctx["cancel"].wait(15):
        SAW_CANCEL.set()
        return "saw the cancel"
    return "never cancelled"


@tool(timeout_ms=20_000)
def sleep_long() -> str:
    """Sleep for a long time (in a worker process)."""
    time.sleep(15)
    return "woke"


@tool
def request_id() -> str:
    """The caller's request id."""
    return REQUEST_ID.get()


@tool
async def arequest_id() -> str:
    """The caller's request id, from an async tool."""
    await asyncio.sleep(0)
    return REQUEST_ID.get()


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    STARTED.clear()
    SAW_CANCEL.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, warm_workers=1)
    try:
        for t in (wait_for_cancel, request_id, arequest_id):
            system.register(t)
        system.register(sleep_long, isolation="process")
        yield system
    finally:
        system.stop()


def test_cancel_token_cancels_a_running_turn_from_a_thread(system: ActorSystem) -> None:
    loop = system.start_loop("t")
    token = CancelToken()
    future = loop.submit_turn([ToolCall("c1", "wait_for_cancel", "{}"), ToolCall("c2", "request_id", "{}")],
                              cancel=token)
    assert STARTED.wait(10)
    threading.Thread(target=token.cancel).start()
    results = future.result(10)
    assert results[0].error_kind == ErrorKind.CANCELLED and "cancelled by the host" in results[0].content
    assert results[1].call_id == "c2" and (results[1].ok or results[1].error_kind == ErrorKind.CANCELLED)
    assert SAW_CANCEL.wait(10)  # the tool saw ctx["cancel"]


def test_a_turn_cancelled_before_it_starts_runs_nothing(system: ActorSystem) -> None:
    loop = system.start_loop("t")
    token = CancelToken()
    token.cancel()
    results = loop.run_turn([ToolCall("c1", "wait_for_cancel", "{}")], cancel=token)
    assert results[0].error_kind == ErrorKind.CANCELLED and "did not start" in results[0].content
    assert not STARTED.is_set()


def test_cancelling_the_task_awaiting_arun_turn_cancels_the_turn(system: ActorSystem) -> None:
    loop = system.start_loop("t")

    async def main() -> None:
        task = asyncio.create_task(loop.arun_turn([ToolCall("c1", "wait_for_cancel", "{}")]))
        assert await asyncio.to_thread(STARTED.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert SAW_CANCEL.wait(10)
    assert loop.running() == []


def test_cancel_kills_a_process_worker(system: ActorSystem) -> None:
    loop = system.start_loop("t")
    token = CancelToken()
    future = loop.submit_turn([ToolCall("c1", "sleep_long", "{}")], cancel=token)
    deadline = time.monotonic() + 20
    while not loop.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # let the call reach its worker process
    started = time.monotonic()
    token.cancel()
    [result] = future.result(10)
    assert result.error_kind == ErrorKind.CANCELLED
    assert time.monotonic() - started < 5
    killed_by = time.monotonic() + 10
    while system.stats().get("workers_killed", 0) < 1 and time.monotonic() < killed_by:
        time.sleep(0.02)  # the CallActor's exchange ends once the worker is dead
    assert system.stats()["workers_killed"] == 1  # killed at the cancel, not at its 20 s deadline


def test_cancelling_aprompt_cancels_its_turn_and_records_it(system: ActorSystem) -> None:
    loop = system.start_loop("p")
    model = ScriptedModel([Reply(tool_calls=[ToolCall("c1", "wait_for_cancel", "{}")]), Reply(text="never")])

    async def main() -> None:
        task = asyncio.create_task(aprompt(loop, "go", model=model))
        assert await asyncio.to_thread(STARTED.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    records = read_records(loop.data_dir / TRANSCRIPT_NAME)[0]
    [result] = [r for r in records if r["type"] == "result"]
    assert result["error_kind"] == "cancelled"
    assert records[-1]["type"] == "error" and records[-1]["kind"] == "cancelled"
    assert len(model.requests) == 1  # no request after the cancel


def test_a_cancel_passed_to_prompt_stops_it(system: ActorSystem) -> None:
    loop = system.start_loop("p")
    token = CancelToken()
    model = ScriptedModel([Reply(tool_calls=[ToolCall("c1", "wait_for_cancel", "{}")]), Reply(text="never")])
    threading.Thread(target=lambda: STARTED.wait(10) and token.cancel()).start()
    result = prompt(loop, "go", model=model, cancel=token)
    assert result.error == "the host cancelled the prompt"
    assert result.steps[0].results[0].error_kind == ErrorKind.CANCELLED


def test_tools_see_the_callers_contextvars(system: ActorSystem) -> None:
    loop = system.start_loop("c")
    calls = [ToolCall("c1", "request_id", "{}"), ToolCall("c2", "arequest_id", "{}")]
    token = REQUEST_ID.set("req-42")
    try:
        assert [r.content for r in loop.run_turn(calls)] == ["req-42", "req-42"]
    finally:
        REQUEST_ID.reset(token)

    async def main() -> list[str]:
        REQUEST_ID.set("req-async")
        results = await loop.arun_turn(calls)
        reply = await aprompt(loop, "go", model=ScriptedModel([Reply(tool_calls=calls), Reply(text="ok")]))
        return [r.content for r in results] + [r.content for r in reply.steps[0].results]

    assert asyncio.run(main()) == ["req-async"] * 4
    assert [r.content for r in loop.run_turn(calls)] == ["unset", "unset"]  # a copy: nothing leaked


def test_astream_yields_the_events_and_a_closed_stream_cancels_the_prompt(system: ActorSystem) -> None:
    from rho_actors.agent import FinalResult, ToolCallStarted, astream

    loop = system.start_loop("s")
    model = ScriptedModel([Reply(text="hi")])

    async def collect() -> list[Any]:
        return [event async for event in astream(loop, "go", model=model)]

    events = asyncio.run(collect())
    assert [type(e).__name__ for e in events] == ["TextDelta", "StepEnded", "FinalResult"]
    assert isinstance(events[-1], FinalResult) and events[-1].result.text == "hi"

    model = ScriptedModel([Reply(tool_calls=[ToolCall("c1", "wait_for_cancel", "{}")]), Reply(text="never")])

    async def leave_early() -> None:
        events = astream(loop, "again", model=model)
        async for event in events:
            if isinstance(event, ToolCallStarted):
                assert await asyncio.to_thread(STARTED.wait, 10)
                break
        await events.aclose()  # type: ignore[attr-defined]

    asyncio.run(leave_early())
    assert SAW_CANCEL.wait(10)
    records = read_records(loop.data_dir / TRANSCRIPT_NAME)[0]
    assert records[-1]["type"] == "error" and records[-1]["kind"] == "cancelled"
