"""The per-call path below the turn keeps its guarantees where PROFILE §38 cut it: a
host's task factory still makes an inline call's task; the running count of call threads
(kept without a lock) is right under calls from several threads and a stop still waits
for a running call; a call thread is named for its call and for the pool when idle; an
answer's late results (their list made by the first) each reach ``reply`` once; a
token finished without an owner is no longer running for a later cancel."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken, ToolCall, tool
from rho_actors.isolation.call import Answer, CallSpec
from rho_actors.isolation.thread import on_call_thread
from rho_actors.results import failure
from rho_actors.tool import ToolResult

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(60)

ENTERED = threading.Event()
RELEASE = threading.Event()


@tool
async def whose_task() -> int:
    """The id of the task running this call's first step."""
    return id(asyncio.current_task())


@tool
def where() -> list[Any]:
    """Whether this runs on a call thread, that thread's name, and its id."""
    return [on_call_thread(), threading.current_thread().name, threading.get_ident()]


@tool(timeout_ms=int(WAIT_S * 1000))
def stubborn() -> str:
    """Wait until released, whatever cancels it."""
    ENTERED.set()
    return "released" if RELEASE.wait(WAIT_S) else "not released"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    ENTERED.clear()
    RELEASE.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=int(WAIT_S * 1000))
    try:
        for t in (whose_task, where, stubborn):
            system.register(t)
        yield system
    finally:
        RELEASE.set()
        system.stop()


def _thread_isolation(system: ActorSystem) -> Any:
    return system._runtime.isolations["thread"]


def test_a_hosts_task_factory_makes_the_inline_calls_task(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    made: list[int] = []

    def factory(aio: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=aio, **kwargs)
        made.append(id(task))
        return task

    async def main() -> list[ToolResult]:
        asyncio.get_running_loop().set_task_factory(factory)  # type: ignore[arg-type]
        made.clear()  # main's own task was made before
        return await loop.arun_turn([ToolCall("c1", "whose_task", "{}")])

    [result] = asyncio.run(main())
    assert result.ok, result.content
    assert made and int(result.content) == made[0]  # the call's first step ran as the factory's task


def test_the_running_count_is_right_after_calls_from_many_threads(system: ActorSystem) -> None:
    loops = [system.start_loop(f"s{i}") for i in range(4)]
    isolation = _thread_isolation(system)

    def calls(i: int) -> bool:
        return all(loops[i].run_turn([ToolCall(f"c{n}", "where", "{}")])[0].ok for n in range(200))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(calls, range(4)))
    assert wait_for(lambda: isolation.running_calls() == 0)


def test_the_stop_waits_for_a_running_thread_call_counted_without_a_lock(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    isolation = _thread_isolation(system)
    future = loop.submit_turn([ToolCall("c1", "stubborn", "{}")])
    assert ENTERED.wait(WAIT_S)
    assert isolation.running_calls() == 1
    stopped = threading.Event()

    def stop() -> None:
        system.stop()
        stopped.set()

    threading.Thread(target=stop, daemon=True).start()
    assert wait_for(lambda: isolation._draining)  # the stop waits for the running call now
    assert not stopped.is_set()
    RELEASE.set()
    assert stopped.wait(WAIT_S)
    assert isolation.running_calls() == 0
    assert future.result(WAIT_S)[0].call_id == "c1"  # answered (cancelled by the stop)


def test_a_call_thread_is_named_for_its_call_and_for_the_pool_when_idle(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    [result] = loop.run_turn([ToolCall("c1", "where", "{}")])
    on_call, name, ident = json.loads(result.content)
    assert result.ok and on_call and name == "rho_actors-call", result
    pool = _thread_isolation(system)._pool
    assert wait_for(lambda: pool.idle() >= 1)
    # the call's thread goes back to the pool's name as it goes idle (it is counted idle just before; the
    # system's other jobs may take it meanwhile, each under a name of its own; other tests' abandoned call
    # threads in this process keep theirs: only this one is looked at; ended, idle too long, it is fine)
    assert wait_for(lambda: next((t.name for t in threading.enumerate() if t.ident == ident), pool.name) == pool.name)
    assert not on_call_thread()


def _spec(replies: list[ToolResult], deadline_s: float = WAIT_S) -> CallSpec:
    now = time.monotonic()
    return CallSpec("c1", "t", None, {}, {}, now, now + deadline_s, int(deadline_s * 1000), CancelToken(), 1000,
                    replies.append)


def test_late_results_from_two_threads_each_reach_reply_once() -> None:
    for _ in range(200):
        replies: list[ToolResult] = []
        answer = Answer(_spec(replies))
        first, late_a, late_b = (failure("raised_opaque", f"c{i}", "t", 0.0) for i in range(3))
        assert answer.settle(first)
        barrier = threading.Barrier(2)
        won: list[bool] = []

        def late(answer: Answer, barrier: threading.Barrier, won: list[bool], result: ToolResult) -> None:
            barrier.wait(WAIT_S)
            won.append(answer.settle(result))

        threads = [threading.Thread(target=late, args=(answer, barrier, won, r)) for r in (late_a, late_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert won == [False, False]
        assert replies[0] is first
        assert sorted(r.call_id for r in replies[1:]) == ["c1", "c2"]


def test_a_late_result_before_the_answers_delivery_follows_it() -> None:
    replies: list[ToolResult] = []
    answer = Answer(_spec(replies))
    assert answer.claim()  # a deadline took the slot; its timeout is not delivered yet
    result = failure("raised_opaque", "c1", "t", 0.0)
    assert not answer.settle(result)
    assert replies == []  # held until the delivery
    answer.deliver(answer.timeout())
    assert [r.error_kind for r in replies] == [answer.timeout().error_kind, result.error_kind]


def test_a_token_finished_without_an_owner_is_not_running_for_a_later_cancel() -> None:
    token = CancelToken()
    assert token.finish() is None
    assert token.cancel("late") is False  # set, but the call had ended
    assert token.cancelled and token.reason == "late"
    running = CancelToken()
    assert running.cancel("now") is True
    assert running.finish() is None
    owned = CancelToken()
    assert owned.abandon("timeout", "iso") is True
    assert owned.finish() is None and owned.finish("iso") == "timeout"
