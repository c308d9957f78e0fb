"""What a system's sessions share instead of each working it out again (PROFILE §40): a
tool's call plan (:mod:`rho_actors.loop.call_plan`), made once per registration for every
session, and never used for another registration of the tool's name; and what each
session keeps of the arguments texts found valid (per session, by the registration they
were valid for) never passes arguments a later registration's schema rejects."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.loop import call_plan
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S
from .helpers import make_tool

pytestmark = pytest.mark.timeout(120)


@tool(name="which", timeout_ms=2_000, concurrency="exclusive")
def which_v1() -> str:
    """The first registration."""
    return "v1"


@tool(name="which", timeout_ms=int(WAIT_S * 1000), concurrency="exclusive")
def which_v2(ctx: Mapping[str, Any]) -> str:
    """The second registration: says how long is left to its deadline (its own timeout's)."""
    return f"v2 {ctx['deadline'] - time.monotonic():.1f}"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        yield system
    finally:
        system.stop()


def test_a_tools_call_plan_is_made_once_for_all_sessions(system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    plan_class = call_plan.CallPlan

    def counted(entry: Any, isolation: Any) -> call_plan.CallPlan:
        made.append(entry.info.name)
        return plan_class(entry, isolation)

    monkeypatch.setattr(call_plan, "CallPlan", counted)
    system.register(which_v1)
    for n in range(3):
        loop = system.start_loop(f"s{n}")
        results = loop.run_turn([ToolCall(f"c{n}a", "which", "{}"), ToolCall(f"c{n}b", "which", "{}")],
                                timeout_s=WAIT_S)
        assert [r.content for r in results] == ["v1", "v1"]
        loop.stop()
    assert made == ["which"]


def test_a_registration_again_is_what_every_sessions_next_call_runs(system: ActorSystem) -> None:
    system.register(which_v1)
    first, second = system.start_loop("a"), system.start_loop("b")
    assert first.run_turn([ToolCall("a1", "which", "{}")], timeout_s=WAIT_S)[0].content == "v1"  # its plan made
    assert system.unregister("which")
    system.register(which_v2)  # the same name, new code: another session never runs the first plan
    for loop, call_id in ((second, "b1"), (first, "a2")):
        [result] = loop.run_turn([ToolCall(call_id, "which", "{}")], timeout_s=WAIT_S)
        assert result.content.startswith("v2 ") and float(result.content[3:]) > WAIT_S / 2, result  # not v1's 2 s
    assert system.unregister("which")
    system.register(which_v1)  # and back: a new entry, never the plan made of the first one
    assert second.run_turn([ToolCall("b2", "which", "{}")], timeout_s=WAIT_S)[0].content == "v1"


def test_a_text_valid_for_one_registration_is_refused_by_the_next_in_every_session(system: ActorSystem) -> None:
    lenient = make_tool("strictly", "ok", schema={"type": "object", "properties": {"n": {"type": "number"}}})
    strict = make_tool("strictly", "ok", schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    system.register(lenient)
    first, second = system.start_loop("a"), system.start_loop("b")
    assert first.run_turn([ToolCall("a1", "strictly", '{"n": 1.5}')], timeout_s=WAIT_S)[0].ok  # found valid
    assert system.unregister("strictly")
    system.register(strict)
    for loop, call_id in ((second, "b1"), (first, "a2")):
        [refused] = loop.run_turn([ToolCall(call_id, "strictly", '{"n": 1.5}')], timeout_s=WAIT_S)
        assert refused.error_kind is ErrorKind.INVALID_ARGUMENTS and "n" in refused.content, refused
    assert second.run_turn([ToolCall("b2", "strictly", '{"n": 2}')], timeout_s=WAIT_S)[0].ok


def test_a_text_refused_is_refused_in_every_session(system: ActorSystem) -> None:
    strict = make_tool("strictly", "ok", schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    system.register(strict)
    for n in range(3):
        loop = system.start_loop(f"s{n}")
        [refused] = loop.run_turn([ToolCall(f"c{n}", "strictly", '{"n": 1.5}')], timeout_s=WAIT_S)
        assert refused.error_kind is ErrorKind.INVALID_ARGUMENTS, refused
        loop.stop()


@tool(concurrency="exclusive")
def step(n: int) -> int:
    """An exclusive tool: says its number back."""
    return n


def test_long_exclusive_turns_of_many_sessions_run_in_order_never_nested(system: ActorSystem) -> None:
    """Each call of an exclusive turn refused at its start (the session's budget used up)
    settles in the thread that started it, which then starts the next: one after another
    in that thread's chain, never a call inside the last one's settle, for every session
    (one chain per thread, shared by the sessions: a turn finds its own by identity)."""
    system.register(step)
    for n in range(3):
        loop = system.start_loop(f"s{n}", max_calls_per_session=1)
        calls = [ToolCall(f"c{n}-{i}", "step", f'{{"n": {i}}}') for i in range(1_500)]  # past the recursion limit
        results = loop.run_turn(calls, timeout_s=WAIT_S)
        assert [r.call_id for r in results] == [c.id for c in calls]
        assert results[0].content == "0", results[0]
        assert all(r.error_kind is ErrorKind.BUDGET_EXHAUSTED for r in results[1:]), {r.error_kind for r in results}
        loop.stop()
