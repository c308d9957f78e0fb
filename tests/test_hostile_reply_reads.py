"""A careless host against the reply its ``run_turn`` thread reads itself (DESIGN §5 "A
call's path"): a bad ``timeout_s`` and a signal handler raising in that thread at any
point of its read still give the call exactly one result, and leave its worker and its
place under the caps to the next call. The system has room for one worker only, so a
call left held by a thread that stopped reading would keep the next call from running.

Every wait is bounded; the interrupt is a real signal raised in the main thread at a
chosen point (a trace function names the point, the signal's handler raises there).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import cloudpickle
import pytest

from rho_actors import ActorSystem, CallEvent, ToolCall
from rho_actors.function_tool import tool

from .conftest import WAIT_S, Recorder, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(180)


@tool
def echo(text: str) -> str:
    """Return ``text``."""
    return text


@tool(timeout_ms=600_000)
def nap(seconds: float) -> str:
    """Sleep ``seconds``."""
    time.sleep(seconds)
    return "woke"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    s = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=5_000, warm_workers=1, max_workers=1,
                    max_running_workers=1)
    try:
        for each in (echo, nap):
            s.register(each, isolation="process")
        yield s
    finally:
        s.stop()


def one(name: str, call_id: str, **args: Any) -> list[ToolCall]:
    return [ToolCall(call_id, name, json.dumps(args))]


def warmed(system: ActorSystem) -> Any:
    loop = system.start_loop("s1")
    [first] = loop.run_turn(one("echo", "warm", text="warm"), timeout_s=WAIT_S)
    assert first.ok, first.content
    return loop


def finished_once(events: Recorder, call_id: str) -> bool:
    return wait_for(lambda: "finished" in events.kinds(call_id)) and events.kinds(call_id).count("finished") == 1


def test_a_timeout_that_is_not_a_number_is_refused_before_the_turn_starts(system: ActorSystem) -> None:
    loop = warmed(system)
    events = Recorder()
    system.subscribe(events, only=(CallEvent,))
    with pytest.raises(TypeError, match="timeout_s"):
        loop.run_turn(one("nap", "bad", seconds=0), timeout_s="5")
    assert events.kinds("bad") == []  # nothing started...
    [after] = loop.run_turn(one("echo", "after", text="after"), timeout_s=WAIT_S)
    assert after.content == "after"  # ...and its worker is the next call's


def interrupted_in(code_name: str) -> Callable[[FrameType, str, Any], Any]:
    """A trace function raising ``SIGUSR1`` in this thread when a function named
    ``code_name`` is entered (once): its handler raises ``KeyboardInterrupt`` there."""
    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == code_name:
            sys.settrace(None)
            signal.raise_signal(signal.SIGUSR1)
        return None
    return trace


def interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGUSR1")


@pytest.mark.parametrize("point", [
    "_open_on",  # an idle worker and a place under the caps are taken: the call is no one's yet
    "serve",  # the turn is started and its call held: the thread has not begun to read
    "_on_frame",  # the reply's frame is out of the pipe: the thread is looking at it
    "_replied",  # the reply is read: the thread is taking its result
])
def test_a_caller_interrupted_while_it_reads_its_calls_reply_leaves_the_call_one_result(
        system: ActorSystem, point: str) -> None:
    assert threading.current_thread() is threading.main_thread()
    loop = warmed(system)
    events = Recorder()
    system.subscribe(events, only=(CallEvent,))
    before = signal.signal(signal.SIGUSR1, interrupt)
    try:
        sys.settrace(interrupted_in(point))
        with pytest.raises(KeyboardInterrupt):
            loop.run_turn(one("nap", "cut", seconds=0.2), timeout_s=WAIT_S)
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGUSR1, before)
    assert finished_once(events, "cut"), events.kinds("cut")
    [after] = loop.run_turn(one("echo", "after", text="after"), timeout_s=WAIT_S)
    assert after.content == "after", after  # its worker and its place under the caps are free


def test_a_caller_that_stops_waiting_with_its_call_half_written_leaves_the_rest_to_the_reader(
        system: ActorSystem) -> None:
    """The pipe takes only part of a big call while its worker is stopped (``SIGSTOP``);
    ``run_turn``'s own bound passes first: the reader writes the rest once the worker
    reads again, and the call gets its one result, its tool's."""
    loop = warmed(system)
    events = Recorder()
    system.subscribe(events, only=(CallEvent,))
    [pid] = system.worker_pids()
    text = "x" * 900_000  # within the arguments bound, more than a pipe takes at once
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(TimeoutError):
            loop.run_turn(one("echo", "big", text=text), timeout_s=0.3)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert finished_once(events, "big"), events.kinds("big")
    [finished] = [e for e in events.events if e.call_id == "big" and e.kind == "finished"]
    assert finished.outcome == "ok", finished
    [after] = loop.run_turn(one("echo", "after", text="after"), timeout_s=WAIT_S)
    assert after.content == "after"


def interrupted_after(code_name: str) -> Callable[[FrameType, str, Any], Any]:
    """A trace function raising ``SIGUSR1`` in this thread when a function named
    ``code_name`` returns (once): its handler raises ``KeyboardInterrupt`` at the next
    point the interpreter looks, in the caller."""
    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == code_name:
            def returning(frame: FrameType, event: str, arg: Any) -> Any:
                if event == "return":
                    sys.settrace(None)
                    signal.raise_signal(signal.SIGUSR1)
                return returning
            return returning
        return None
    return trace


@pytest.mark.parametrize(("point", "how"), [
    ("hold", "run_turn"),  # the caller's waiter holds the call: its frame is not written yet
    ("add", "submit_turn"),  # the pool's reader waits for the call: its frame is not written yet
])
def test_a_call_interrupted_once_its_reader_has_it_and_before_it_is_written_gets_one_result_at_once(
        system: ActorSystem, point: str, how: str) -> None:
    """The interrupt lands after the call was handed to its reader (the caller's waiter,
    or the pool's reader) and before its frame was written: the reader waited for the
    reply of a call never sent until its deadline (600 s), the worker busy and the place
    under the caps taken meanwhile, or the worker, given back as idle, was killed under
    the next call. Now the call is taken back from its reader, answered at once and its
    worker is the next call's."""
    assert threading.current_thread() is threading.main_thread()
    loop = warmed(system)
    events = Recorder()
    system.subscribe(events, only=(CallEvent,))
    before = signal.signal(signal.SIGUSR1, interrupt)
    try:
        sys.settrace(interrupted_after(point))
        with pytest.raises(KeyboardInterrupt):
            if how == "run_turn":
                loop.run_turn(one("nap", "cut", seconds=0.2), timeout_s=WAIT_S)
            else:
                loop.submit_turn(one("nap", "cut", seconds=0.2)).result(WAIT_S)
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGUSR1, before)
    assert finished_once(events, "cut"), events.kinds("cut")
    [after] = loop.run_turn(one("echo", "after", text="after"), timeout_s=WAIT_S)
    assert after.content == "after", after  # its worker and its place under the caps are free
    assert events.kinds("cut").count("finished") == 1 and "late" not in events.kinds("cut"), events.kinds("cut")
