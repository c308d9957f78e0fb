"""An asyncio host pays no thread hop it does not need: ``arun_turn`` runs a trusted
``async`` tool on the awaiting event loop, with its deadline enforced (the task is
cancelled and ``timeout`` answered at the deadline, a result past it is a timeout
all the same), crashes as results, the caller's contextvars, and cancellation; a sync
tool still runs on a call thread of its own."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, CancelToken, ToolCall, tool
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(60)

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="unset")
SAW_CANCEL = threading.Event()
STARTED = threading.Event()
ORDER: list[str] = []


@tool
async def on_which_loop() -> list[int]:
    """The thread and event loop running this call."""
    return [threading.get_ident(), id(asyncio.get_running_loop())]


@tool
def sync_where() -> int:
    """The thread running this (sync) call."""
    return threading.get_ident()


@tool(timeout_ms=100)
async def sleeps() -> str:
    """Sleep far past the deadline, noting the cancel."""
    STARTED.set()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        SAW_CANCEL.set()
        raise
    return "woke"


@tool(timeout_ms=100)
async def stubborn() -> str:
    """Swallow the cancel and return later."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        SAW_CANCEL.set()
    await asyncio.sleep(0.05)
    return "stubborn"


@tool(timeout_ms=50)
async def blocks_the_loop() -> str:
    """Block the event loop past the deadline (a sync sleep inside async def)."""
    time.sleep(0.2)
    return "blocked"


@tool
async def raises() -> str:
    """Raise."""
    raise ValueError("boom")


@tool
async def exits() -> str:
    """Raise SystemExit."""
    raise SystemExit(3)


@tool
async def tagged() -> str:
    """The caller's tag."""
    await asyncio.sleep(0)
    return TAG.get()


@tool(timeout_ms=20_000)
async def waits(ctx: Mapping[str, Any]) -> str:
    """Wait for the cancel."""
    STARTED.set()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        SAW_CANCEL.set()
        raise
    return "never"


@tool(concurrency="exclusive")
async def one_at_a_time(ctx: Mapping[str, Any]) -> str:
    """Note the order of calls."""
    ORDER.append(f"start {ctx['call_id']}")
    await asyncio.sleep(0.01)
    ORDER.append(f"end {ctx['call_id']}")
    return str(ctx["call_id"])


@tool(concurrency="exclusive")
def one_at_a_time_sync(ctx: Mapping[str, Any]) -> str:
    """Note the order of calls (sync)."""
    ORDER.append(f"start {ctx['call_id']}")
    time.sleep(0.01)
    ORDER.append(f"end {ctx['call_id']}")
    return str(ctx["call_id"])


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    SAW_CANCEL.clear()
    STARTED.clear()
    ORDER.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        for t in (on_which_loop, sync_where, sleeps, stubborn, blocks_the_loop, raises, exits, tagged, waits,
                  one_at_a_time, one_at_a_time_sync):
            system.register(t)
        yield system
    finally:
        system.stop()


def call(name: str, call_id: str = "c1") -> ToolCall:
    return ToolCall(call_id, name, "{}")


def test_an_async_tool_runs_on_the_awaiting_event_loop_and_a_sync_one_on_a_call_thread(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> tuple[list[int], int, int]:
        [a, s] = await loop.arun_turn([call("on_which_loop", "a"), call("sync_where", "s")])
        assert a.ok and s.ok
        return json.loads(a.content), int(s.content), id(asyncio.get_running_loop())

    (thread, aio), sync_thread, host_aio = asyncio.run(main())
    assert thread == threading.get_ident() and aio == host_aio  # no thread crossed
    assert sync_thread != threading.get_ident()  # a sync tool's deadline needs a thread of its own
    # run_turn (no event loop awaiting): the async tool runs on a call thread's private loop
    [r] = loop.run_turn([call("on_which_loop")], timeout_s=WAIT_S)
    assert r.ok and json.loads(r.content)[0] != threading.get_ident()


def test_the_deadline_cancels_the_task_and_answers_timeout_on_time(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> tuple[Any, float]:
        t0 = time.monotonic()
        [r] = await loop.arun_turn([call("sleeps")])
        return r, time.monotonic() - t0

    result, took = asyncio.run(main())
    assert result.error_kind == ErrorKind.TIMEOUT and "within its timeout of 100 ms; it was cancelled" in result.content
    assert took < 2.0 and SAW_CANCEL.is_set()


def test_a_task_that_swallows_its_cancel_is_answered_at_the_deadline_and_its_result_is_late(
    system: ActorSystem,
) -> None:
    late = threading.Event()
    system.subscribe(lambda e: late.set() if isinstance(e, CallEvent) and e.kind == "late" else None)
    loop = system.start_loop("s")

    async def main() -> Any:
        [r] = await loop.arun_turn([call("stubborn")])
        assert not late.is_set()
        await asyncio.sleep(0.2)  # the event loop runs on: the stubborn task ends
        return r

    result = asyncio.run(main())
    assert result.error_kind == ErrorKind.TIMEOUT and SAW_CANCEL.is_set()
    assert wait_for(late.is_set)


def test_a_result_past_its_deadline_is_a_timeout_even_when_the_loop_was_blocked(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    [result] = asyncio.run(loop.arun_turn([call("blocks_the_loop")]))
    assert result.error_kind == ErrorKind.TIMEOUT
    assert "what it returned after its deadline was discarded" in result.content


def test_crashes_are_results_and_never_reach_the_event_loop(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> list[Any]:
        results: list[Any] = await loop.arun_turn([call("raises", "r"), call("exits", "e")])
        await asyncio.sleep(0)  # the loop still runs
        return results

    raised, exited = asyncio.run(main())
    assert raised.error_kind == ErrorKind.RAISED and "ValueError: boom" in raised.content
    assert exited.error_kind == ErrorKind.EXITED and "SystemExit" in exited.content


def test_each_call_sees_the_callers_contextvars(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main(tag: str | None) -> str:
        if tag is not None:
            TAG.set(tag)
        [r] = await loop.arun_turn([call("tagged")])
        return str(r.content)

    assert asyncio.run(main("first")) == "first"
    assert asyncio.run(main(None)) == "unset"


def test_cancelling_the_awaiting_task_cancels_the_inline_call(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> None:
        task = asyncio.create_task(loop.arun_turn([call("waits")]))
        while not STARTED.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)
        assert SAW_CANCEL.is_set()

    asyncio.run(main())
    assert loop.running() == []


def test_a_cancel_token_and_the_loops_stop_cancel_an_inline_call(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> Any:
        token = CancelToken()
        pending = asyncio.ensure_future(loop.arun_turn([call("waits")], cancel=token))
        while not STARTED.is_set():
            await asyncio.sleep(0.001)
        await asyncio.to_thread(token.cancel)  # from another thread
        return await asyncio.wait_for(pending, WAIT_S)

    [cancelled] = asyncio.run(main())
    assert cancelled.error_kind == ErrorKind.CANCELLED and SAW_CANCEL.is_set()
    STARTED.clear()
    SAW_CANCEL.clear()

    async def stopped() -> Any:
        pending = asyncio.ensure_future(loop.arun_turn([call("waits", "c2")]))
        while not STARTED.is_set():
            await asyncio.sleep(0.001)
        await asyncio.to_thread(loop.stop)
        return await asyncio.wait_for(pending, WAIT_S)

    [result] = asyncio.run(stopped())
    assert result.error_kind == ErrorKind.CANCELLED and "session stopped" in result.content
    assert SAW_CANCEL.is_set()


def test_an_exclusive_turn_of_async_and_sync_calls_runs_one_at_a_time_in_order(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    calls = [call("one_at_a_time", "a1"), call("one_at_a_time_sync", "s1"), call("one_at_a_time", "a2")]
    results = asyncio.run(loop.arun_turn(calls))
    assert [r.content for r in results] == ["a1", "s1", "a2"]
    assert ORDER == ["start a1", "end a1", "start s1", "end s1", "start a2", "end a2"]
