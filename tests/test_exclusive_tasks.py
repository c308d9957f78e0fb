"""Exclusive tools in the background (DESIGN §4 "Background calls", "The governor"): no
two calls of a session's exclusive tools run at once, also when one of them runs on as a
task past its turn; a parallel tool's calls are not held, nor another session's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall, tool

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(120)

release = threading.Event()
running: list[str] = []
overlaps: list[str] = []
_lock = threading.Lock()


def _run(what: str) -> None:
    with _lock:
        if running:
            overlaps.append(f"{what} while {running}")
        running.append(what)
    try:
        release.wait(WAIT_S)
    finally:
        with _lock:
            running.remove(what)


@tool(background=True, background_timeout_ms=int(2 * WAIT_S * 1000), concurrency="exclusive")  # its wait ends first
def migrate(table: str) -> str:
    """Migrate a table (exclusive: one at a time in a session; waits until the test releases it)."""
    _run(f"migrate {table}")
    return f"migrated {table}"


@tool(timeout_ms=300, concurrency="exclusive")
def vacuum() -> str:
    """Vacuum the database (exclusive, in the foreground)."""
    _run("vacuum")
    return "vacuumed"


@tool(concurrency="exclusive")  # the default deadline: long enough to start under any load
def analyze() -> str:
    """Analyze the database (exclusive, in the foreground)."""
    _run("analyze")
    return "analyzed"


@tool
def status() -> str:
    """A parallel tool."""
    return "ok"


@pytest.fixture
def system(tmp_path: object) -> Iterator[ActorSystem]:
    release.clear()
    running.clear()
    overlaps.clear()
    with ActorSystem(data_dir=str(tmp_path), shutdown_ms=2_000) as system:
        for t in (migrate, vacuum, analyze, status):
            system.register(t)
        yield system
    release.set()


def test_an_exclusive_tools_tasks_run_one_at_a_time_in_their_session(system: ActorSystem) -> None:
    loop = system.start_loop("s1")
    [first] = loop.run_turn([ToolCall("c1", "migrate", '{"table": "a"}')])
    started = time.monotonic()
    [second] = loop.run_turn([ToolCall("c2", "migrate", '{"table": "b"}')])  # acknowledged at once
    assert first.ok and second.ok and time.monotonic() - started < WAIT_S
    assert wait_for(lambda: running == ["migrate a"])
    other = system.start_loop("s2")  # another session's exclusive task is not held
    [elsewhere] = other.run_turn([ToolCall("c3", "migrate", '{"table": "c"}')])
    assert wait_for(lambda: sorted(running) == ["migrate a", "migrate c"])
    overlaps.clear()
    assert [r.content for r in loop.run_turn([ToolCall("c4", "status", "{}")])] == ["ok"]  # parallel: not held
    assert [t.status for t in loop.tasks()] == ["working", "working"]
    release.set()
    done = [loop.task_result(r.details["task_id"], timeout_s=WAIT_S) for r in (first, second)]
    assert [d.result.content for d in done if d.result] == ["migrated a", "migrated b"]
    assert done[1].result is not None and done[1].started >= done[0].started
    assert other.task_result(elsewhere.details["task_id"], timeout_s=WAIT_S).status == "completed"
    # a and b (s1's) never overlap; s2's c, released with a, may still be ending as b starts
    assert [o for o in overlaps if "migrate a" in o and "migrate b" in o] == [], overlaps


def test_an_exclusive_call_waits_for_its_sessions_exclusive_task_within_its_deadline(system: ActorSystem) -> None:
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([ToolCall("c1", "migrate", '{"table": "a"}')])
    assert wait_for(lambda: running == ["migrate a"])
    [refused] = loop.run_turn([ToolCall("c2", "vacuum", "{}")])
    assert refused.error_kind is ErrorKind.UNAVAILABLE
    assert "exclusive" in refused.content and "vacuum" in refused.content and "did not run" in refused.content
    release.set()
    assert loop.task_result(ack.details["task_id"], timeout_s=WAIT_S).status == "completed"
    # the task's end gave the session's exclusive place back: the next exclusive call runs (one whose
    # deadline is not 300 ms, which a call thread started late on a loaded machine could miss)
    assert [r.content for r in loop.run_turn([ToolCall("c3", "analyze", "{}")])] == ["analyzed"]
    assert overlaps == []
