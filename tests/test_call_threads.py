"""``thread`` calls run as one job on a reused call thread (no actor per call), and a
turn's arguments text once found valid is not decoded and checked again: what a user
relies on stays (a fresh value per call, a re-registered schema checked anew, the
running count, a stop that gives running calls their time, crashes as results, call
events for whoever subscribes)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, ToolCall, tool
from rho_actors.events import EventBus, ToolSetChanged
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S
from .helpers import make_tool

pytestmark = pytest.mark.timeout(60)

ENTERED = threading.Event()
RELEASE = threading.Event()


@tool
def grow(items: list[int]) -> int:
    """Append to the list it is given and say how long it is."""
    items.append(0)
    return len(items)


@tool(timeout_ms=int(WAIT_S * 1000))
def held(ctx: Mapping[str, Any]) -> str:
    """Wait until released or cancelled."""
    ENTERED.set()
    while not RELEASE.is_set():
        if ctx["cancel"].wait(0.01):
            return "cancelled"
    return "released"


@tool
def crash() -> str:
    """Raise."""
    raise SystemExit(3)


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    ENTERED.clear()
    RELEASE.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        for t in (grow, held, crash):
            system.register(t)
        yield system
    finally:
        RELEASE.set()
        system.stop()


def test_the_same_valid_arguments_text_gives_each_call_its_own_value(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    turns = [loop.run_turn([ToolCall(f"c{i}", "grow", '{"items": [1, 2]}')]) for i in range(3)]
    assert [t[0].content for t in turns] == ["3", "3", "3"]  # the tool's append never leaks into the next call


def test_a_text_valid_for_one_registration_is_checked_again_for_the_next(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    lenient = make_tool("strictly", "ok", schema={"type": "object", "properties": {"n": {"type": "number"}}})
    strict = make_tool("strictly", "ok", schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    system.register(lenient)
    assert loop.run_turn([ToolCall("a", "strictly", '{"n": 1.5}')])[0].ok
    assert system.unregister("strictly")
    system.register(strict)
    [refused] = loop.run_turn([ToolCall("b", "strictly", '{"n": 1.5}')])
    assert refused.error_kind is ErrorKind.INVALID_ARGUMENTS
    assert "n" in refused.content


def test_a_crash_is_the_calls_result_and_the_call_thread_serves_on(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    [crashed] = loop.run_turn([ToolCall("x", "crash", "{}")])
    assert crashed.error_kind is ErrorKind.EXITED
    assert loop.run_turn([ToolCall("y", "grow", '{"items": []}')])[0].content == "1"


def test_a_running_call_thread_is_counted_and_a_stop_gives_it_its_time(tmp_path: Path) -> None:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=5_000)
    system.register(held)
    ENTERED.clear()
    RELEASE.clear()
    loop = system.start_loop("s")
    future = loop.submit_turn([ToolCall("h", "held", "{}")])
    assert ENTERED.wait(WAIT_S)
    assert {c["id"]: c for c in system.tree()["children"]}["calls"]["running"] == 1
    returned = threading.Event()

    def stop() -> None:
        system.stop()
        returned.set()

    done = threading.Thread(target=stop)
    done.start()
    [result] = future.result(WAIT_S)  # the stop answers the call at once...
    assert result.error_kind is ErrorKind.CANCELLED or result.content == "cancelled"
    done.join(WAIT_S)  # ...and its thread, cancelled, returns within the stop's time
    assert returned.is_set()
    assert system.stats()["abandoned_threads_running"] == 0


def test_call_events_reach_a_subscriber_of_them_only(system: ActorSystem) -> None:
    bus = EventBus()
    assert not bus.wants_calls("started")
    seen: list[Any] = []
    bus.subscribe(seen.append, only=(ToolSetChanged,))
    assert not bus.wants_calls("started")
    unsubscribe = bus.subscribe(seen.append)
    assert bus.wants_calls("started")
    unsubscribe()
    assert not bus.wants_calls("started")

    events: list[CallEvent] = []
    system.subscribe(lambda e: events.append(e) if isinstance(e, CallEvent) else None)
    system.start_loop("s").run_turn([ToolCall("c", "grow", '{"items": []}')])
    assert [(e.call_id, e.kind) for e in events] == [("c", "started"), ("c", "finished")]


def test_an_async_host_cancelling_a_sync_call_gets_its_cancelled_result_first(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> None:
        task = asyncio.create_task(loop.arun_turn([ToolCall("h", "held", "{}")]))
        assert await asyncio.to_thread(ENTERED.wait, WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert loop.running() == []  # its result landed before the cancel was re-raised

    asyncio.run(main())
