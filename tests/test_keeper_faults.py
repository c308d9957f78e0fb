"""A worker pool's background starts when something fails that they did not expect
(DESIGN §5 "Starting a worker"): the thread that waits for a new worker's ``READY``
cannot be started (``RuntimeError: can't start new thread``, the host at its thread
limit), or that wait raises. The keeper lives on and logs it, every start it counted
ends (no count of starting workers left behind), the worker nobody waits for is
stopped, and the pool keeps its spare again; a call that waited for such a start is
served once starts work again, within its start bound.

Each failure is forced once by a hook (the real thread start, the real wait, raising
where the host would); every wait is bounded by ``WAIT_S``.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pytest

from rho_actors.function_tool import tool
from rho_actors.sandbox import WorkerCall, WorkerPool
from rho_actors.sandbox.warm_workers import WarmWorkers
from rho_actors.sandbox.worker_handle import WorkerHandle
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(120)


@tool
def echo(text: str) -> str:
    """Return ``text``."""
    return text


def a_call(call_id: str, start_bound: bool = False) -> WorkerCall:
    call = WorkerCall.of(echo, {"text": call_id}, {"session_id": "s1", "call_id": call_id},
                         time.monotonic() + WAIT_S, 10_000)
    return dataclasses.replace(call, start_by=time.monotonic() + WAIT_S) if start_bound else call


@pytest.fixture
def pools() -> Iterator[list[WorkerPool]]:
    made: list[WorkerPool] = []
    yield made
    for pool in made:
        pool.stop()


def _fail_thread_start_once(monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[threading.Event, list[Any]]:
    """The next start of a thread named ``name`` raises as at the host's thread limit;
    an event set once it did, and the arguments that thread was given."""
    real_start = threading.Thread.start
    raised = threading.Event()
    given: list[Any] = []

    def start(self: threading.Thread) -> None:
        if self.name == name and not raised.is_set():
            given.extend(getattr(self, "_args", ()))
            raised.set()
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return raised, given


def _raise_once(monkeypatch: pytest.MonkeyPatch, name: str) -> threading.Event:
    """``WarmWorkers.<name>`` raises ``RuntimeError`` the first time it is called; an
    event set once it did."""
    real: Callable[..., Any] = getattr(WarmWorkers, name)
    raised = threading.Event()

    def once(self: WarmWorkers, *args: Any, **kwargs: Any) -> Any:
        if not raised.is_set():
            raised.set()
            raise RuntimeError(f"{name} failed (test)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(WarmWorkers, name, once)
    return raised


def _settled(pool: WorkerPool) -> bool:
    """No start counted as under way any more (the keeper's, or for a call)."""
    with pool._lock:
        return pool._starting == 0 and not pool._spares_starting and not +pool._starts_for_calls


def test_a_spare_whose_waiting_thread_cannot_start_is_stopped_and_the_keeper_keeps_one_again(
        monkeypatch: pytest.MonkeyPatch, pools: list[WorkerPool], logs: list[str]) -> None:
    """The keeper starts a spare, then no thread can be started to wait for its
    ``READY``: the keeper logs it, stops that worker, and starts a spare again (it
    died there, its count of starting workers left at one: the pool kept no spare
    ever again, and calls counted on a start that never came)."""
    raised, given = _fail_thread_start_once(monkeypatch, "rho-worker-ready")
    pool = WorkerPool(warm=1, codec="pickle")
    pools.append(pool)
    assert raised.wait(WAIT_S), "the keeper started no spare"
    [lost] = given
    assert isinstance(lost, WorkerHandle)
    assert pool.wait_warm(WAIT_S), "the keeper kept no spare after a thread could not be started"
    assert pool._keeper.is_alive()
    assert lost.wait_closed(WAIT_S), "the worker nobody waits for was not stopped"
    assert lost.pid not in pool.pids()
    assert wait_for(lambda: _settled(pool)), "a start stayed counted"
    assert pool.run_call(a_call("after", start_bound=True)).content == "after"
    assert any(f"no thread could be started to wait for worker {lost.pid}" in line for line in logs), logs


def test_a_spare_whose_ready_wait_raises_is_stopped_and_replaced(
        monkeypatch: pytest.MonkeyPatch, pools: list[WorkerPool], logs: list[str]) -> None:
    """The wait for a spare's ``READY`` raises what it does not expect: the worker is
    stopped and another started (it stayed counted among the pool's workers, neither
    idle nor busy: with ``warm=1`` no spare was ever started again)."""
    raised = _raise_once(monkeypatch, "_await_ready")
    pool = WorkerPool(warm=1, codec="pickle")
    pools.append(pool)
    assert raised.wait(WAIT_S), "the keeper started no spare"
    assert pool.wait_warm(WAIT_S), "the worker whose ready wait raised was never replaced"
    assert wait_for(lambda: _settled(pool) and len(pool.pids()) == 1), pool.pids()
    assert pool.run_call(a_call("after")).content == "after"
    assert any("making worker" in line and "ready failed" in line for line in logs), logs


def test_a_start_for_a_call_whose_ready_wait_raises_ends_and_the_call_is_served(
        monkeypatch: pytest.MonkeyPatch, pools: list[WorkerPool], logs: list[str]) -> None:
    """A call with a start bound, no worker idle: the worker started for it in the
    background fails unexpectedly as it is made ready. That start ends (counted no
    more), the call starts another and is served (it waited out its whole start bound
    for a start that never ended, and was ``unavailable``)."""
    raised = _raise_once(monkeypatch, "_await_ready")
    pool = WorkerPool(warm=0, codec="pickle")
    pools.append(pool)
    result = pool.run_call(a_call("served", start_bound=True))
    assert raised.is_set()
    assert result.ok and result.content == "served", result
    assert wait_for(lambda: _settled(pool)), "a start stayed counted"
    assert any("ready failed" in line for line in logs), logs


def test_a_start_for_a_call_whose_thread_cannot_start_is_unavailable_at_once_and_counts_nothing(
        monkeypatch: pytest.MonkeyPatch, pools: list[WorkerPool]) -> None:
    """No thread can be started for a call's background start (the host at its thread
    limit): the call is answered at once, ``unavailable`` (it did not run; it was
    ``crashed``, as a worker that failed to start), naming why; nothing stays counted,
    and the next call is served."""
    raised, _ = _fail_thread_start_once(monkeypatch, "rho-worker-start")
    pool = WorkerPool(warm=0, codec="pickle")
    pools.append(pool)
    result = pool.run_call(a_call("first", start_bound=True))
    assert raised.is_set()
    assert result.error_kind == ErrorKind.UNAVAILABLE, result
    assert "no thread could be started for its worker's start" in result.content, result
    assert "can't start new thread" in result.content, result
    assert _settled(pool)
    assert pool.run_call(a_call("after", start_bound=True)).content == "after"


def test_a_keeper_whose_starts_fail_in_a_row_backs_off_and_logs_each_doubling_only(
        monkeypatch: pytest.MonkeyPatch, pools: list[WorkerPool], logs: list[str]) -> None:
    """A crash storm: no thread can be started to wait for a spare's ``READY``, 8 times
    in a row (the host at its thread limit). The keeper logs the 1st, 2nd, 4th and 8th
    (it logged a traceback each, every 0.5 s, for ever), its pause doubling between them
    (here from 1 ms, so the test is fast); once a start works, it says so once and the
    pool keeps its spare."""
    real_start = threading.Thread.start
    failed: list[int] = []

    def start(self: threading.Thread) -> None:
        if self.name == "rho-worker-ready" and len(failed) < 8:
            failed.append(1)
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    pool = WorkerPool(warm=1, codec="pickle")
    pools.append(pool)
    run = pool._failed_starts
    run.first_s, run.max_s = 0.001, 0.016  # (a pause already begun ends as it was: 0.5 s at most)
    assert pool.wait_warm(WAIT_S), "the keeper kept no spare once threads could be started again"
    assert len(failed) == 8
    told = [line for line in logs if "no thread could be started to wait for worker" in line]
    assert len(told) == 4, told
    assert [line.rpartition("(")[2] for line in told[1:]] == [
        f"{n} failures in a row; the next logged at {2 * n})" for n in (2, 4, 8)]
    assert wait_for(lambda: any("a round passed again after 8 failures in a row" in line for line in logs)), logs
    assert wait_for(lambda: _settled(pool)) and run.count == 0


def test_a_failure_run_doubles_its_pause_up_to_its_bound_and_logs_powers_of_two() -> None:
    from rho_actors.otp.failure_runs import FailureRun

    run = FailureRun("a loop", first_s=0.5, max_s=30.0)
    got = [run.failed() for _ in range(9)]
    assert [pause for _, pause in got] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert [n for n, _ in got if FailureRun.logged(n)] == [1, 2, 4, 8]
    assert run.passed() == 9 and run.count == 0 and run.failed() == (1, 0.5)
