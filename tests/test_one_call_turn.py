"""A turn of one call (PROFILE §37): dispatched without the exclusive chain or the
waiting loop, its call settled by its answer directly (no reply frame), started from the
session's per-tool call plan (:mod:`rho_actors.loop.call_plan`), and run in the turn's own
context copy. Each guarantee the general path keeps holds for it: cancel mid-flight, a
crash, the deadline, a late reply, the loop stopping under it, and a plan never starts a
tool that was registered again, withheld or removed."""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, CancelToken, ToolCall, tool
from rho_actors.loop.messages import RunTurn
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, slack, wait_for

pytestmark = pytest.mark.timeout(120)

STARTED = threading.Event()
RELEASE = threading.Event()
SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("SEEN", default="unset")


@tool(timeout_ms=int(WAIT_S * 1000))
def hold(ctx: Mapping[str, Any]) -> str:
    """Wait until released or cancelled."""
    STARTED.set()
    while not RELEASE.is_set():
        if ctx["cancel"].wait(0.01):
            return "cancelled"
    return "released"


@tool(timeout_ms=int(WAIT_S * 1000), concurrency="exclusive")
def hold_alone(ctx: Mapping[str, Any]) -> str:
    """Wait until released or cancelled (an exclusive tool)."""
    STARTED.set()
    while not RELEASE.is_set():
        if ctx["cancel"].wait(0.01):
            return "cancelled"
    return "released"


@tool(timeout_ms=200)
def deaf() -> str:
    """Ignore the deadline's cancel: return only once released."""
    STARTED.set()
    RELEASE.wait(WAIT_S)
    return "late"


DEAF_CTX: list[Mapping[str, Any]] = []


@tool(timeout_ms=300)
def deaf_kept(ctx: Mapping[str, Any]) -> str:
    """Ignore the deadline's cancel (keep the ctx to look at): return only once released."""
    DEAF_CTX.append(ctx)
    STARTED.set()
    RELEASE.wait(WAIT_S)
    return "late"


@tool
def crash() -> str:
    """Raise."""
    raise RuntimeError("boom")


@tool
def mark() -> str:
    """Set a context variable in the call's context; say what it was."""
    before = SEEN.get()
    SEEN.set("set by the call")
    return before


@tool(name="which", timeout_ms=2_000)
def which_v1() -> str:
    """The first registration."""
    return "v1"


@tool(name="which", timeout_ms=int(WAIT_S * 1000))
def which_v2(ctx: Mapping[str, Any]) -> str:
    """The second registration: says how long is left to its deadline (its own timeout's)."""
    return f"v2 {ctx['deadline'] - time.monotonic():.1f}"


@tool(name="which", timeout_ms=int(WAIT_S * 1000))
def which_held() -> str:
    """A registration whose call waits until released."""
    STARTED.set()
    RELEASE.wait(WAIT_S)
    return "held"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    STARTED.clear()
    RELEASE.clear()
    DEAF_CTX.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        for t in (hold, hold_alone, deaf, deaf_kept, crash, mark):
            system.register(t)
        yield system
    finally:
        RELEASE.set()
        system.stop()


def _in_thread(fn: Any) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # handed to the test
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


@pytest.mark.parametrize("name", ["hold", "hold_alone"])
def test_a_one_call_turn_cancelled_mid_flight_is_answered_cancelled_and_its_call_told(
    system: ActorSystem, name: str
) -> None:
    loop = system.start_loop("s")
    token = CancelToken()
    waiting = _in_thread(lambda: loop.run_turn([ToolCall("c1", name, "{}")], cancel=token))
    assert STARTED.wait(WAIT_S)
    token.cancel("cancelled")
    [result] = waiting.result(WAIT_S)
    assert result.error_kind is ErrorKind.CANCELLED and "cancelled by the host" in result.content, result
    assert wait_for(lambda: loop.running() == [])  # its call saw ctx["cancel"] and ended
    [after] = loop.run_turn([ToolCall("c2", "mark", "{}")], timeout_s=WAIT_S)
    assert after.ok


def test_a_one_call_turns_crash_is_its_raised_result_and_the_next_turn_runs(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    [crashed] = loop.run_turn([ToolCall("c1", "crash", "{}")], timeout_s=WAIT_S)
    assert crashed.error_kind is ErrorKind.RAISED and "boom" in crashed.content
    [after] = loop.run_turn([ToolCall("c2", "mark", "{}")], timeout_s=WAIT_S)
    assert after.ok


def test_a_one_call_turn_past_its_deadline_is_a_timeout_and_its_late_reply_an_event(system: ActorSystem) -> None:
    events: list[CallEvent] = []
    unsubscribe = system.subscribe(events.append, only=(CallEvent,))
    try:
        loop = system.start_loop("s")
        [result] = loop.run_turn([ToolCall("c1", "deaf", "{}")], timeout_s=WAIT_S)
        assert result.error_kind is ErrorKind.TIMEOUT, result
        RELEASE.set()  # its tool returns now, past the deadline: a late reply
        assert wait_for(lambda: any(e.kind == "late" and e.call_id == "c1" for e in events))
        assert [e.kind for e in events if e.call_id == "c1" and e.kind in ("finished", "timed_out")] == ["timed_out"]
    finally:
        unsubscribe()


def test_run_turns_waiting_thread_keeps_its_one_calls_deadline(system: ActorSystem) -> None:
    """The thread waiting in ``run_turn`` keeps its one thread call's deadline (no timer
    scheduled): a hung tool is answered ``timeout`` at the deadline, its ``ctx["cancel"]`` set."""
    timers = system._runtime.timers
    loop = system.start_loop("s")
    began = time.monotonic()
    waiting = _in_thread(lambda: loop.run_turn([ToolCall("c1", "deaf_kept", "{}")]))  # the default wait: past it
    assert STARTED.wait(WAIT_S)
    deadlines = [t for _, _, t in list(timers._heap) if getattr(t, "spec", None) is not None]
    [result] = waiting.result(WAIT_S)
    elapsed = time.monotonic() - began
    assert deadlines == []  # its deadline was never the timer thread's
    assert result.error_kind is ErrorKind.TIMEOUT, result
    assert DEAF_CTX[0]["cancel"].cancelled  # set before the timeout was delivered
    assert 0.3 <= elapsed < 0.3 + slack(0.5)


def test_a_run_turn_that_stops_waiting_first_leaves_its_calls_deadline_to_the_timers(system: ActorSystem) -> None:
    """A caller whose own bound ends before its call's deadline (``TimeoutError``) hands
    the deadline it kept to the system's timers: the call is still answered at it."""
    events: list[CallEvent] = []
    unsubscribe = system.subscribe(events.append, only=(CallEvent,))
    try:
        loop = system.start_loop("s")
        with pytest.raises(TimeoutError):
            loop.run_turn([ToolCall("c1", "deaf_kept", "{}")], timeout_s=0.05)
        assert wait_for(lambda: any(e.kind == "timed_out" and e.call_id == "c1" for e in events))
        assert DEAF_CTX[0]["cancel"].cancelled
    finally:
        unsubscribe()


def test_a_one_call_turn_under_a_stopping_loop_is_answered_session_stopped(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    waiting = _in_thread(lambda: loop.run_turn([ToolCall("c1", "hold", "{}")]))
    assert STARTED.wait(WAIT_S)
    loop.stop(WAIT_S)
    [result] = waiting.result(WAIT_S)
    assert result.error_kind is ErrorKind.CANCELLED and "session stopped" in result.content, result


def test_a_one_call_turn_runs_in_its_own_context_copy(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    SEEN.set("the host's")
    [first] = loop.run_turn([ToolCall("c1", "mark", "{}")], timeout_s=WAIT_S)
    [second] = loop.run_turn([ToolCall("c2", "mark", "{}")], timeout_s=WAIT_S)
    assert first.content == second.content == "the host's"  # the call's own set reached no other turn
    assert SEEN.get() == "the host's"


def test_a_run_turn_messages_context_is_copied_for_its_one_call(system: ActorSystem) -> None:
    """A ``RunTurn`` given a context (the sender's, which it may give again) runs its one
    call in a copy of it: the call's own sets stay in that copy."""
    loop = system.start_loop("s")
    shared = contextvars.Context()  # the sender's: SEEN not set in it
    for call_id in ("c1", "c2"):
        future: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        loop.ref.tell(RunTurn((ToolCall(call_id, "mark", "{}"),), future, context=shared))
        [result] = future.result(WAIT_S)
        assert result.ok and result.content == "unset", result  # not the first call's set
    assert shared.get(SEEN, "unset") == "unset"


def test_a_registration_again_is_what_the_next_one_call_turn_runs(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    system.register(which_v1)
    assert loop.run_turn([ToolCall("c1", "which", "{}")], timeout_s=WAIT_S)[0].content == "v1"
    assert system.unregister("which")
    system.register(which_v2)  # the same name, new code (its plan: a new entry's)
    [second] = loop.run_turn([ToolCall("c2", "which", "{}")], timeout_s=WAIT_S)
    assert second.content.startswith("v2 ") and float(second.content[3:]) > WAIT_S / 2  # its timeout, not v1's 2 s
    assert system.unregister("which")
    system.register(which_v1)  # and back: never the plan made of the first registration's entry
    assert loop.run_turn([ToolCall("c3", "which", "{}")], timeout_s=WAIT_S)[0].content == "v1"


def test_a_withheld_or_removed_tool_is_refused_though_it_has_a_plan(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    system.register(which_v1)
    assert loop.run_turn([ToolCall("c1", "which", "{}")], timeout_s=WAIT_S)[0].ok  # its plan made
    loop.set_withheld(["which"])
    [withheld] = loop.run_turn([ToolCall("c2", "which", "{}")], timeout_s=WAIT_S)
    assert withheld.error_kind is ErrorKind.WITHHELD, withheld
    loop.set_withheld([])
    assert system.unregister("which")
    [removed] = loop.run_turn([ToolCall("c3", "which", "{}")], timeout_s=WAIT_S)
    assert removed.error_kind is ErrorKind.UNAVAILABLE and "unregistered" in removed.content, removed


def test_a_tool_replaced_while_its_call_runs_keeps_that_call_and_runs_anew_after(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    system.register(which_held)
    waiting = _in_thread(lambda: loop.run_turn([ToolCall("c1", "which", "{}")]))
    assert STARTED.wait(WAIT_S)
    assert system.unregister("which")
    system.register(which_v2)  # replaced while its call is in flight
    [after] = loop.run_turn([ToolCall("c2", "which", "{}")], timeout_s=WAIT_S)
    assert after.content.startswith("v2 ")  # the new registration, not the plan of the one in flight
    RELEASE.set()
    [first] = waiting.result(WAIT_S)
    assert first.content == "held"  # the call in flight finished with the tool it started with


def test_a_bug_settling_a_one_call_turn_still_answers_it(system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The call's answer settles it directly (no reply closure around the settle): a
    bug there is still the call's one ``loop_failed`` result, and the next turn runs."""
    loop = system.start_loop("s")
    turns = loop._turns()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in the budgets")

    monkeypatch.setattr(turns._budgets, "charge", broken)
    [result] = loop.run_turn([ToolCall("c1", "mark", "{}")], timeout_s=WAIT_S)
    assert not result.ok and "a bug in the budgets" in result.content, result
    monkeypatch.undo()
    [after] = loop.run_turn([ToolCall("c2", "mark", "{}")], timeout_s=WAIT_S)
    assert after.ok
