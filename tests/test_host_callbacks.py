"""The host's own callbacks run by the runtime: a turn run from an ``on_result``
callback, a future's done callback or an event subscriber gets its calls run; callbacks
that exit lose no turn and crash no loop."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from rho_actors import (
    ActorSystem,
    CallEvent,
    CancelToken,
    ErrorKind,
    Loop,
    ToolCall,
    ToolContext,
    ToolResult,
    tool,
)

from .conftest import WAIT_S, slack
from .helpers import echo, echoed

GATE = threading.Event()


def _echo_system(tmp_path: Path) -> tuple[ActorSystem, Loop, Loop]:
    quick_ms = int(slack(3.0) * 1000)  # a quick call's deadline as this machine keeps up now: a held-back one meets it

    @tool(timeout_ms=int(WAIT_S * 1000))
    def gated(x: str) -> str:
        """Echo ``x`` once the test opens the gate."""
        GATE.wait(WAIT_S)
        return x

    @tool(timeout_ms=quick_ms)
    def echo(x: str) -> str:
        """Echo ``x``."""
        return x

    @tool(timeout_ms=quick_ms, concurrency="exclusive")
    def one_at_a_time(x: str) -> str:
        """Echo ``x``, one call of a turn after another."""
        return x

    system = ActorSystem(data_dir=tmp_path)
    system.register(echo)
    system.register(one_at_a_time)
    system.register(gated)
    return system, system.start_loop("a"), system.start_loop("b")


def _inner(loop: Loop, call_id: str, got: list[tuple[bool, str]], done: threading.Event) -> None:
    [result] = loop.run_turn([ToolCall(call_id, "echo", '{"x": "inner"}')], timeout_s=WAIT_S)
    got.append((result.ok, result.content))
    done.set()


@pytest.mark.parametrize("tool_name", ["echo", "one_at_a_time"])
def test_a_turn_run_from_on_result_gets_its_calls_run(tmp_path: Path, tool_name: str) -> None:
    """Before: the inner call was held back for the callback's call thread, which waited
    for it: it timed out after 3 s without having run."""
    system, a, b = _echo_system(tmp_path)
    with system:
        got: list[tuple[bool, str]] = []
        done = threading.Event()
        calls = [ToolCall(f"c{i}", tool_name, '{"x": "outer"}') for i in range(2)]

        def on_result(index: int, _result: ToolResult) -> None:
            if index == 0:
                _inner(b, "in", got, done)

        future = a.submit_turn(calls, on_result=on_result)
        assert [r.content for r in future.result(timeout=WAIT_S)] == ["outer", "outer"]
        assert done.wait(WAIT_S)
    assert got == [(True, "inner")]


def test_a_turn_run_from_a_futures_done_callback_gets_its_calls_run(tmp_path: Path) -> None:
    system, a, b = _echo_system(tmp_path)
    with system:
        got: list[tuple[bool, str]] = []
        done = threading.Event()
        GATE.clear()
        future = a.submit_turn([ToolCall("c1", "gated", '{"x": "outer"}')])
        future.add_done_callback(lambda _f: _inner(b, "in", got, done))  # before the call ends: on its thread
        GATE.set()
        assert done.wait(WAIT_S)
    assert got == [(True, "inner")]


def test_a_turn_run_from_an_event_subscriber_gets_its_calls_run(tmp_path: Path) -> None:
    system, a, b = _echo_system(tmp_path)
    with system:
        got: list[tuple[bool, str]] = []
        done = threading.Event()

        def on_event(event: object) -> None:
            if (isinstance(event, CallEvent) and event.session_id == "a" and event.kind == "finished"
                    and not done.is_set()):
                _inner(b, "in", got, done)

        system.subscribe(on_event)
        a.run_turn([ToolCall("c1", "one_at_a_time", '{"x": "outer"}'),
                    ToolCall("c2", "one_at_a_time", '{"x": "outer"}')], timeout_s=WAIT_S)
        assert done.wait(WAIT_S)
    assert got == [(True, "inner")]


def test_host_callbacks_that_exit_lose_no_turn_and_crash_no_loop(system: ActorSystem) -> None:
    """Before: an ``on_result`` raising SystemExit escaped the settling of its call, so
    the turn's future was never set (each turn hung); a done callback's SystemExit
    escaped ``Future.set_result`` (futures catch only ``Exception``) into whichever
    thread finished the turn: the LoopActor's, for a cancelled turn, which it ended."""

    @tool(concurrency="exclusive")
    def one_by_one(text: str) -> str:
        """Return the text, one call of the turn after another."""
        return text

    @tool(timeout_ms=int(WAIT_S * 1000))  # only a hang reaches it: the cancel comes first
    def waits(ctx: ToolContext) -> str:
        """Wait to be cancelled."""
        ctx.cancel.wait(WAIT_S)
        return "late"

    system.register(echo)
    system.register(one_by_one)
    system.register(waits)
    loop = system.start_loop("h")

    def exits(_index: int, _result: object) -> None:
        sys.exit(1)

    for name in ("echo", "one_by_one"):
        calls = [ToolCall(f"{name}{i}", name, '{"text": "x"}') for i in range(3)]
        future = loop.submit_turn(calls, on_result=exits)
        assert [r.content for r in future.result(WAIT_S)] == ["x"] * 3
    first = loop.ref
    token = CancelToken()
    future = loop.submit_turn([ToolCall("w", "waits", "{}")], cancel=token)
    future.add_done_callback(lambda _f: sys.exit(2))
    token.cancel()  # the LoopActor's thread finishes the turn, and runs the callback
    [result] = future.result(WAIT_S)
    assert result.error_kind is ErrorKind.CANCELLED
    assert loop.ref is first and echoed(loop, "alive") == "alive"
