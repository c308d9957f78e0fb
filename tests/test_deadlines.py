"""A deadline is a deadline (DESIGN §5): a call whose deadline passed is ``timeout``,
whoever answers first, in every isolation; its settle-once slot (``Answer``) decides by
the deadline, and a result that lands after it is reported ``late``, after the timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken, ErrorKind, ToolCall, ToolResult
from rho_actors.isolation.call import Answer, CallActor, CallSpec, RunCall
from rho_actors.results import CANCELLED, DISCARDED, failure, result_from_return

from .conftest import WAIT_S, Recorder, wait_for
from .helpers import make_tool

pytestmark = pytest.mark.timeout(60)


def _spec(deadline: float, reply: Callable[[ToolResult], None], call_id: str = "c1") -> CallSpec:
    return CallSpec(call_id, "t", None, {}, MappingProxyType({}), time.monotonic(), deadline, 50, CancelToken(),
                    1000, reply)


def _ok(call_id: str = "c1") -> ToolResult:
    return result_from_return(call_id, "t", "done", 1000, 1.0)


class Replies:
    """A ``reply`` callback keeping what it got, in order."""

    def __init__(self) -> None:
        self.got: list[ToolResult] = []
        self.done = threading.Event()

    def __call__(self, result: ToolResult) -> None:
        self.got.append(result)
        self.done.set()

    def kinds(self) -> list[str]:
        return [r.error_kind or "ok" for r in self.got]


def test_a_result_settled_before_the_deadline_is_the_answer_and_the_deadline_then_claims_nothing() -> None:
    replies = Replies()
    answer = Answer(_spec(time.monotonic() + 3600, replies))
    assert answer.settle(_ok()) is True
    assert not answer.claim()  # the deadline timer, firing now, finds the slot taken
    assert replies.kinds() == ["ok"]


def test_a_result_landing_exactly_at_the_deadline_is_the_timeout_and_the_result_comes_late() -> None:
    replies = Replies()
    answer = Answer(_spec(time.monotonic(), replies))  # the deadline is now: any later settle is at or past it
    assert answer.settle(_ok()) is True
    assert replies.kinds() == [ErrorKind.TIMEOUT, "ok"]
    assert replies.got[0].content == f"tool 't' did not finish within its timeout of 50 ms; {DISCARDED}"
    assert replies.got[1].content == "done"  # the tool's own result, handed on as late


def test_the_deadlines_own_timeout_or_memory_result_past_the_deadline_is_kept() -> None:
    for result in (failure("timeout", "c1", "t", timeout_ms=50, consequence="its worker process was killed"),
                   failure("memory_thread", "c1", "t")):
        replies = Replies()
        assert Answer(_spec(time.monotonic(), replies)).settle(result)
        assert replies.got == [result]


def test_a_result_between_the_deadlines_claim_and_its_delivery_waits_for_the_timeout() -> None:
    replies = Replies()
    answer = Answer(_spec(time.monotonic() + 3600, replies))
    assert answer.claim()  # the timer fired: the slot is the timeout's
    assert answer.settle(_ok()) is False  # the tool returned when cancelled, before the timeout was delivered
    assert replies.got == []  # held back: the ok must not reach the loop first
    answer.deliver(answer.timeout(CANCELLED))
    assert replies.kinds() == [ErrorKind.TIMEOUT, "ok"]


def test_a_second_result_is_late_and_goes_after_the_first() -> None:
    replies = Replies()
    answer = Answer(_spec(time.monotonic() + 3600, replies))
    assert answer.settle(_ok())
    assert not answer.settle(failure("raised_opaque", "c1", "t"))
    assert replies.kinds() == ["ok", ErrorKind.RAISED]


@pytest.mark.parametrize("runner_raises", [False, True])
def test_a_call_actors_result_after_the_deadline_is_the_timeout_in_any_isolation(runner_raises: bool) -> None:
    """The CallActor path every isolation shares (a worker pool's or Ray's result too)."""
    replies = Replies()
    spec = _spec(time.monotonic(), replies)  # past its deadline by the time the runner returns

    def runner(call: CallSpec) -> ToolResult:
        if runner_raises:
            raise ValueError("late and wrong")
        return _ok(call.call_id)

    ref = CallActor.start()
    ref.tell(RunCall(spec, runner))
    assert wait_for(lambda: len(replies.got) == 2)
    assert replies.kinds()[0] is ErrorKind.TIMEOUT
    assert replies.kinds()[1] == (ErrorKind.RAISED if runner_raises else "ok")


HELD: dict[str, threading.Event] = {}


def _returns_when_cancelled(args: Any, ctx: Mapping[str, Any]) -> str:
    """Block until cancelled, then return ok, so the ok races the timeout as closely as it
    can (its cancel callback, run on a thread of its own, waits until this thread is
    returning)."""
    returning = HELD.setdefault(ctx["call_id"], threading.Event())
    ctx["cancel"].add_callback(lambda: returning.wait(WAIT_S))
    ctx["cancel"].wait(WAIT_S)
    returning.set()
    return "ok after the cancel"


def test_a_thread_tool_returning_when_cancelled_is_timeout_every_time(tmp_path: Path) -> None:
    HELD.clear()
    racer = make_tool("racer", _returns_when_cancelled, timeout_ms=50)
    with ActorSystem(data_dir=tmp_path, shutdown_ms=2_000, abandoned_threads_per_tool=64,
                     abandoned_threads_per_session=64) as system:
        recorder = Recorder()
        system.subscribe(recorder)
        system.register(racer)
        calls = [ToolCall(f"r{i}", "racer", "{}") for i in range(24)]
        results = system.start_loop("s").run_turn(calls)
        assert [r.error_kind for r in results] == [ErrorKind.TIMEOUT] * len(calls)
        assert all(r.content.endswith(CANCELLED) for r in results)
        # every ok came, after its timeout, as late
        assert wait_for(lambda: all(recorder.kinds(c.id) == ["started", "timed_out", "late"] for c in calls))
        assert wait_for(lambda: system.stats()["abandoned_threads_running"] == 0)


def test_a_tool_ignoring_its_cancel_still_times_out_on_time_and_its_thread_is_counted(tmp_path: Path) -> None:
    release = threading.Event()
    stuck = make_tool("stuck", lambda args, ctx: release.wait(WAIT_S), timeout_ms=50)
    with ActorSystem(data_dir=tmp_path, shutdown_ms=500) as system:
        system.register(stuck)
        [result] = system.start_loop("s").run_turn([ToolCall("x", "stuck", "{}")])
        assert result.error_kind is ErrorKind.TIMEOUT
        assert system.stats()["abandoned_threads_running"] == 1
        release.set()
        assert wait_for(lambda: system.stats()["abandoned_threads_running"] == 0)
        assert system.stats()["abandoned_threads_total"] == 1


def test_a_host_cancel_landing_after_the_deadline_before_its_timeout_is_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host cancels a call whose deadline has passed but whose timeout is not yet
    delivered (its timer is late under load): the answer is ``timeout``, not ``cancelled``.
    The turn's clock is moved past the deadline once the call runs, so the race is certain."""
    from rho_actors.loop import turns

    started, release = threading.Event(), threading.Event()

    def blocks(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        started.set()
        release.wait(WAIT_S)
        return "done"

    class Clock:
        shift = 0.0

        @staticmethod
        def monotonic() -> float:
            return time.monotonic() + Clock.shift

    with ActorSystem(data_dir=tmp_path, shutdown_ms=500) as system:
        system.register(make_tool("blocks", blocks, timeout_ms=60_000))
        loop = system.start_loop("s")
        cancel = CancelToken()
        monkeypatch.setattr(turns, "time", Clock)
        future = loop.submit_turn([ToolCall("a", "blocks", "{}"), ToolCall("b", "blocks", "{}")], cancel=cancel)
        assert started.wait(WAIT_S)
        Clock.shift = 3600.0  # the deadlines (60 s) have passed; their timers have not fired
        cancel.cancel()
        results = future.result(WAIT_S)
        release.set()
        assert [r.error_kind for r in results] == [ErrorKind.TIMEOUT] * 2
        assert "did not finish within its timeout of 60000 ms" in results[0].content


class _SlowToShip:
    """Pickling it (shipping the tool that holds it to a worker) sets ``shipping`` and
    blocks until ``gate`` is set."""

    shipping = threading.Event()
    gate = threading.Event()

    def __reduce__(self) -> tuple[Any, ...]:
        _SlowToShip.shipping.set()
        _SlowToShip.gate.wait(WAIT_S)
        return (str, ("shipped",))


def test_a_process_call_the_pool_cannot_answer_is_timeout_at_its_backstop(tmp_path: Path) -> None:
    """A process call held on its way to a worker (its tool is still being shipped, as a
    worker still starting under load holds it) is answered ``timeout`` by its backstop,
    ``BACKSTOP_S`` after its deadline (its timeout after its start bound), while it is
    still held; what the pool answers once let go is ``late``."""
    from rho_actors.results import STOPPED

    _SlowToShip.shipping.clear()
    _SlowToShip.gate.clear()
    held = _SlowToShip()
    slow = make_tool("slow", lambda args, ctx: str(held), timeout_ms=1_000)
    with ActorSystem(data_dir=tmp_path, shutdown_ms=500, start_timeout_ms=500) as system:  # backstop at 2.5 s
        recorder = Recorder()
        system.subscribe(recorder)
        system.register(slow, isolation="process")
        future = system.start_loop("s").submit_turn([ToolCall("p", "slow", "{}")])
        assert wait_for(lambda: _SlowToShip.shipping.is_set() or future.done())
        if not _SlowToShip.shipping.is_set():  # so loaded that the pool saw the deadline passed before shipping
            assert future.result(WAIT_S)[0].content.endswith("it did not start")
            return
        [result] = future.result(WAIT_S)  # without the backstop: no answer until the gate opens
        assert not _SlowToShip.gate.is_set()
        assert result.error_kind is ErrorKind.TIMEOUT
        assert result.content == f"tool 'slow' did not finish within its timeout of 1000 ms; {STOPPED}"
        _SlowToShip.gate.set()
        assert wait_for(lambda: recorder.kinds("p") == ["started", "timed_out", "late"])
