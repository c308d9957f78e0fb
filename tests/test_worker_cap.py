"""The worker cap (DESIGN §5 "Fair shares"): ``max_workers`` caps the worker processes
alive (running or idle), ``max_running_workers`` the calls running in them at once, so
that more sessions than can run at once each keep their own untrusted worker instead of
evicting each other's in turn; both bounds hold, and the defaults are what the docs say."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from rho_actors import ActorSystem, ToolCall, UntrustedReads
from rho_actors.runtime import (
    IDLE_WORKER_BYTES,
    default_running_cap,
    default_worker_cap,
    host_memory_bytes,
)
from rho_actors.sandbox.confine.enclosure import IDLE_WATCH_S, _CgroupWatch
from rho_actors.sandbox.slots import WorkerSlots

from .conftest import WAIT_S, wait_for
from .helpers import make_tool


def _pid(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
    """A name of the worker process it runs in (each has pid 1 in its own PID namespace):
    drawn at its first call, kept in the process's ``sys`` module."""
    import sys

    return str(sys.__dict__.setdefault("_worker_name", os.urandom(8).hex()))


def _sessions_in_rounds(system: ActorSystem, sessions: int, rounds: int) -> dict[str, set[str]]:
    """``sessions`` sessions, each a thread running ``rounds`` turns of one untrusted
    ``pid`` call, all at once: the names of the workers each session's calls ran in."""
    loops = {f"s{i}": system.start_loop(f"s{i}") for i in range(sessions)}
    pids: dict[str, set[str]] = {name: set() for name in loops}
    problems: list[str] = []
    go = threading.Barrier(sessions)

    def session(name: str) -> None:
        go.wait(WAIT_S)
        for _ in range(rounds):
            [result] = loops[name].run_turn([ToolCall("c", "pid", "{}")], timeout_s=WAIT_S * 2)
            if result.ok:
                pids[name].add(result.content)
            else:
                problems.append(result.content)

    threads = [threading.Thread(target=session, args=(name,)) for name in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
    assert not problems, problems
    assert all(len(p) >= 1 for p in pids.values()), pids
    return pids


def test_more_sessions_than_run_at_once_each_keep_their_one_untrusted_worker(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, max_workers=16, max_running_workers=4, warm_workers=0, worker_idle_s=600,
                     untrusted=UntrustedReads(timeout_s=WAIT_S), start_timeout_ms=int(WAIT_S * 1000)) as system:
        assert system.register(make_tool("pid", _pid, timeout_ms=60_000), untrusted=True).info is not None
        pids = _sessions_in_rounds(system, 10, 4)
        stats = system.stats()
    # 10 sessions, 4 running at once: each session's calls all ran in the one worker started for it
    assert [len(p) for p in pids.values()] == [1] * 10, pids
    assert len(set().union(*pids.values())) == 10
    assert stats["untrusted_workers_started"] == 10 and stats["untrusted_workers_retired"] == 0, stats
    assert stats["workers_cap"] == 16 and stats["workers_running_cap"] == 4 and stats["workers_per_session"] == 2
    assert stats["workers_peak"] <= 16


def test_the_cap_on_worker_processes_holds_with_more_sessions_than_it(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, max_workers=3, max_running_workers=2, warm_workers=0,
                     untrusted=UntrustedReads(timeout_s=WAIT_S), start_timeout_ms=int(WAIT_S * 1000)) as system:
        assert system.register(make_tool("pid", _pid, timeout_ms=60_000), untrusted=True).info is not None
        pids = _sessions_in_rounds(system, 6, 2)
        stats = system.stats()
    assert stats["workers_peak"] <= 3, stats  # idle workers of other sessions were retired for new ones
    assert stats["untrusted_workers_started"] >= 6 and len(set().union(*pids.values())) >= 6
    assert stats["untrusted_workers_retired"] >= 3, stats


def test_the_cap_on_running_workers_holds_and_the_rest_of_the_cap_keeps_idle_ones() -> None:
    slots = WorkerSlots(5, running=2)
    assert slots.per_session == 2
    assert slots.enter("a", time.monotonic() + 1) and slots.enter("b", time.monotonic() + 1)
    assert not slots.try_enter("c")  # two calls run: a third waits
    assert not slots.enter("c", time.monotonic() + 0.05) and slots.waited_out == 1
    assert all(slots.try_acquire() for _ in range(5))  # processes: the whole cap (2 running, 3 idle)
    assert not slots.try_acquire() and slots.peak == 5
    slots.leave("a", held_s=5.0)
    assert slots.try_enter("c")
    for kwargs, message in (
        ({"running": 6}, r"the cap on running workers must be within 1\.\.5 \(the worker cap\), not 6"),
        ({"running": 2, "per_session": 3}, r"per-session share of workers must be within 1\.\.2 \(the cap on running"),
    ):
        with pytest.raises(ValueError, match=message):
            WorkerSlots(5, **kwargs)


def test_the_default_caps_are_sized_by_cores_and_by_what_an_idle_worker_costs(tmp_path: Path) -> None:
    running = max(32, 4 * (os.cpu_count() or 1))
    cap = max(running, host_memory_bytes() // (16 * IDLE_WORKER_BYTES))
    assert (default_running_cap(), default_worker_cap()) == (running, cap)
    assert 0 < host_memory_bytes() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with ActorSystem(tmp_path / "d") as system:
        stats = system.stats()
        assert (stats["workers_cap"], stats["workers_running_cap"], stats["workers_per_session"]) \
            == (cap, running, running // 2)
    # a cap given alone keeps its meaning: it bounds the running calls too (as before the split)
    with ActorSystem(tmp_path / "a", max_workers=6) as system:
        stats = system.stats()
        assert (stats["workers_cap"], stats["workers_running_cap"], stats["workers_per_session"]) == (6, 6, 3)
    # a running cap above the default cap raises it
    with ActorSystem(tmp_path / "r", max_running_workers=cap + 4) as system:
        stats = system.stats()
        assert (stats["workers_cap"], stats["workers_running_cap"]) == (cap + 4, cap + 4)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_workers": 4, "max_running_workers": 5}, r"max_running_workers must be an int within 1\.\.max_workers"
                                                       r" \(4\), not 5"),
        ({"max_running_workers": 0}, r"max_running_workers must be an int within 1\.\.max_workers \(\d+\), not 0"),
        ({"max_workers": 8, "max_running_workers": 4, "max_workers_per_session": 5},
         r"max_workers_per_session must be an int within 1\.\.max_running_workers \(4\), not 5"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            ActorSystem(tmp_path / "b", **kwargs)


def test_a_call_that_waits_out_the_running_cap_names_it(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    # the quick call's wait for the cap is cut at its start bound, 1 s; the hold needs no start within
    # it (its worker is warm first: a start on a loaded machine can take longer)
    with ActorSystem(tmp_path / "s", max_workers=4, max_running_workers=1, warm_workers=1,
                     start_timeout_ms=1_000) as system:
        system.register(make_tool("hold", _hold, timeout_ms=60_000), isolation="process")
        system.register(make_tool("quick", "ok", timeout_ms=300), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_idle", 0) == 1, 3 * WAIT_S), system.stats()
        held = system.start_loop("one").submit_turn([ToolCall("h", "hold", f'{{"gate": "{gate}"}}')])
        assert wait_for(lambda: system.stats()["workers_by_session"] == {"one": 1})
        [result] = system.start_loop("two").run_turn([ToolCall("q", "quick", "{}")])
        gate.touch()
        assert held.result(WAIT_S)[0].ok
    assert not result.ok and "the system's 1 running worker(s) were in use" in result.content, result.content


def _hold(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
    deadline = time.monotonic() + WAIT_S
    while not Path(args["gate"]).exists() and time.monotonic() < deadline:
        time.sleep(0.005)  # polling a file the test makes; bounded by WAIT_S
    return "released"


def test_a_burst_of_short_calls_starts_no_more_workers_than_calls_wait_for(tmp_path: Path) -> None:
    # 32 sessions of 5 ms trusted calls, 8 at once, with room for 48 processes: while the
    # first workers start, the warm ones serve call after call; a call that finds no idle
    # worker starts one only while fewer start than calls wait, so the pool grows to about
    # the running cap, not by one worker for each call that came while the first started
    with ActorSystem(tmp_path, max_workers=48, max_running_workers=8, warm_workers=2,
                     start_timeout_ms=int(WAIT_S * 1000)) as system:
        system.register(make_tool("pid", _pid_in_5_ms, timeout_ms=60_000), isolation="process")
        _sessions_in_rounds(system, 32, 6)
        stats = system.stats()
    assert stats["workers_started"] <= 16 and stats["workers_peak"] <= 16, stats  # 2x the running cap


def _pid_in_5_ms(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
    time.sleep(0.005)  # a short call, the benchmarks' five_ms
    return _pid(args, ctx)


class _CountedLooks:
    """The side of an enclosure its OOM watch uses, counting the watch's looks (and when
    each was, ``time.monotonic()``)."""

    def __init__(self) -> None:
        self.looks = 0
        self.at: list[float] = []

    def memory_bound_hit(self) -> bool:
        self.looks += 1
        self.at.append(time.monotonic())
        return False

    def kill(self) -> None:
        raise AssertionError("no OOM kill was recorded: nothing to kill")


def test_an_idle_worker_s_cgroup_is_watched_once_a_second_and_a_running_one_every_50_ms() -> None:
    # an idle confined worker kept for its session costs the host the watch's looks: 20 a
    # second were 2.4 ms of CPU a second each; idle, one a second (IDLE_WATCH_S)
    looks = _CountedLooks()
    watch = _CgroupWatch(os.getpid(), cast(Any, looks))
    watch.start()
    try:
        assert wait_for(lambda: looks.looks >= 3)  # a starting worker: every 50 ms
        watch.pace(busy=False)
        time.sleep(0.05)  # the look under way ends (50 ms)
        before = looks.looks
        time.sleep(IDLE_WATCH_S / 2)  # none while idle, for half the idle interval (it can only be fewer)
        assert looks.looks - before <= 1, looks.looks - before
        watch.pace(busy=True)  # a call: looked at now, not after the idle interval
        assert wait_for(lambda: looks.looks >= before + 3)
    finally:
        watch.stop()



class _CountedWakes(threading.Event):
    """An OOM watch's wake, counting the times it was set."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def test_calls_back_to_back_do_not_wake_the_oom_watch_once_each() -> None:
    # a call's start woke the watch, which looked at once (opened, read and parsed the
    # cgroup's OOM record): a thread wake, syscalls and a GIL hand-off on every call. Now
    # looks stay 50 ms apart however many calls start, and a call started while the watch
    # rests (idle) wakes it to look 50 ms later, not at the call's start nor a second later
    looks = _CountedLooks()
    watch = _CgroupWatch(os.getpid(), cast(Any, looks))
    wakes = watch._wake = _CountedWakes()
    watch.start()
    try:
        assert wait_for(lambda: looks.looks >= 2)  # a starting worker: every 50 ms
        before, started = looks.looks, time.monotonic()
        for _ in range(200):  # 200 short calls, back to back
            watch.pace(busy=True)
            time.sleep(0.001)
            watch.pace(busy=False)
        elapsed = time.monotonic() - started
        assert looks.looks - before <= elapsed / watch.interval_s + 1, (looks.looks - before, elapsed)
        assert wakes.sets <= looks.looks - before + 1, wakes.sets  # at most after a look that found it idle
        assert wait_for(lambda: watch._resting)  # a look found it idle, and no call since: it rests
        sets, paced = wakes.sets, time.monotonic()
        watch.pace(busy=True)  # a call while it rests: woken, to look 50 ms later
        assert wakes.sets == sets + 1
        assert wait_for(lambda: looks.at[-1] > paced)
        first = min(t for t in looks.at if t > paced)
        assert first - paced >= 0.9 * watch.interval_s, first - paced  # not at the call's start
    finally:
        watch.stop()
