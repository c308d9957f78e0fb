"""What a tool reports besides its value: ``ToolFailure`` (an error result of a given
kind), ``ctx["progress"]`` (``ProgressEvent`` values), and the registry's
``ToolSetChanged`` events."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from rho_actors import (
    ActorSystem,
    ErrorKind,
    ProgressEvent,
    RhoError,
    ToolCall,
    ToolFailure,
    ToolSetChanged,
)
from tests.helpers import make_tool


def _unavailable(args: Any, ctx: Any) -> Any:
    raise ToolFailure(ErrorKind.UNAVAILABLE, "the backend is down for maintenance")


def test_a_tool_failure_is_a_result_of_its_kind_with_its_text(system: ActorSystem) -> None:
    system.register(make_tool("down", _unavailable))
    system.register(make_tool("down_away", _unavailable), untrusted=True)  # raised in a worker process
    loop = system.start_loop("f")
    for name in ("down", "down_away"):
        [result] = loop.run_turn([ToolCall("c", name, "{}")])
        assert result.error_kind is ErrorKind.UNAVAILABLE, result
        assert result.content == "the backend is down for maintenance"


def test_a_tool_failure_is_a_rho_error_that_pickles_and_checks_its_kind() -> None:
    failure = ToolFailure("crashed", "gone")
    assert isinstance(failure, RhoError) and failure.kind is ErrorKind.CRASHED
    again = pickle.loads(pickle.dumps(failure))
    assert again.kind is ErrorKind.CRASHED and str(again) == "gone"
    with pytest.raises(ValueError, match="'exploded' is not a valid ErrorKind"):
        ToolFailure("exploded", "no such kind")


def test_progress_reports_are_events_and_a_bad_one_is_dropped(system: ActorSystem) -> None:
    def run(args: Any, ctx: Any) -> str:
        ctx["progress"](1, 4, "a quarter")
        ctx["progress"]("not a number")  # dropped, the call goes on
        ctx["progress"](2)
        return "done"

    seen: list[ProgressEvent] = []
    system.subscribe(lambda e: seen.append(e) if isinstance(e, ProgressEvent) else None)
    system.register(make_tool("steps", run))
    [result] = system.start_loop("p").run_turn([ToolCall("c1", "steps", "{}")])
    assert result.ok and result.content == "done"
    assert seen == [ProgressEvent("p", "c1", "steps", 1.0, 4.0, "a quarter"), ProgressEvent("p", "c1", "steps", 2.0)]


def test_each_published_tool_set_is_announced(system: ActorSystem) -> None:
    seen: list[ToolSetChanged] = []
    system.subscribe(lambda e: seen.append(e) if isinstance(e, ToolSetChanged) else None)
    tool = make_tool("one")
    system.register(tool)
    assert seen[-1] == ToolSetChanged(system.tool_set().version)
    before = len(seen)
    assert system.unregister("one")
    assert len(seen) == before + 1 and seen[-1].version == system.tool_set().version
