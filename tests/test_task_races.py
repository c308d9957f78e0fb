"""Background calls under races (DESIGN §4 "Background calls"): a cancel or the
system's stop racing a task's start, and one task's record written from several
threads at once, through a real ActorSystem and real files."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, TaskFinished, TaskSettings, ToolCall, tool
from rho_actors.agent.model import Reply, ScriptedModel
from rho_actors.isolation import RunningCall
from rho_actors.isolation.call import CallSpec
from rho_actors.tasks import records

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(120)

ran = threading.Event()
saw_cancel = threading.Event()


@pytest.fixture(autouse=True)
def _cleared() -> None:
    ran.clear()
    saw_cancel.clear()


@tool(background=True, background_timeout_ms=int(2 * WAIT_S * 1000))  # its wait for the cancel ends first
def patient(ctx: Mapping[str, Any]) -> str:
    """Run until cancelled (WAIT_S at most)."""
    ran.set()
    if ctx["cancel"].wait(WAIT_S):
        saw_cancel.set()
    return "ran to its end"


def _start_after(system: ActorSystem, before: Any) -> None:
    """Make the thread isolation run ``before()`` just before it starts a call."""
    isolation = system._runtime.isolations["thread"]
    start = isolation.start

    def hooked(call: CallSpec) -> RunningCall:
        before()
        return start(call)

    isolation.start = hooked  # type: ignore[method-assign]


def test_a_task_cancelled_while_its_call_starts_has_its_call_cancelled_too(system: ActorSystem) -> None:
    system.register(patient)
    loop = system.start_loop("s1")

    def cancel_it() -> None:
        [info] = loop.tasks()
        assert loop.cancel_task(info.task_id).status == "cancelled"

    _start_after(system, cancel_it)
    [ack] = loop.run_turn([ToolCall("c1", "patient", "{}")])
    assert ack.ok, ack.content
    assert ran.wait(WAIT_S)
    assert saw_cancel.wait(WAIT_S), "the cancelled task's call ran on, with no one to cancel it"
    [info] = loop.tasks()
    assert info.status == "cancelled" and system.stats()["tasks"]["open"] == 0
    [record] = records.read_all(loop.data_dir)
    assert record["status"] == "cancelled"


def test_a_task_started_as_the_system_stops_has_its_call_cancelled(system: ActorSystem) -> None:
    system.register(patient)
    loop = system.start_loop("s1")
    _start_after(system, system._runtime.tasks.stop)  # the stop collects the running calls before this one
    [ack] = loop.run_turn([ToolCall("c1", "patient", "{}")])
    assert ack.ok, ack.content
    assert ran.wait(WAIT_S)
    assert saw_cancel.wait(WAIT_S), "a task started as the system stopped ran on uncancelled"
    assert wait_for(lambda: loop.tasks()[0].status == "cancelled")


def test_one_record_written_from_eight_threads_at_once_is_written_whole_each_time(tmp_path: Path) -> None:
    failures: list[OSError] = []
    go = threading.Barrier(8)

    def write(n: int) -> None:
        go.wait(WAIT_S)
        for _ in range(40):
            try:
                records.write(tmp_path, {
                    "task_id": "t_" + "0" * 32, "call_id": "c1", "name": "crawl", "session_id": "s1",
                    "status": "completed", "started": 1.0, "finished": 2.0, "delivered": False,
                    "result": {"ok": True, "content": str(n) * 1000 * (n + 1), "error_kind": None, "duration_ms": 1.0},
                })
            except OSError as exc:
                failures.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert failures == []
    [record] = records.read_all(tmp_path)
    content = record["result"]["content"]
    assert content == content[0] * 1000 * (int(content[0]) + 1)
    assert sorted(p.name for p in (tmp_path / records.FOLDER).iterdir()) == ["t_" + "0" * 32 + ".json"]


def test_cancels_racing_starts_leave_each_record_as_the_task_ended(system: ActorSystem) -> None:
    system.register(patient)
    loop = system.start_loop("s1")
    stop = threading.Event()

    def cancel_every_open_task() -> None:
        while not stop.is_set():
            for info in loop.tasks():
                if info.open:
                    loop.cancel_task(info.task_id)

    racer = threading.Thread(target=cancel_every_open_task)
    racer.start()
    try:
        for n in range(60):
            [ack] = loop.run_turn([ToolCall(f"c{n}", "patient", "{}")])
            assert ack.ok, ack.content
    finally:
        stop.set()
        racer.join(WAIT_S)
    for info in loop.tasks():
        if info.open:
            loop.cancel_task(info.task_id)
    assert wait_for(lambda: system.stats()["tasks"]["open"] == 0)
    in_memory = {i.task_id: i.status for i in loop.tasks()}
    on_disk = {r["task_id"]: r["status"] for r in records.read_all(loop.data_dir)}
    assert on_disk == in_memory and set(in_memory.values()) == {"cancelled"}


@tool(background=True, background_timeout_ms=60_000)
def deaf() -> str:
    """Run on, never looking at its cancel token (until the test lets it end)."""
    ran.set()
    saw_cancel.wait(WAIT_S)
    return "ran to its end"


def test_cancel_task_ends_a_task_whose_tool_ignores_the_cancel_at_once(system: ActorSystem) -> None:
    system.register(deaf)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([ToolCall("c1", "deaf", "{}")])
    assert ran.wait(WAIT_S)
    began = time.monotonic()
    info = loop.cancel_task(ack.details["task_id"])
    assert time.monotonic() - began < WAIT_S / 2, "cancel_task waited for a tool that never answers a cancel"
    assert info.status == "cancelled" and info.result is not None and "cancelled" in info.result.content
    saw_cancel.set()  # its answer now is late: the task stays cancelled
    assert loop.task_result(ack.details["task_id"], timeout_s=0).status == "cancelled"
    [record] = records.read_all(loop.data_dir)
    assert record["status"] == "cancelled"


def test_the_system_stopping_with_tasks_open_records_each_cancelled(tmp_path: Path) -> None:
    system = ActorSystem(data_dir=tmp_path, shutdown_ms=2_000)
    try:
        system.register(deaf)
        loop = system.start_loop("s1")
        acks = loop.run_turn([ToolCall(f"c{n}", "deaf", "{}") for n in range(3)])
        assert all(a.ok for a in acks) and ran.wait(WAIT_S)
        data_dir = loop.data_dir
    finally:
        system.stop()
        saw_cancel.set()
    statuses = sorted((r["call_id"], r["status"], r["result"]["content"]) for r in records.read_all(data_dir))
    assert statuses == [(f"c{n}", "cancelled", "tool 'deaf' was cancelled (the system is stopping)") for n in range(3)]


@tool(background=True, background_timeout_ms=60_000)
def quick(site: str) -> str:
    """Crawl a site at once."""
    return f"crawled {site}"


def test_a_task_past_its_ttl_before_the_next_step_is_still_given_to_the_model_once(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, tasks=TaskSettings(task_ttl_s=0)) as system:
        system.register(quick)
        loop = system.start_loop("s1")
        model = ScriptedModel([
            Reply("", (ToolCall("c1", "quick", '{"site": "example.com"}'),)),
            Reply("The crawl is under way."),
            Reply("The crawl found it."),
        ])
        events = list(loop.stream("Crawl example.com", model=model, wait_for_tasks=True))
        finished = [e for e in events if isinstance(e, TaskFinished)]
        assert len(finished) == 1, "a result past its ttl was forgotten before the model had it"
        texts = [m.text for m in model.requests[-1][0] if m.role == "user"]
        assert sum("crawled example.com" in t for t in texts) == 1
        assert wait_for(lambda: loop.tasks() == [])  # given, then forgotten at its ttl
        again = ScriptedModel([Reply("ok")])
        loop.prompt("Anything else?", model=again)
        assert sum("Background task" in m.text for m in again.requests[0][0] if m.role == "user") == 1


@tool(background=True, background_timeout_ms=60_000)
def flaky(n: int) -> str:
    """Answer at once; every third call raises."""
    if n % 3 == 0:
        raise RuntimeError(f"call {n} failed")
    return f"result {n}"


def test_background_calls_from_eight_threads_past_the_bounds_are_each_answered_once_and_counted(
        tmp_path: Path) -> None:
    settings = TaskSettings(max_tasks=6, max_tasks_per_session=3, task_ttl_s=0)
    with ActorSystem(data_dir=tmp_path, tasks=settings) as system:
        system.register(flaky)
        loops = [system.start_loop(f"s{n}") for n in range(3)]
        answers: dict[str, int] = {}
        lock = threading.Lock()

        def turns(t: int) -> None:
            for k in range(10):
                calls = [ToolCall(f"c{t}_{k}_{i}", "flaky", f'{{"n": {i}}}') for i in range(6)]
                for result in loops[t % 3].run_turn(calls):
                    assert result.ok or "tasks_bound" in repr(result) or "max_tasks" in result.content, result
                    with lock:
                        answers[result.call_id] = answers.get(result.call_id, 0) + 1

        threads = [threading.Thread(target=turns, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S * 6)
        assert len(answers) == 8 * 10 * 6 and set(answers.values()) == {1}
        assert wait_for(lambda: system.stats()["tasks"]["open"] == 0)
        stats = system.stats()["tasks"]
        assert stats["started"] + stats["refused"] == 8 * 10 * 6
        assert stats["completed"] + stats["failed"] + stats["cancelled"] == stats["started"], stats
        assert stats["failed"] > 0 and stats["refused"] > 0


@tool(background=True, background_timeout_ms=60_000)
async def async_crawl(site: str) -> str:
    """Crawl a site, awaiting (longer than its turn)."""
    await asyncio.sleep(0.2)
    return f"crawled {site}"


def test_an_async_background_call_of_arun_turn_outlives_the_callers_event_loop(system: ActorSystem) -> None:
    system.register(async_crawl)
    loop = system.start_loop("s1")

    async def turn() -> list[Any]:
        return await loop.arun_turn([ToolCall(f"c{n}", "async_crawl", f'{{"site": "s{n}"}}') for n in range(3)])

    acks = asyncio.run(turn())  # the caller's event loop ends with its turn
    assert all(a.ok for a in acks), acks
    results = [loop.task_result(a.details["task_id"], timeout_s=WAIT_S) for a in acks]
    assert [(i.status, i.result.content if i.result else None) for i in results] == [
        ("completed", f"crawled s{n}") for n in range(3)]
