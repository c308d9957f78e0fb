"""The system's stop keeps its promise that no worker process outlives it when its tree
does not stop within ``timeout_s`` (``0``, or a source slow to stop before the workers'
actor), and when several threads stop the system at once: a stop that returned early
left the workers, and the call they ran, to the tree still stopping behind it.

A source whose ``halt()`` waits for the test holds the tree's stop where a slow one would
(a trusted plugin import that cannot be interrupted: up to its ``shutdown`` bound); every
wait is bounded by ``WAIT_S``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from rho_actors import ActorSystem, CallEvent, ToolCall
from rho_actors.function_tool import tool
from rho_actors.sources.source_actor import add_source
from rho_actors.system.stopping import StopOnce

from .conftest import WAIT_S, Recorder, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(3 * WAIT_S)


@tool(timeout_ms=600_000)  # the stop ends its call, never its deadline (30 s by default: passed under load)
def nap(seconds: float) -> str:
    """Sleep ``seconds``."""
    time.sleep(seconds)
    return "rested"


class SlowToHalt:
    """A source with no tools whose ``halt()`` (its actor stopping) waits for ``release``."""

    name = "slow-to-halt"

    def __init__(self) -> None:
        self.halting = threading.Event()
        self.release = threading.Event()

    def scan(self) -> dict[str, Any]:
        return {}

    def halt(self) -> None:
        self.halting.set()
        self.release.wait(WAIT_S)


class InterruptingHalt(SlowToHalt):
    """Its ``halt()`` has the main thread interrupted (``SIGUSR1``, whose handler raises
    ``KeyboardInterrupt`` there: a Ctrl-C during the system's stop), then waits."""

    name = "interrupting"

    def halt(self) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        super().halt()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def napping(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[ActorSystem, Recorder, list[Any],
                                                                            tuple[int, ...]]]:
    """A system whose one worker process runs a call ``c1`` (a long nap), its events,
    the turn's results once it ended, and the pids of the workers then (the call's among
    them; under load a slow start may have a second one started beside it). Its
    ``shutdown_ms`` is 2 s, or the test's indirect parameter."""
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=getattr(request, "param", 2_000))
    events = Recorder()
    system.subscribe(events, only=(CallEvent,))
    system.register(nap, isolation="process")
    loop = system.start_loop("s1")
    results: list[Any] = []
    turn = threading.Thread(target=lambda: results.append(
        loop.run_turn([ToolCall("c1", "nap", '{"seconds": 600}')], timeout_s=4 * WAIT_S)), daemon=True)
    turn.start()
    assert wait_for(lambda: "started" in events.kinds("c1") and bool(system.worker_pids()))
    pids = tuple(system.worker_pids())
    try:
        yield system, events, results, pids
    finally:
        system.stop()
        turn.join(WAIT_S)


@pytest.mark.parametrize("timeout_s", [0.0, 0.01])
def test_a_stop_past_its_timeout_still_kills_the_workers(
        napping: tuple[ActorSystem, Recorder, list[Any], tuple[int, ...]], timeout_s: float) -> None:
    """``stop(timeout_s=0)`` returns before its tree has stopped; the worker process (a
    call still running in it) is gone all the same, and the call gets its one result."""
    system, events, results, pids = napping
    system.stop(timeout_s=timeout_s)
    assert not any(map(alive, pids)), "a worker process outlived the system's stop"
    assert wait_for(lambda: bool(results))
    [result] = results[0]
    assert result.call_id == "c1" and not result.ok, result
    assert wait_for(lambda: events.kinds("c1").count("finished") == 1), events.kinds("c1")


def test_a_source_slow_to_stop_holds_back_no_workers_past_the_stops_timeout(
        napping: tuple[ActorSystem, Recorder, list[Any], tuple[int, ...]]) -> None:
    """A source stopping slowly (its actor stops before the workers' one) holds the tree
    past ``timeout_s``: the stop returns then, its workers killed."""
    system, _events, results, pids = napping
    slow = SlowToHalt()
    add_source(system, slow, trusted=True, poll_s=None)
    try:
        system.stop(timeout_s=0.2)
        assert slow.halting.is_set()
        assert not any(map(alive, pids)), "a worker process outlived the system's stop"
    finally:
        slow.release.set()
    assert wait_for(lambda: bool(results))


def test_a_stop_called_while_another_runs_returns_once_that_one_has(
        napping: tuple[ActorSystem, Recorder, list[Any], tuple[int, ...]]) -> None:
    """Two threads stop the system at once: the second returns only once the first
    did, the worker gone (it returned at once before, the tree still stopping)."""
    system, _events, results, pids = napping
    slow = SlowToHalt()
    add_source(system, slow, trusted=True, poll_s=None)
    first = threading.Thread(target=system.stop, daemon=True)
    first.start()
    assert slow.halting.wait(WAIT_S)
    seen: list[bool] = []

    def second_stop() -> None:
        system.stop()
        seen.append(any(map(alive, pids)))
        slow.release.set()  # (it returned early: the first goes on)

    second = threading.Thread(target=second_stop, daemon=True)
    second.start()
    assert wait_for(lambda: bool(seen) or waits_in_stop_once(second))
    slow.release.set()
    second.join(WAIT_S)
    first.join(WAIT_S)
    assert seen == [False], "a second stop returned while a worker was alive"
    assert not first.is_alive() and not second.is_alive()
    assert wait_for(lambda: bool(results))


def waits_in_stop_once(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside :meth:`StopOnce.run` (waiting for the stop that runs)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code is StopOnce.run.__code__:
            return True
        frame = frame.f_back
    return False


def test_a_stop_called_again_inside_itself_runs_at_once() -> None:
    """A host's signal handler calling ``stop()`` while the main thread is in its own:
    the inner stop runs (it waited for itself for ever with a plain lock)."""
    once, ran = StopOnce(), []
    done = threading.Event()

    def outer() -> None:
        once.run(lambda: ran.append("inner"))
        ran.append("outer")

    def stop_twice() -> None:
        once.run(outer)
        done.set()

    threading.Thread(target=stop_twice, daemon=True).start()
    assert done.wait(WAIT_S), "a stop inside a stop waited for itself"
    assert ran == ["inner", "outer"]
    once.run(lambda: ran.append("again"))
    assert ran == ["inner", "outer"]  # once one ended, a no-op


def interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


# The source's shutdown bound (shutdown_ms + 1 s) as long as its halt's wait: the tree cannot
# end by that bound while the test looks (at 2 s it did, under load, before the second stop).
@pytest.mark.parametrize("napping", [int(WAIT_S * 1000)], indirect=True)
def test_a_stop_interrupted_kills_the_workers_and_the_next_stop_waits_for_the_tree(
        napping: tuple[ActorSystem, Recorder, list[Any], tuple[int, ...]]) -> None:
    """Ctrl-C while the stop waits for its tree: the workers are killed before the
    interrupt is raised, and the next stop waits for the tree's end (it returned at
    once, the tree's actors still stopping)."""
    assert threading.current_thread() is threading.main_thread()
    system, _events, results, pids = napping
    slow = InterruptingHalt()
    add_source(system, slow, trusted=True, poll_s=None)
    before = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            system.stop()
        assert not any(map(alive, pids)), "a worker process outlived the interrupted stop"
    finally:
        signal.signal(signal.SIGUSR1, before)
    try:
        assert slow.halting.is_set() and not system._stop_once.root_ended.is_set()
        slow.release.set()
        system.stop()
        assert system._stop_once.root_ended.is_set(), "the second stop returned before the tree ended"
        assert system.stopped
    finally:
        slow.release.set()
    assert wait_for(lambda: bool(results))
