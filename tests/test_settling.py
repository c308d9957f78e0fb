"""A call is settled by whichever thread answers first (the call's, its deadline's, the
host's cancel, the loop's stop), on pooled threads: exactly one result per call id, the
caller's contextvars in every call and never in the next one, a stuck thread kept out of
the pool, and a session folder made safely before the first call."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, CancelToken, ToolCall, tool
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(60)

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="unset")
STARTS: list[str] = []
RELEASE = threading.Event()
STUCK_THREAD: list[int] = []


@tool(concurrency="exclusive", timeout_ms=int(WAIT_S * 1000))
def in_order(ctx: Mapping[str, Any]) -> str:
    """Wait until cancelled (one at a time)."""
    STARTS.append(ctx["call_id"])
    ctx["cancel"].wait(WAIT_S)
    return "returned after the cancel"


@tool
def tag() -> str:
    """The caller's tag."""
    return TAG.get()


@tool(timeout_ms=150)
def stuck() -> str:
    """Ignore the deadline until released."""
    STUCK_THREAD.append(threading.get_ident())
    RELEASE.wait(WAIT_S)
    return "released"


@tool
def thread_id() -> int:
    """The thread running this call."""
    return threading.get_ident()


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    STARTS.clear()
    STUCK_THREAD.clear()
    RELEASE.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        for t in (in_order, tag, stuck, thread_id):
            system.register(t)
        yield system
    finally:
        RELEASE.set()
        system.stop()


def test_an_exclusive_turn_cancelled_midway_starts_nothing_more_and_its_late_result_is_late(
    system: ActorSystem,
) -> None:
    events: list[CallEvent] = []
    late = threading.Event()

    def seen(event: Any) -> None:
        if isinstance(event, CallEvent):
            events.append(event)
            if event.kind == "late":
                late.set()

    system.subscribe(seen)
    loop = system.start_loop("s")
    token = CancelToken()
    future = loop.submit_turn([ToolCall(f"c{i}", "in_order", "{}") for i in range(1, 4)], cancel=token)
    assert wait_for(lambda: STARTS == ["c1"])
    token.cancel()
    results = future.result(WAIT_S)
    assert [r.call_id for r in results] == ["c1", "c2", "c3"]
    assert "cancelled by the host while running" in results[0].content
    assert all(r.error_kind == ErrorKind.CANCELLED and "did not start" in r.content for r in results[1:])
    assert late.wait(WAIT_S)  # c1 saw its cancel and returned: reported, not a second result
    assert STARTS == ["c1"]
    assert [e.kind for e in events if e.call_id == "c1"] == ["started", "finished", "late"]


def test_each_call_runs_in_its_own_callers_context_on_reused_threads(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    for i in range(6):
        token = TAG.set(f"turn-{i}") if i % 2 == 0 else None
        try:
            [result] = loop.run_turn([ToolCall(f"c{i}", "tag", "{}")])
        finally:
            if token is not None:
                TAG.reset(token)
        assert result.content == (f"turn-{i}" if i % 2 == 0 else "unset")  # nothing left by the call before


def test_a_thread_stuck_in_an_abandoned_call_stays_out_of_the_pool_and_is_counted(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    [timed_out] = loop.run_turn([ToolCall("c1", "stuck", "{}")])
    assert timed_out.error_kind == ErrorKind.TIMEOUT
    assert system.stats()["abandoned_threads_running"] == 1
    assert wait_for(lambda: STUCK_THREAD != [])  # its thread may begin after its deadline (a loaded machine)
    for i in range(3):  # never on the stuck thread
        [result] = loop.run_turn([ToolCall(f"n{i}", "thread_id", "{}")])
        assert result.ok and int(result.content) != STUCK_THREAD[0]
    RELEASE.set()
    assert wait_for(lambda: system.stats()["abandoned_threads_running"] == 0)
    assert system.stats()["abandoned_threads_total"] == 1


def test_a_session_folder_replaced_by_a_symlink_before_the_first_call_runs_no_call(
    system: ActorSystem, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    loop = system.start_loop("late")  # its folder is made before its first call, not now
    folder = system.data_dir / "sessions" / "late"
    assert not folder.exists()
    folder.symlink_to(outside, target_is_directory=True)
    [result] = loop.run_turn([ToolCall("c1", "thread_id", "{}")])
    assert result.error_kind == ErrorKind.CANCELLED and "late is a symlink, not a folder" in result.content
    assert list(outside.iterdir()) == []
    folder.unlink()
    [result] = loop.run_turn([ToolCall("c2", "thread_id", "{}")])  # the next turn makes it
    assert result.ok and folder.is_dir() and not folder.is_symlink()
