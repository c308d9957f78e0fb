"""The reply of a turn's only ``process`` call, read by the host's thread that waits for
it (DESIGN §5 "A call's path"): ``run_turn`` of one call written to an idle worker reads
that call's pipe itself, so a warm call takes two wakes (the worker's, the caller's),
not three; every other wait keeps the pool's reader. The guarantees of the reader's path
hold on this one: the deadline's kill, a cancel, a stop, a forged reply, a worker killed
mid-frame, and a caller that stops waiting early each give the call exactly one result.

Every wait is bounded; synchronisation is by files the tools write and events, never by
sleeping for a guessed time. The tools are shipped by value (this module is registered
with cloudpickle), so a worker never imports pytest or this file.
"""

from __future__ import annotations

import asyncio
import json
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
from rho_actors.cancel import CancelToken
from rho_actors.function_tool import tool
from rho_actors.otp.timers import Timer, Timers
from rho_actors.sandbox import Waiter, WorkerCall, WorkerPool
from rho_actors.sandbox.replies import Replies
from rho_actors.tool import ErrorKind, ToolResult

from .conftest import WAIT_S, Recorder, slack, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(180)

START_MS = int(WAIT_S * 1000)
"""How long a call may wait for a worker: a hang bound, not the default 10 s, which a loaded
machine's first worker start can pass (the call then fails ``no_worker_in_time``)."""


@tool
def echo(text: str) -> str:
    """Return ``text``."""
    return text


@tool(timeout_ms=600_000)
def nap(seconds: float, marker: str = "") -> str:
    """Sleep ``seconds`` (after writing this process's pid to ``marker``, if given)."""
    if marker:
        Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
    return "woke"


@tool(timeout_ms=300)
def overstay(marker: str) -> str:
    """Outlive a 0.3 s deadline (its pid written to ``marker`` first)."""
    Path(marker).write_text(str(os.getpid()))
    time.sleep(600)
    return "never"


def _overstaying(timeout_ms: int) -> Any:
    """``overstay`` with another deadline (``overstay_<timeout_ms>``)."""

    @tool(name=f"overstay_{timeout_ms}", timeout_ms=timeout_ms)
    def overstay_longer(marker: str) -> str:
        """Outlive the deadline (its pid written to ``marker`` first)."""
        Path(marker).write_text(str(os.getpid()))
        time.sleep(600)
        return "never"

    return overstay_longer


@tool(timeout_ms=600_000)
def half_frame(marker: str) -> str:
    """Write the first part of a ``RESULT`` frame to the worker's reply pipe (the pipe
    found as a malicious tool would), then its pid to ``marker``, and hang: the host has
    part of a frame when the worker is killed."""
    import gc

    from rho_actors.sandbox import wire
    from rho_actors.sandbox.channel import Channel

    channel = next(o for o in gc.get_objects() if isinstance(o, Channel))
    frame = bytes(channel.frame(wire.RESULT, b"x" * 1000))
    os.write(channel.fd, frame[:40])
    Path(marker).write_text(str(os.getpid()))
    time.sleep(600)
    return "never"


class Reads:
    """Which threads read replies (``Replies._serve``) and how many calls went to a pool's
    reader (``Replies.add``), recorded while the fixture runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[int] = []
        self.added = 0
        serve, add = Replies._serve, Replies.add

        def serving(replies: Replies, *args: Any) -> Any:
            self.threads.append(threading.get_ident())
            return serve(replies, *args)

        def adding(replies: Replies, call: Any) -> None:
            self.added += 1
            add(replies, call)

        monkeypatch.setattr(Replies, "_serve", serving)
        monkeypatch.setattr(Replies, "add", adding)

    def clear(self) -> None:
        self.threads.clear()
        self.added = 0


@pytest.fixture
def process_system(tmp_path: Path) -> Iterator[ActorSystem]:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=5_000, warm_workers=1, start_timeout_ms=START_MS)
    try:
        for each in (echo, nap, overstay, half_frame):
            system.register(each, isolation="process")
        yield system
    finally:
        system.stop()


def one(name: str, call_id: str = "c1", **args: Any) -> list[ToolCall]:
    return [ToolCall(call_id, name, json.dumps(args))]


def warmed(system: ActorSystem) -> Any:
    """A session whose first call has run (its worker warm, the pools started)."""
    loop = system.start_loop("s1")
    [first] = loop.run_turn(one("echo", "warm", text="warm"), timeout_s=WAIT_S)
    assert first.ok, first.content
    return loop


def test_a_turns_only_process_call_is_read_by_the_waiting_caller(
        process_system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = warmed(process_system)
    reads = Reads(monkeypatch)
    for n in range(3):
        [result] = loop.run_turn(one("echo", f"c{n}", text=f"hi {n}"), timeout_s=WAIT_S)
        assert result.ok and result.content == f"hi {n}" and result.call_id == f"c{n}"
    assert reads.added == 0  # no pool's reader was given the calls...
    assert set(reads.threads) == {threading.get_ident()}  # ...their replies were read here


def test_a_turn_of_several_calls_and_an_awaited_turn_keep_the_pools_reader(
        process_system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = warmed(process_system)
    reads = Reads(monkeypatch)
    results = loop.run_turn(one("echo", "a", text="a") + one("echo", "b", text="b"), timeout_s=WAIT_S)
    assert [r.content for r in results] == ["a", "b"]
    assert reads.added >= 1 and threading.get_ident() not in reads.threads
    reads.clear()
    [awaited] = asyncio.run(loop.arun_turn(one("echo", "c", text="c"), timeout_s=WAIT_S))
    assert awaited.content == "c"
    assert reads.added == 1 and threading.get_ident() not in reads.threads


def test_the_deadline_kills_the_worker_of_a_call_its_caller_reads(
        process_system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = warmed(process_system)
    reads = Reads(monkeypatch)
    marker = tmp_path / "pid"
    # on a loaded machine the deadline may come before the tool began (no pid written): a longer one then
    for timeout_ms in (300, 1_200, 4_800, int(WAIT_S * 1000)):
        name = "overstay" if timeout_ms == 300 else f"overstay_{timeout_ms}"
        if timeout_ms != 300:
            assert process_system.register(_overstaying(timeout_ms), isolation="process").offered
        reads.clear()
        started = time.monotonic()
        [result] = loop.run_turn(one(name, marker=str(marker)), timeout_s=WAIT_S + timeout_ms / 1000)
        assert result.error_kind is ErrorKind.TIMEOUT, result
        assert "killed" in result.content or result.content.endswith("it did not start"), result
        assert time.monotonic() - started < timeout_ms / 1000 + slack(2.0)
        assert reads.added == 0
        if marker.exists() and marker.read_text() != "":  # its worker is gone: the file is as it left it
            break
    assert "killed" in result.content, result  # it ran: its worker was killed at the deadline
    pid = int(marker.read_text())
    assert wait_for(lambda: pid not in process_system.worker_pids())
    assert loop.run_turn(one("echo", "after", text="after"), timeout_s=WAIT_S)[0].content == "after"


def test_a_cancelled_turn_kills_the_worker_its_caller_waits_for(
        process_system: ActorSystem, tmp_path: Path) -> None:
    loop = warmed(process_system)
    marker = tmp_path / "pid"
    cancel = CancelToken()

    def cancel_once_running() -> None:
        if wait_for(lambda: marker.exists() and marker.read_text() != ""):
            cancel.cancel("the host changed its mind")

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    started = time.monotonic()
    [result] = loop.run_turn(one("nap", seconds=600, marker=str(marker)), timeout_s=WAIT_S, cancel=cancel)
    canceller.join(WAIT_S)
    assert result.error_kind is ErrorKind.CANCELLED, result
    assert time.monotonic() - started < WAIT_S
    pid = int(marker.read_text())
    assert wait_for(lambda: pid not in process_system.worker_pids())
    assert loop.run_turn(one("echo", "after", text="after"), timeout_s=WAIT_S)[0].content == "after"


def test_a_system_stopped_while_the_caller_reads_gives_its_call_one_result(tmp_path: Path) -> None:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=5_000, warm_workers=1, start_timeout_ms=START_MS)
    marker = tmp_path / "pid"

    def stop_once_running() -> None:
        if wait_for(lambda: marker.exists() and marker.read_text() != ""):
            system.stop()

    stopper = threading.Thread(target=stop_once_running)
    try:
        system.register(echo, isolation="process")
        system.register(nap, isolation="process")
        loop = warmed(system)
        stopper.start()
        [result] = loop.run_turn(one("nap", seconds=600, marker=str(marker)), timeout_s=WAIT_S)
    finally:
        stopper.join(WAIT_S)
        system.stop()
    assert result.call_id == "c1" and not result.ok, result
    assert result.error_kind in (ErrorKind.CANCELLED, ErrorKind.UNAVAILABLE, ErrorKind.CRASHED), result
    assert not stopper.is_alive()


def test_a_worker_killed_mid_frame_is_a_crash_its_caller_reads(
        process_system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = warmed(process_system)
    reads = Reads(monkeypatch)
    marker = tmp_path / "pid"

    def kill_once_written() -> None:
        if wait_for(lambda: marker.exists() and marker.read_text() != ""):
            os.kill(int(marker.read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_once_written)
    killer.start()
    [result] = loop.run_turn(one("half_frame", marker=str(marker)), timeout_s=WAIT_S)
    killer.join(WAIT_S)
    assert result.error_kind is ErrorKind.CRASHED and "SIGKILL" in result.content, result
    assert reads.added == 0
    assert loop.run_turn(one("echo", "after", text="after"), timeout_s=WAIT_S)[0].content == "after"


def test_a_caller_that_stops_waiting_early_leaves_its_call_to_the_reader(
        process_system: ActorSystem, tmp_path: Path) -> None:
    """``run_turn``'s own ``timeout_s`` passes before the call's reply: the caller raises
    ``TimeoutError`` and the pool's reader takes the call over; it gets its one result
    (its tool's), and no reply is read for another call."""
    loop = warmed(process_system)
    events = Recorder()
    process_system.subscribe(events, only=(CallEvent,))
    marker = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        loop.run_turn(one("nap", "slow", seconds=slack(1.0), marker=str(marker)), timeout_s=0.2)
    assert wait_for(lambda: "finished" in events.kinds("slow"))
    [finished] = [e for e in events.events if e.call_id == "slow" and e.kind == "finished"]
    assert finished.outcome == "ok", finished  # its tool's own result
    for n in range(2):
        [result] = loop.run_turn(one("echo", f"n{n}", text=f"n{n}"), timeout_s=WAIT_S)
        assert result.content == f"n{n}" and result.call_id == f"n{n}"
    assert events.kinds("slow").count("finished") == 1 and "late" not in events.kinds("slow")


# --- the pool's side: a call held for the thread that waits for it -------------------------


def a_call(the_tool: Any, args: dict[str, Any], timeout_s: float = WAIT_S, call_id: str = "c1",
           session: str = "s1") -> WorkerCall:
    return WorkerCall.of(the_tool, args, {"session_id": session, "call_id": call_id},
                         time.monotonic() + timeout_s, 10_000, cancel=CancelToken())


class Given:
    """A ``done`` keeping each result and the thread that gave it (one result at most)."""

    def __init__(self) -> None:
        self.results: list[tuple[ToolResult, int]] = []
        self.arrived = threading.Event()

    def __call__(self, result: ToolResult) -> None:
        self.results.append((result, threading.get_ident()))
        self.arrived.set()


def test_a_held_call_is_read_by_its_waiter_and_no_reader_is_given_it(
        pool: WorkerPool, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = Reads(monkeypatch)
    given, waiter = Given(), Waiter()
    assert pool.try_start(a_call(echo, {"text": "hi"}), given, waiter=waiter)
    waiter.close()
    assert given.results == []  # written, not yet read: its reply waits for this thread
    assert waiter.serve(time.monotonic() + WAIT_S)
    [(result, thread)] = given.results
    assert result.ok and result.content == "hi" and result.call_id == "c1" and thread == threading.get_ident()
    assert reads.added == 0


def test_a_waiter_of_another_thread_or_closed_holds_nothing(pool: WorkerPool) -> None:
    made: list[Waiter] = []
    maker = threading.Thread(target=lambda: made.append(Waiter()))
    maker.start()
    maker.join(WAIT_S)
    for waiter in (made[0], Waiter()):
        if waiter is not made[0]:
            waiter.close()
        given = Given()
        assert pool.try_start(a_call(echo, {"text": "x"}), given, waiter=waiter)
        assert given.arrived.wait(WAIT_S)  # the reader answered it
        assert not waiter.serve(time.monotonic() + WAIT_S)
        [(result, thread)] = given.results
        assert result.content == "x" and thread != threading.get_ident()


def test_a_held_call_whose_waiter_stops_early_is_answered_by_the_reader(pool: WorkerPool) -> None:
    given, waiter = Given(), Waiter()
    assert pool.try_start(a_call(nap, {"seconds": slack(0.5)}), given, waiter=waiter)
    waiter.close()
    assert not waiter.serve(time.monotonic() + 0.05)
    assert given.arrived.wait(WAIT_S)
    [(result, thread)] = given.results
    assert result.ok and result.content == "woke" and thread != threading.get_ident()
    assert pool.run_call(a_call(echo, {"text": "next"}, call_id="c2")).content == "next"


def test_a_held_call_keeps_its_deadline(pool: WorkerPool) -> None:
    given, waiter = Given(), Waiter()
    started = time.monotonic()
    assert pool.try_start(a_call(nap, {"seconds": 600}, timeout_s=0.3), given, waiter=waiter)
    waiter.close()
    assert waiter.serve(time.monotonic() + WAIT_S)
    [(result, _)] = given.results
    assert result.error_kind is ErrorKind.TIMEOUT and "killed" in result.content
    assert time.monotonic() - started < 0.3 + slack(1.0)
    assert wait_for(lambda: pool.stats()["killed"] == 1)


def test_a_held_call_whose_worker_ended_before_it_had_the_whole_call_runs_once_elsewhere(pool: WorkerPool) -> None:
    """The pipe takes only part of a big call at once: its waiter writes the rest as it
    reads. A worker killed (kill -9) before it had the whole call never ran it: the call
    goes to another worker and gets the one result of that run."""
    [pid] = pool.pids()
    os.kill(pid, signal.SIGSTOP)  # it reads nothing more: the call's frame stays half written
    given, waiter = Given(), Waiter()
    assert pool.try_start(a_call(echo, {"text": "x" * (8 << 20)}), given, waiter=waiter)
    waiter.close()
    os.kill(pid, signal.SIGKILL)
    waiter.serve(time.monotonic() + WAIT_S)
    assert given.arrived.wait(WAIT_S)
    [(result, _)] = given.results
    assert result.ok and len(result.content) > 0, result.content[:200]
    assert pool.stats()["died"] == 1 and pid not in pool.pids()


@tool
def forge_then_return(go: str, text: str) -> str:
    """Write a forged ``RESULT`` of this call to the worker's own reply pipe, then, once
    ``go`` exists, return ``text``: the worker's real reply comes after the host took the
    forged one, while its next call is open."""
    import gc

    from rho_actors.results import result_from_return
    from rho_actors.sandbox import wire
    from rho_actors.sandbox.channel import Channel

    objects = gc.get_objects()
    channel = next(o for o in objects if isinstance(o, Channel))
    own = next(o.call_id for o in objects if isinstance(o, wire.CallRequest) and o.call_id.startswith("c1"))
    channel.send(wire.RESULT, wire.CODECS["pickle"].encode(result_from_return(own, "forge", "forged", 100, 0.0)))
    until = time.monotonic() + 60
    while not Path(go).exists() and time.monotonic() < until:
        time.sleep(0.01)
    return text


def test_a_reply_forged_for_an_earlier_call_is_never_the_held_calls_result(pool: WorkerPool, tmp_path: Path) -> None:
    go = tmp_path / "go"
    given, waiter = Given(), Waiter()
    assert pool.try_start(a_call(forge_then_return, {"go": str(go), "text": "secret of s1"}), given, waiter=waiter)
    waiter.close()
    assert waiter.serve(time.monotonic() + WAIT_S)
    [(forged, _)] = given.results
    assert forged.content == "forged" and forged.call_id == "c1"  # its own call: its own doing
    other, waiter = Given(), Waiter()
    assert pool.try_start(a_call(echo, {"text": "mine"}, call_id="c2", session="s2"), other, waiter=waiter)
    waiter.close()
    go.write_text("")
    assert waiter.serve(time.monotonic() + WAIT_S)
    [(result, _)] = other.results
    assert "secret" not in result.content
    assert result.error_kind is ErrorKind.CRASHED and "a reply to another call" in result.content, result


class _Fired(Timer):
    __slots__ = ("fired", "thread")

    def __init__(self, when: float) -> None:
        super().__init__(when)
        self.fired = threading.Event()
        self.thread: threading.Thread | None = None

    def fire(self) -> None:
        self.thread = threading.current_thread()
        self.fired.set()


class _Interrupted:
    """A lock whose wait is interrupted (as a ``KeyboardInterrupt`` in the host's wait)."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:  # threading.Lock.acquire's signature
        raise KeyboardInterrupt


def test_a_kept_deadline_goes_to_the_timers_at_its_instant_never_fired_in_the_waiting_thread() -> None:
    """A waiter's kept deadline (one, from its own thread) is handed to the timers when
    its instant comes in the wait (fired by the timer thread, never the waiting one,
    which a signal handler may interrupt), or when the wait is interrupted or handed over;
    a deadline disarmed first (the call answered) is never scheduled."""
    timers = Timers()
    try:
        waiter, lock = Waiter(), threading.Lock()
        lock.acquire()
        kept = _Fired(time.monotonic() + 0.05)
        assert waiter.keep(kept, timers) and not waiter.keep(_Fired(0.0), timers)  # once
        assert not waiter.wait(lock, time.monotonic() + 0.1)  # never released: the deadline went to the timers
        assert kept.fired.wait(WAIT_S) and kept.timers is timers
        assert kept.thread is timers._thread

        answered, released = Waiter(), threading.Lock()
        disarmed = _Fired(time.monotonic() + WAIT_S)
        assert answered.keep(disarmed, timers)
        disarmed.cancel()  # the call's result disarms it, then releases the lock
        assert answered.wait(released, time.monotonic() + WAIT_S)
        assert disarmed.timers is None  # no heap push for a call answered first

        other = Waiter()
        held: list[bool] = []
        thread = threading.Thread(target=lambda: held.append(other.keep(_Fired(0.0), timers)))
        thread.start()
        thread.join(WAIT_S)
        assert held == [False]  # only from the waiter's own thread

        interrupted = _Fired(time.monotonic() + 0.05)
        assert other.keep(interrupted, timers)
        with pytest.raises(KeyboardInterrupt):
            other.wait(_Interrupted(), time.monotonic() + WAIT_S)  # type: ignore[arg-type]
        assert interrupted.fired.wait(WAIT_S) and interrupted.timers is timers

        handed = _Fired(time.monotonic() + 0.05)
        last = Waiter()
        assert last.keep(handed, timers)
        last.hand_over()
        assert handed.fired.wait(WAIT_S) and handed.timers is timers
    finally:
        timers.stop()
