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
from rho_actors.agent.driver import aprompt, prompt
from rho_actors.agent.model import Reply, ScriptedModel
from rho_actors.agent.transcript import TRANSCRIPT_NAME, read_records
from rho_actors.tool import ErrorKind

from .conftest import READS, WAIT_S, slack, wait_for

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")
STARTED = threading.Event()
SAW_CANCEL = threading.Event()


@tool(timeout_ms=int(2 * WAIT_S * 1000))  # its wait for the cancel ends first
def wait_for_cancel(ctx: Mapping[str, Any]) -> str:
    """Block until cancelled."""
    STARTED.set()
    if ctx["cancel"].wait(WAIT_S):
        SAW_CANCEL.set()
        return "saw the cancel"
    return "never cancelled"


@tool(timeout_ms=int(2 * WAIT_S * 1000))  # only a hang reaches it: the cancel or the stop comes first
def sleep_long(ctx: Mapping[str, Any]) -> str:
    """Say it started (a file in the session's data dir), then sleep for a long time
    (in a worker process)."""
    (Path(ctx["data_dir"]) / "sleeping").write_text("yes")
    time.sleep(WAIT_S)
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


@tool
def request_id_p() -> str:
    """The caller's request id, as a worker process sees it."""
    return REQUEST_ID.get()


@tool
def request_id_u() -> str:
    """The caller's request id, as an untrusted tool's worker sees it."""
    return REQUEST_ID.get()


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    STARTED.clear()
    SAW_CANCEL.clear()
    system = ActorSystem(data_dir=tmp_path / "data", untrusted=READS, shutdown_ms=2_000, warm_workers=1)
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
    assert STARTED.wait(WAIT_S)
    threading.Thread(target=token.cancel).start()
    results = future.result(WAIT_S)
    assert results[0].error_kind == ErrorKind.CANCELLED and "cancelled by the host" in results[0].content
    assert results[1].call_id == "c2" and (results[1].ok or results[1].error_kind == ErrorKind.CANCELLED)
    assert SAW_CANCEL.wait(WAIT_S)  # the tool saw ctx["cancel"]


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
        assert await asyncio.to_thread(STARTED.wait, WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert SAW_CANCEL.wait(WAIT_S)
    assert loop.running() == []


def _wait_running(folder: Path, future: Any) -> None:
    """Wait until ``sleep_long`` runs in its worker; a turn that ended first fails here
    with its results (what kept the call from its worker)."""
    assert wait_for(lambda: (folder / "sleeping").exists() or future.done())
    assert (folder / "sleeping").exists(), future.result(0)


def test_cancel_kills_a_process_worker(system: ActorSystem) -> None:
    loop = system.start_loop("t")
    token = CancelToken()
    future = loop.submit_turn([ToolCall("c1", "sleep_long", "{}")], cancel=token)
    _wait_running(loop.data_dir, future)  # running in its worker
    started = time.monotonic()
    token.cancel()
    [result] = future.result(WAIT_S)
    assert result.error_kind == ErrorKind.CANCELLED
    assert result.content == "tool 'sleep_long' was cancelled by the host while running"
    assert time.monotonic() - started < slack(5.0)
    # killed at the cancel, not at its deadline (the CallActor's exchange ends once
    # the worker is dead)
    assert wait_for(lambda: system.stats().get("workers_killed", 0) == 1)


def test_cancelling_aprompt_cancels_its_turn_and_records_it(system: ActorSystem) -> None:
    loop = system.start_loop("p")
    model = ScriptedModel([Reply(tool_calls=(ToolCall("c1", "wait_for_cancel", "{}"),)), Reply(text="never")])

    async def main() -> None:
        task = asyncio.create_task(aprompt(loop, "go", model=model))
        assert await asyncio.to_thread(STARTED.wait, WAIT_S)
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
    model = ScriptedModel([Reply(tool_calls=(ToolCall("c1", "wait_for_cancel", "{}"),)), Reply(text="never")])
    threading.Thread(target=lambda: STARTED.wait(WAIT_S) and token.cancel()).start()
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
        reply = await aprompt(loop, "go", model=ScriptedModel([Reply(tool_calls=tuple(calls)), Reply(text="ok")]))
        return [r.content for r in results] + [r.content for r in reply.steps[0].results]

    assert asyncio.run(main()) == ["req-async"] * 4
    assert [r.content for r in loop.run_turn(calls)] == ["unset", "unset"]  # a copy: nothing leaked


def test_a_trusted_worker_process_gets_the_callers_plain_contextvars(system: ActorSystem) -> None:
    """Plain values travel by the variable's name into a trusted tool's worker; an
    untrusted tool's worker gets none of the host's context."""
    system.register(request_id_p, isolation="process")
    system.register(request_id_u, untrusted=True)
    loop = system.start_loop("p")
    calls = [ToolCall("c1", "request_id_p", "{}"), ToolCall("c2", "request_id_u", "{}")]
    token = REQUEST_ID.set("req-7")
    try:
        assert [r.content for r in loop.run_turn(calls)] == ["req-7", "unset"]
    finally:
        REQUEST_ID.reset(token)
    assert [r.content for r in loop.run_turn(calls[:1])] == ["unset"]  # set for one call only


def test_astream_yields_the_events_and_a_closed_stream_cancels_the_prompt(system: ActorSystem) -> None:
    from rho_actors.agent.driver import FinalResult, ToolCallStarted, astream

    loop = system.start_loop("s")
    model = ScriptedModel([Reply(text="hi")])

    async def collect() -> list[Any]:
        return [event async for event in astream(loop, "go", model=model)]

    events = asyncio.run(collect())
    assert [type(e).__name__ for e in events] == ["TextDelta", "StepEnded", "FinalResult"]
    assert isinstance(events[-1], FinalResult) and events[-1].result.text == "hi"

    model = ScriptedModel([Reply(tool_calls=(ToolCall("c1", "wait_for_cancel", "{}"),)), Reply(text="never")])

    async def leave_early() -> None:
        events = astream(loop, "again", model=model)
        async for event in events:
            if isinstance(event, ToolCallStarted):
                assert await asyncio.to_thread(STARTED.wait, WAIT_S)
                break
        else:  # the stream ended with no call started: its end says why
            raise AssertionError(f"the prompt ended before its call started: {event!r}")
        await events.aclose()  # type: ignore[attr-defined]

    asyncio.run(leave_early())
    assert SAW_CANCEL.wait(WAIT_S)
    records = read_records(loop.data_dir / TRANSCRIPT_NAME)[0]
    assert records[-1]["type"] == "error" and records[-1]["kind"] == "cancelled"


def test_a_worker_pool_call_is_killed_when_its_cancel_is_set(tmp_path: Path) -> None:
    from rho_actors import WorkerPool

    marker = tmp_path / "sleeping"

    def sleeper(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        Path(args["marker"]).write_text("yes")
        time.sleep(60)
        return "woke"

    tool_ = type("Sleeper", (), {"run": staticmethod(sleeper)})
    with WorkerPool(warm=0) as pool:
        token = CancelToken()
        threading.Thread(target=lambda: wait_for(marker.exists) and token.cancel("cancelled")).start()
        result = pool.run(tool_, {"marker": str(marker)}, {"call_id": "c1"}, time.monotonic() + WAIT_S, 1000,
                          name="sleeper", cancel=token)
        assert result.error_kind == ErrorKind.CANCELLED
        assert result.content == "tool 'sleeper' was cancelled (cancelled); its worker process was killed"
        assert pool.stats()["killed"] == 1 and result.duration_ms < WAIT_S * 1000  # before its deadline

        late = pool.run(tool_, {"marker": str(marker)}, {"call_id": "c2"}, time.monotonic() + WAIT_S, 1000,
                        name="sleeper", cancel=token)  # already set: it never reaches a worker
        assert late.content == "tool 'sleeper' was cancelled (cancelled)" and pool.stats()["started"] == 1


def test_stopping_a_loop_kills_its_running_process_call(system: ActorSystem) -> None:
    loop = system.start_loop("stop")
    future = loop.submit_turn([ToolCall("c1", "sleep_long", "{}")])
    _wait_running(loop.data_dir, future)
    loop.stop()
    [result] = future.result(WAIT_S)
    assert result.error_kind == ErrorKind.CANCELLED and "session stopped" in result.content
    assert wait_for(lambda: system.stats().get("workers_killed", 0) == 1)  # one cancel path: stop kills too


def test_a_cancel_that_is_not_a_cancel_token_is_refused(system: ActorSystem) -> None:
    loop = system.start_loop("t")
    with pytest.raises(TypeError, match=r"cancel must be a rho_actors\.CancelToken or None, got Event"):
        loop.submit_turn([ToolCall("c1", "request_id", "{}")], cancel=threading.Event())  # type: ignore[arg-type]
