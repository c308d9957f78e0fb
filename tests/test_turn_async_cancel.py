"""A turn awaited with ``arun_turn`` and no cancel token of the host's is cancelled by
its id (``Turns.cancel_from_host``) when its awaiting task is: no token is made for it.
The guarantees hold on that path as on the token's: a sync call on a call thread is
cancelled (its ``ctx["cancel"]`` set) and answered ``cancelled`` once; a hung one is
answered at its deadline; a crash is a result; a host's own token is still set by the
task's cancel."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, CancelToken, ToolCall, tool
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, slack, wait_for

pytestmark = pytest.mark.timeout(60)

STARTED = threading.Event()
SAW_CANCEL = threading.Event()
RELEASE = threading.Event()  # set at each test's end: a hung tool's thread returns


@tool(timeout_ms=int(WAIT_S * 1000))
def waits_sync(ctx: Mapping[str, Any]) -> str:
    """On a call thread: wait for the call's cancel."""
    STARTED.set()
    if ctx["cancel"].wait(WAIT_S):
        SAW_CANCEL.set()
        return "saw the cancel"
    return "never cancelled"


@tool(timeout_ms=100)
def hangs_sync() -> str:
    """Hang, deaf to the cancel, until the test ends."""
    RELEASE.wait(WAIT_S)
    return "released"


@tool
def crashes_sync() -> str:
    """Raise."""
    raise ValueError("boom")


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    STARTED.clear()
    SAW_CANCEL.clear()
    RELEASE.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        for t in (waits_sync, hangs_sync, crashes_sync):
            system.register(t)
        yield system
    finally:
        RELEASE.set()
        system.stop()


async def until_started() -> None:
    """Wait (on the event loop, bounded) until the call's tool has started."""
    deadline = time.monotonic() + WAIT_S
    while not STARTED.is_set():
        assert time.monotonic() < deadline, "the tool never started"
        await asyncio.sleep(0.001)


def test_cancelling_the_awaiting_task_cancels_a_call_thread_call_without_a_token(system: ActorSystem) -> None:
    finished: list[str | None] = []
    system.subscribe(lambda e: finished.append(e.outcome) if isinstance(e, CallEvent) and e.kind == "finished"
                     else None)
    loop = system.start_loop("s")

    async def main() -> None:
        task = asyncio.ensure_future(loop.arun_turn([ToolCall("c1", "waits_sync", "{}")]))
        await until_started()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)

    asyncio.run(main())
    assert SAW_CANCEL.wait(WAIT_S)  # ctx["cancel"] was set on the call thread
    assert wait_for(lambda: finished != [])
    assert finished == ["cancelled"] and loop.running() == []


def test_cancelling_the_awaiting_task_still_sets_the_hosts_own_token(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    token = CancelToken()

    async def main() -> None:
        task = asyncio.ensure_future(loop.arun_turn([ToolCall("c1", "waits_sync", "{}")], cancel=token))
        await until_started()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)

    asyncio.run(main())
    assert token.cancelled and token.reason == "cancelled"
    assert SAW_CANCEL.wait(WAIT_S) and wait_for(lambda: loop.running() == [])


def test_a_hung_sync_tool_is_answered_at_its_deadline(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> tuple[Any, float]:
        t0 = time.monotonic()
        [result] = await loop.arun_turn([ToolCall("c1", "hangs_sync", "{}")])
        return result, time.monotonic() - t0

    result, took = asyncio.run(main())
    assert result.error_kind is ErrorKind.TIMEOUT, result
    assert took < 0.1 + slack(1.9)  # the deadline, not the tool, ended the wait


def test_a_crashing_sync_tool_is_a_result_and_a_later_turn_runs(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> list[Any]:
        first = await loop.arun_turn([ToolCall("c1", "crashes_sync", "{}")])
        second = await loop.arun_turn([ToolCall("c2", "crashes_sync", "{}"), ToolCall("c3", "nope", "{}")])
        return [*first, *second]

    one, two, unknown = asyncio.run(main())
    assert one.error_kind is ErrorKind.RAISED and "ValueError: boom" in one.content
    assert two.error_kind is ErrorKind.RAISED and unknown.error_kind is ErrorKind.UNKNOWN_TOOL
    assert loop.running() == []
