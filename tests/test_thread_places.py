"""The governor's places a ``thread`` call of a tool without a policy holds (its place
among the system's thread calls and, for an ``exclusive`` tool, its session's exclusive
place) ride on its spec and are given back by whoever answers it (PROFILE §46): its call
thread, its deadline, a refusal at its start, or the governor when it did not start.
Every path leaves none held, and the session's next exclusive call finds its place free."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken, ToolCall, tool
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, wait_for

GATE = threading.Event()
STARTED = threading.Event()


@tool(concurrency="exclusive", timeout_ms=100)
def hangs() -> str:
    """Wait for the test's gate (past its deadline)."""
    STARTED.set()
    GATE.wait(WAIT_S)
    return "late"


@tool(concurrency="exclusive", timeout_ms=int(WAIT_S * 1000))
def waits() -> str:
    """Wait for the test's gate (within its deadline)."""
    STARTED.set()
    GATE.wait(WAIT_S)
    return "released"


@tool(concurrency="exclusive")
def step(i: int) -> int:
    """Return ``i``."""
    return i


@tool
def shared(i: int) -> int:
    """Return ``i`` (a tool of no concurrency of its own)."""
    return i


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    GATE.clear()
    STARTED.clear()
    system = ActorSystem(tmp_path, abandoned_threads_per_tool=1, shutdown_ms=1_000)
    for one in (hangs, waits, step, shared):
        system.register(one)
    try:
        yield system
    finally:
        GATE.set()
        system.stop()


def _places_held(system: ActorSystem) -> int:
    return int(system.stats()["governor"]["thread_calls_running"])


def _steps(prefix: str, n: int) -> list[ToolCall]:
    return [ToolCall(f"{prefix}{i}", "step", f'{{"i": {i}}}') for i in range(n)]


def test_an_exclusive_turns_calls_give_their_places_back_one_after_another(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    results = loop.run_turn([*_steps("a", 5), ToolCall("b", "shared", '{"i": 9}')], timeout_s=WAIT_S)
    assert [r.content for r in results] == ["0", "1", "2", "3", "4", "9"], results
    assert _places_held(system) == 0


def test_a_call_answered_by_its_deadline_gives_its_places_back_and_the_turn_goes_on(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    results = loop.run_turn([ToolCall("h", "hangs", "{}"), *_steps("a", 2)], timeout_s=WAIT_S)
    assert results[0].error_kind is ErrorKind.TIMEOUT, results[0]
    assert [r.content for r in results[1:]] == ["0", "1"], results
    assert _places_held(system) == 0  # its thread still runs (abandoned, counted there), its places are free
    assert system.stats()["abandoned_threads_running"] == 1
    # past the cap of abandoned threads, the tool's next call is refused at its start: places given back too
    [refused] = loop.run_turn([ToolCall("h2", "hangs", "{}")], timeout_s=WAIT_S)
    assert refused.error_kind is ErrorKind.UNAVAILABLE and "timed out" in refused.content, refused
    assert _places_held(system) == 0
    assert [r.content for r in loop.run_turn(_steps("c", 2), timeout_s=WAIT_S)] == ["0", "1"]
    GATE.set()
    assert wait_for(lambda: system.stats()["abandoned_threads_running"] == 0)


def test_a_cancelled_calls_places_are_given_back_by_its_answer(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    cancel = CancelToken()
    future = loop.submit_turn([ToolCall("w", "waits", "{}"), *_steps("a", 2)], cancel=cancel)
    assert STARTED.wait(WAIT_S)
    assert _places_held(system) == 1
    cancel.cancel("host")
    results = future.result(WAIT_S)
    assert all(r.error_kind is ErrorKind.CANCELLED for r in results), results
    GATE.set()  # the abandoned call returns: its answer (late) gives the places back
    assert wait_for(lambda: _places_held(system) == 0)
    assert [r.content for r in loop.run_turn(_steps("b", 2), timeout_s=WAIT_S)] == ["0", "1"]


class _NoThreadFor:
    """The system's pool, but no thread can be started for calls of tool ``name``."""

    def __init__(self, real: Any, name: str) -> None:
        self._real, self._name = real, name

    def submit(self, job: Any, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        if getattr(getattr(job, "spec", None), "name", None) == self._name:
            raise RuntimeError("can't start new thread")
        self._real.submit(job, name, may_take_over=may_take_over, alone=alone)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._real, attr)


def test_a_call_that_could_not_start_has_its_places_given_back_by_the_governor(system: ActorSystem) -> None:
    isolation: Any = system._runtime.isolations["thread"]
    real = isolation._pool
    loop = system.start_loop("s")
    isolation._pool = _NoThreadFor(real, "shared")
    try:
        results = loop.run_turn([*_steps("a", 2), ToolCall("x", "shared", '{"i": 1}'), *_steps("b", 2)],
                                timeout_s=WAIT_S)
    finally:
        isolation._pool = real
    assert [r.content for r in results[:2] + results[3:]] == ["0", "1", "0", "1"], results
    assert results[2].error_kind is ErrorKind.CANCELLED and "no thread could be started" in results[2].content
    assert _places_held(system) == 0
    assert [r.content for r in loop.run_turn(_steps("c", 3), timeout_s=WAIT_S)] == ["0", "1", "2"]
