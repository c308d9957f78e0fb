"""Background calls of ``async`` tools run on the system's tasks event loop (DESIGN §4
"Background calls"): an open task holds no thread, and keeps its deadline, its cancel,
its crash as a failed result, its record and its place in ``tree()``; through a real
ActorSystem and real files."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, TaskSettings, ToolCall, tool
from rho_actors.tasks import records

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(300)

gate: list[concurrent.futures.Future[str]] = []  # the one the test opens
cancelled_on: list[str] = []
began = threading.Event()  # set once ``cancellable`` is inside its wait (its cancel is then seen)


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    gate[:] = [concurrent.futures.Future()]
    cancelled_on.clear()
    began.clear()
    unblock.clear()


@tool(background=True, background_timeout_ms=120_000)
async def waits_on_gate(n: int) -> str:
    """Wait until the test opens the gate, then answer with ``n``."""
    word = await asyncio.shield(asyncio.wrap_future(gate[0]))  # a cancel ends this call only, not the gate
    return f"{word} {n}"


@tool(background=True, background_timeout_ms=300)
async def overdue_async() -> str:
    """Wait past its background deadline."""
    await asyncio.sleep(60)
    return "never"


@tool(background=True, background_timeout_ms=60_000)
async def cancellable(ctx: Mapping[str, Any]) -> str:
    """Wait until cancelled, noting the cancel's reason and the thread it was seen on."""
    try:
        began.set()
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        cancelled_on.append(threading.current_thread().name)
        raise
    return "never"


unblock = threading.Event()


@tool(background=True, background_timeout_ms=60_000)
async def blocks_the_loop() -> str:
    """Block its event loop (a synchronous wait inside ``async def``: a fault of the tool)."""
    unblock.wait(WAIT_S)
    return "unblocked"


@tool(background=True, background_timeout_ms=60_000)
async def crashes() -> str:
    """Crash after its first await."""
    await asyncio.sleep(0)
    raise RuntimeError("the crawler broke")


def test_a_hundred_open_async_tasks_hold_no_thread_each_and_all_complete(tmp_path: Path) -> None:
    # a thread per task would add 100 threads against the 8 allowed: a hundred shows it as a
    # thousand did, in a tenth of the time
    count = 100
    settings = TaskSettings(max_tasks=count, max_tasks_per_session=count)
    with ActorSystem(data_dir=tmp_path, tasks=settings) as system:
        system.register(waits_on_gate)
        loop = system.start_loop("s1")
        [warm] = loop.run_turn([ToolCall("warm", "waits_on_gate", '{"n": -1}')])  # what runs them, started
        assert warm.ok, warm.content
        assert loop.cancel_task(warm.details["task_id"]).status == "cancelled"
        before = threading.active_count()
        acks = loop.run_turn([ToolCall(f"c{n}", "waits_on_gate", f'{{"n": {n}}}') for n in range(count)])
        assert all(a.ok for a in acks), [a.content for a in acks if not a.ok][:3]
        tasks_node = system.tree()["children"][-1]
        assert tasks_node["id"] == "tasks" and len(tasks_node["children"]) == count
        assert system.stats()["tasks"]["open"] == count
        added = threading.active_count() - before
        assert added <= 8, f"{count} open async tasks added {added} threads"
        gate[0].set_result("done")
        results = [loop.task_result(a.details["task_id"], timeout_s=WAIT_S) for a in acks]
        assert [(i.status, i.result.content if i.result else None) for i in results] == [
            ("completed", f"done {n}") for n in range(count)]
        assert {r["status"] for r in records.read_all(loop.data_dir)} == {"completed", "cancelled"}
        assert system.stats()["tasks"]["open"] == 0


def test_an_async_task_past_its_background_deadline_failed_with_timeout(system: ActorSystem) -> None:
    system.register(overdue_async)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([ToolCall("c1", "overdue_async", "{}")])
    done = loop.task_result(ack.details["task_id"], timeout_s=WAIT_S)
    assert done.status == "failed" and done.result is not None
    assert done.result.error_kind is ErrorKind.TIMEOUT and "300 ms" in done.result.content
    [record] = records.read_all(loop.data_dir)
    assert record["status"] == "failed" and record["result"]["error_kind"] == "timeout"


def test_cancel_task_cancels_an_async_task_on_the_tasks_event_loop(system: ActorSystem) -> None:
    system.register(cancellable)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([ToolCall("c1", "cancellable", "{}")])
    task_id = ack.details["task_id"]
    assert wait_for(lambda: system.tree()["children"][-1]["children"] != [])
    info = loop.cancel_task(task_id)
    assert info.status == "cancelled" and info.result is not None and info.result.error_kind is ErrorKind.CANCELLED
    assert wait_for(lambda: cancelled_on != []), "the tool's coroutine was not cancelled"
    assert cancelled_on == ["rho_actors-tasks"]
    assert system.tree()["children"][-1]["children"] == []


def test_an_async_task_that_crashes_is_a_failed_result_not_a_restart(system: ActorSystem) -> None:
    system.register(crashes)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([ToolCall("c1", "crashes", "{}")])
    done = loop.task_result(ack.details["task_id"], timeout_s=WAIT_S)
    assert done.status == "failed" and done.result is not None
    assert done.result.error_kind is ErrorKind.RAISED and "the crawler broke" in done.result.content
    [again] = loop.run_turn([ToolCall("c2", "crashes", "{}")])  # the event loop runs on for the next one
    assert loop.task_result(again.details["task_id"], timeout_s=WAIT_S).status == "failed"


def test_the_system_stopping_cancels_its_open_async_tasks_and_ends_their_event_loop(tmp_path: Path) -> None:
    system = ActorSystem(data_dir=tmp_path)
    system.register(cancellable)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([ToolCall("c1", "cancellable", "{}")])
    assert began.wait(WAIT_S)  # in its wait: a stop before its first step would cancel it before its try
    assert any(t.name == "rho_actors-tasks" for t in threading.enumerate())
    data_dir = loop.data_dir
    system.stop()
    assert cancelled_on == ["rho_actors-tasks"]
    assert not any(t.name == "rho_actors-tasks" for t in threading.enumerate())
    [record] = records.read_all(data_dir)
    assert record["task_id"] == ack.details["task_id"] and record["status"] == "cancelled"


def test_a_tool_blocking_the_tasks_event_loop_does_not_hold_another_tasks_deadline(system: ActorSystem) -> None:
    system.register(blocks_the_loop)
    system.register(overdue_async)
    loop = system.start_loop("s1")
    [blocker] = loop.run_turn([ToolCall("c1", "blocks_the_loop", "{}")])
    assert wait_for(lambda: system.tree()["children"][-1]["children"] != [])
    [late] = loop.run_turn([ToolCall("c2", "overdue_async", "{}")])  # 300 ms, on the blocked loop
    try:
        done = loop.task_result(late.details["task_id"], timeout_s=WAIT_S)
        assert done.status == "failed" and done.result is not None and done.result.error_kind is ErrorKind.TIMEOUT
        assert loop.tasks()[0].status == "working"  # the blocking one is still within its own deadline
    finally:
        unblock.set()
    unblocked = loop.task_result(blocker.details["task_id"], timeout_s=WAIT_S).result
    assert unblocked is not None and unblocked.content == "unblocked"


@tool(background=True, background_timeout_ms=60_000, concurrency="exclusive")
async def vacuum(n: int) -> str:
    """Vacuum a table (one at a time in a session)."""
    await asyncio.sleep(0)
    return f"vacuumed {n}"


def test_an_exclusive_async_task_cancelled_before_its_first_step_gives_its_place_back(system: ActorSystem) -> None:
    system.register(blocks_the_loop)
    system.register(vacuum)
    loop = system.start_loop("s1")
    [blocker] = loop.run_turn([ToolCall("c1", "blocks_the_loop", "{}")])
    assert wait_for(lambda: system.tree()["children"][-1]["children"] != [])
    try:
        [first] = loop.run_turn([ToolCall("c2", "vacuum", '{"n": 1}')])  # its first step waits behind the blocker
        assert loop.cancel_task(first.details["task_id"]).status == "cancelled"
    finally:
        unblock.set()
    assert loop.task_result(blocker.details["task_id"], timeout_s=WAIT_S).status == "completed"
    [second] = loop.run_turn([ToolCall("c3", "vacuum", '{"n": 2}')])
    done = loop.task_result(second.details["task_id"], timeout_s=WAIT_S)
    assert done.status == "completed" and done.result is not None and done.result.content == "vacuumed 2"
