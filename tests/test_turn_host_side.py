"""A turn is prepared and started in the caller's thread, against a snapshot of the
loop's tool set and withheld names; the LoopActor owns the end (its stop or crash
answers every open call, and refuses new turns), and the handle follows its restart.
Every call id gets exactly one result, also when turns race the loop's stop."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import ActorSystem, CallEvent, CancelToken, ToolCall, tool
from rho_actors.loop.messages import loop_name
from rho_actors.otp.actor import kill
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(60)

RELEASE = threading.Event()


@tool
def where() -> int:
    """The thread running this call."""
    return threading.get_ident()


@tool(timeout_ms=int(WAIT_S * 1000))
def held(ctx: Mapping[str, Any]) -> str:
    """Wait until released or cancelled."""
    while not RELEASE.is_set():
        if ctx["cancel"].wait(0.01):
            return "cancelled"
    return "released"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    RELEASE.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        for t in (where, held, add):
            system.register(t)
        yield system
    finally:
        RELEASE.set()
        system.stop()


def test_a_refused_turn_is_answered_in_the_callers_thread_before_submit_turn_returns(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    future = loop.submit_turn([
        ToolCall("c1", "nope", "{}"),
        ToolCall("c2", "add", '{"a": 1}'),
        ToolCall("c3", "add", '{"a": 1, "b": 2'),
    ])
    assert future.done()  # decoded, looked up and validated here: no other thread was needed
    unknown, invalid, bad_json = future.result(0)
    assert unknown.error_kind == ErrorKind.UNKNOWN_TOOL and "add" in unknown.content
    assert invalid.error_kind == ErrorKind.INVALID_ARGUMENTS and '$: "b" is a required property' in invalid.content
    assert bad_json.error_kind == ErrorKind.INVALID_JSON


def test_a_call_runs_on_another_thread_than_the_caller(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    [result] = loop.run_turn([ToolCall("c1", "where", "{}")], timeout_s=WAIT_S)
    assert result.ok and int(result.content) != threading.get_ident()  # the deadline needs a thread of its own


def test_withheld_names_and_new_tools_apply_from_the_next_turn(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    loop.set_withheld(["add"])
    assert [i.name for i in loop.offered()] == ["where", "held"]
    [refused] = loop.run_turn([ToolCall("c1", "add", '{"a": 1, "b": 2}')], timeout_s=WAIT_S)
    assert refused.error_kind == ErrorKind.WITHHELD
    loop.set_withheld([])
    [ok] = loop.run_turn([ToolCall("c2", "add", '{"a": 1, "b": 2}')], timeout_s=WAIT_S)
    assert ok.ok and ok.content == "3"
    system.unregister("add")
    assert [i.name for i in loop.offered()] == ["where", "held"]
    [gone] = loop.run_turn([ToolCall("c3", "add", '{"a": 1, "b": 2}')], timeout_s=WAIT_S)
    assert gone.error_kind == ErrorKind.UNAVAILABLE


def test_offered_hands_out_copies(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    first = loop.offered()
    first[0].parameter_schema["properties"]["mutated"] = {"type": "string"}
    assert "mutated" not in loop.offered()[0].parameter_schema["properties"]


def test_a_crash_of_the_loop_answers_its_open_calls_and_the_handle_follows_the_restart(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    future = loop.submit_turn([ToolCall("c1", "held", "{}")])
    assert wait_for(lambda: len(loop.running()) == 1)
    before = loop.ref
    kill(before)
    [crashed] = future.result(WAIT_S)
    assert crashed.error_kind == ErrorKind.CRASHED and "loop crashed" in crashed.content
    assert wait_for(lambda: system.whereis(loop_name("s")) not in (None, before))
    [result] = loop.run_turn([ToolCall("c2", "add", '{"a": 2, "b": 3}')], timeout_s=WAIT_S)
    assert result.ok and result.content == "5"


def test_a_stopped_loop_refuses_new_turns_naming_why(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    loop.stop()
    with pytest.raises(pykka.ActorDeadError, match="the loop of session 's' is not running: it was stopped"):
        loop.submit_turn([ToolCall("c1", "where", "{}")])


def test_turns_racing_the_loops_stop_get_exactly_one_result_per_call(system: ActorSystem) -> None:
    events: list[CallEvent] = []
    system.subscribe(lambda e: events.append(e) if isinstance(e, CallEvent) else None)
    loop = system.start_loop("race")
    futures: list[tuple[list[str], concurrent.futures.Future[Any]]] = []
    refused = []
    lock = threading.Lock()
    go = threading.Event()

    def submit(worker: int) -> None:
        go.wait(WAIT_S)
        for n in range(40):
            ids = [f"w{worker}-t{n}-c{i}" for i in range(3)]
            try:
                future = loop.submit_turn([ToolCall(ids[0], "where", "{}"), ToolCall(ids[1], "held", "{}"),
                                           ToolCall(ids[2], "add", '{"a": 1, "b": 1}')])
            except pykka.ActorDeadError as exc:
                with lock:
                    refused.append(exc)
                continue
            with lock:
                futures.append((ids, future))

    threads = [threading.Thread(target=submit, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    go.set()
    assert wait_for(lambda: len(futures) >= 8)
    loop.stop()
    for t in threads:
        t.join(WAIT_S)
    assert futures and all(not t.is_alive() for t in threads)
    for ids, future in futures:
        results = future.result(WAIT_S)
        assert [r.call_id for r in results] == ids  # one result per call id, in order
        for r in results:  # done before the stop, or answered by it (running, or not admitted)
            assert r.ok or (r.error_kind == ErrorKind.CANCELLED and "the session stopped before" in r.content)
        assert not results[1].ok  # the held call never finishes on its own
    assert all("is not running" in str(exc) for exc in refused)
    settled = [(e.call_id, e.kind) for e in events if e.kind in ("finished", "timed_out")]
    assert len(settled) == len(set(settled))  # no call settled twice


def test_run_turn_past_its_wait_raises_and_the_turn_still_ends(system: ActorSystem) -> None:
    """``run_turn(timeout_s=...)`` bounds the caller's wait: past it, ``TimeoutError``
    naming the bound (the call goes on, and gets its one result); a negative bound does
    not wait, an absurdly large one is clamped rather than overflowing."""
    loop = system.start_loop("s")
    with pytest.raises(TimeoutError, match=r"did not finish within 0.05 s"):
        loop.run_turn([ToolCall("c1", "held", "{}")], timeout_s=0.05)
    with pytest.raises(TimeoutError, match=r"did not finish within -1 s"):
        loop.run_turn([ToolCall("c2", "held", "{}")], timeout_s=-1)
    RELEASE.set()
    [ok] = loop.run_turn([ToolCall("c3", "add", '{"a": 1, "b": 2}')], timeout_s=1e300)
    assert ok.ok and ok.content == "3"
    assert wait_for(lambda: not loop.running())  # the held calls end once released


def test_on_result_gets_the_result_of_a_started_call_the_host_cancels(system: ActorSystem) -> None:
    """``submit_turn``'s promise: ``on_result`` is called with each started call's result,
    the ``cancelled`` answer of a running call the host's cancel ended included."""
    told: list[tuple[int, str]] = []
    cancel = CancelToken()
    future = system.start_loop("told").submit_turn(
        [ToolCall("a", "add", '{"a": 1, "b": 2}'), ToolCall("h", "held", "{}")], cancel=cancel,
        on_result=lambda i, r: told.append((i, str(r.error_kind))))
    assert wait_for(lambda: len(told) == 1)  # the addition answered; the held call runs
    cancel.cancel("enough")
    results = future.result(WAIT_S)
    assert [str(r.error_kind) for r in results] == ["None", "cancelled"]
    assert sorted(told) == [(0, "None"), (1, "cancelled")]


class _NoThreadFor:
    """A thread pool whose start of a thread for the call named ``name`` fails, as at
    the host's thread limit (``RuntimeError: can't start new thread``)."""

    def __init__(self, real: Any, name: str) -> None:
        self._real, self._name = real, name

    def submit(self, job: Any, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        call = getattr(job, "spec", None) or getattr(job, "args", (None,))[0]  # a thread call is its own job
        if getattr(call, "name", None) == self._name:
            raise RuntimeError("can't start new thread")
        self._real.submit(job, name, may_take_over=may_take_over, alone=alone)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._real, attr)


def test_a_call_no_thread_could_be_started_for_is_not_started_and_the_turn_goes_on(system: ActorSystem) -> None:
    """At the host's thread limit a call whose thread cannot start is answered
    ``not_started`` alone: the turn's other calls run, its deadline timer is disarmed and
    no abandoned thread is counted for it (it never ran), so the tool stays available."""
    isolation: Any = system._runtime.isolations["thread"]
    real = isolation._pool
    loop = system.start_loop("limit")
    isolation._pool = _NoThreadFor(real, "where")
    try:
        results = loop.run_turn([ToolCall("a", "add", '{"a": 1, "b": 2}'), ToolCall("w", "where", "{}")])
    finally:
        isolation._pool = real
    assert results[0].ok and results[0].content == "3", results[0].content
    assert results[1].error_kind is ErrorKind.CANCELLED and "no thread could be started" in str(results[1].content)
    assert isolation.running_calls() == 0 and system.stats()["abandoned_threads_running"] == 0
    [again] = loop.run_turn([ToolCall("w2", "where", "{}")])
    assert again.ok, again.content


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"timeout_s": "1"}, "timeout_s must be a number of seconds or None, got '1'"),
    ({"timeout_s": True}, "timeout_s must be a number of seconds or None, got True"),
    ({"cancel": object()}, "cancel must be a rho_actors.CancelToken or None, got object"),
    ({"background": 0}, "background must be a bool or call ids"),
    ({"background": "c1"}, "background must be a bool or call ids"),
])
def test_run_turn_refuses_a_bad_argument_before_any_call_starts(
    system: ActorSystem, kwargs: dict[str, Any], message: str
) -> None:
    """The defaults are taken as they are; anything else is checked, and a bad value is a
    ``TypeError`` naming it, with no call of the turn run."""
    system.register(where)
    loop = system.start_loop("s1")
    events: list[CallEvent] = []
    system.subscribe(lambda e: events.append(e) if isinstance(e, CallEvent) else None)
    with pytest.raises(TypeError, match=message):
        loop.run_turn([ToolCall("c1", "where", "{}")], **kwargs)
    assert events == []
    [result] = loop.run_turn([ToolCall("c2", "where", "{}")], timeout_s=WAIT_S, cancel=None, background=False)
    assert result.ok and result.content != str(threading.get_ident())  # never on the host's thread
