"""A crash storm against caps of one and two (DESIGN §5 "Fair shares", "A call's path"):
more sessions than the caps, each a thread running turns of trusted and untrusted calls
that crash, overstay their deadline or answer, one call a turn (its reply read by the
caller) and two. Every call id gets exactly one result, its own (a session's text is
never another's), a hung call its ``timeout`` at its deadline; the worker processes
counted in ``/proc`` never pass ``max_workers``; after the stop no process, thread or
descriptor is left."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ToolCall
from rho_actors.tool import ErrorKind

from .conftest import READS, WAIT_S, slack, wait_for
from .helpers import make_tool

pytestmark = pytest.mark.timeout(600)


def _act(args: Any, ctx: Any) -> str:
    how = args["how"]
    if how == "crash":
        os._exit(3)
    if how == "hang":
        time.sleep(600)
    return str(args["text"])


def descendants() -> dict[int, int]:
    """This process's descendants now: pid -> depth (0: its children, the fork servers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":  # a zombie holds no memory; it is reaped by its parent
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: dict[int, int] = {}
    stack = [(os.getpid(), -1)]
    while stack:
        pid, depth = stack.pop()
        for child in children.get(pid, []):
            found[child] = depth + 1
            stack.append((child, depth + 1))
    return found


def command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


def open_fds() -> set[int]:
    """This process's open descriptors (the one listing them is closed by then), but the
    pidfds watching fork servers (one a fork server, kept until the next start looks)."""
    fds = set()
    for entry in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{entry}") == "anon_inode:[pidfd]":
                continue
        except OSError:
            continue
        fds.add(int(entry))
    return fds


def test_a_crash_storm_of_many_sessions_under_caps_of_one_and_two(tmp_path: Path) -> None:
    with ActorSystem(tmp_path / "first", untrusted=READS) as first:  # what lives as long as this process is made first
        first.register(make_tool("u", _act, timeout_ms=300), untrusted=True)
        first.register(make_tool("t", _act, timeout_ms=300), isolation="process")
        loop = first.start_loop("s")
        loop.run_turn([ToolCall("a", "u", '{"how": "ok", "text": "a"}'),
                              ToolCall("b", "t", '{"how": "ok", "text": "b"}')], timeout_s=WAIT_S)
    before_threads = {t.ident for t in threading.enumerate()}
    before_fds = open_fds()
    before_pids = set(descendants())
    # a call queued behind the storm waits at most 10 s for a worker, then is unavailable (accepted below):
    # every turn stays within WAIT_S (not the tests' raised default start bound, WAIT_S itself)
    system = ActorSystem(tmp_path / "data", untrusted=READS, max_workers=2, max_running_workers=1, warm_workers=0,
                         shutdown_ms=5_000, start_timeout_ms=10_000)
    peak = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.005):
            workers = [p for p, depth in descendants().items() if depth >= 1 and p not in before_pids]
            peak[0] = max(peak[0], len(workers))

    sampler = threading.Thread(target=sample)
    results: dict[str, list[Any]] = {}
    problems: list[str] = []
    lock = threading.Lock()
    try:
        system.register(make_tool("u", _act, timeout_ms=300), untrusted=True)
        system.register(make_tool("t", _act, timeout_ms=300), isolation="process")
        sampler.start()
        go = threading.Barrier(6)

        def session(n: int) -> None:
            loop = system.start_loop(f"s{n}")
            go.wait(WAIT_S)
            for r in range(6):
                hows = ("ok", "crash", "hang")
                calls = [ToolCall(f"s{n}-{r}-{k}", ("u", "t")[(n + r + k) % 2],
                                  json.dumps({"how": hows[(n + r + k) % 3], "text": f"of s{n} {r} {k}"}))
                         for k in range(1 + r % 2)]
                started = time.monotonic()
                try:
                    got = loop.run_turn(calls, timeout_s=WAIT_S)
                except Exception as exc:
                    with lock:
                        problems.append(f"s{n} turn {r}: {exc!r}")
                    continue
                took = time.monotonic() - started
                with lock:
                    for call, result in zip(calls, got, strict=True):
                        results.setdefault(call.id, []).append((call, result, took))

        threads = [threading.Thread(target=session, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S * 4)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        sampling.set()
        sampler.join(WAIT_S)
        system.stop()
    assert not problems, problems
    assert len(results) == 6 * (3 + 3 * 2)  # every call id one result
    for call_id, [(call, result, took)] in ((k, v) for k, v in results.items()):
        assert result.call_id == call_id and took < WAIT_S
        how = json.loads(call.arguments)["how"]
        if result.ok:
            assert how == "ok" and result.content == json.loads(call.arguments)["text"], (call, result)
        elif how == "crash":  # os._exit(3): `exited`; `crashed` when its pipe's end is seen first
            assert result.error_kind in (ErrorKind.EXITED, ErrorKind.CRASHED, ErrorKind.UNAVAILABLE,
                                         ErrorKind.TIMEOUT), result
        elif how == "hang":
            assert result.error_kind in (ErrorKind.TIMEOUT, ErrorKind.UNAVAILABLE), result
        else:
            assert result.error_kind in (ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT), result  # no worker in time
        assert "of s" not in result.content or result.content == json.loads(call.arguments)["text"], result
    assert peak[0] <= 2, f"{peak[0]} worker processes alive at once under max_workers=2"
    assert wait_for(lambda: not (set(descendants()) - before_pids), slack(10.0)), \
        {pid: command(pid) for pid in descendants()}
    assert wait_for(lambda: {t.ident for t in threading.enumerate()} <= before_threads, slack(10.0)), \
        [t.name for t in threading.enumerate() if t.ident not in before_threads]
    assert wait_for(lambda: open_fds() <= before_fds, slack(10.0)), \
        {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in open_fds() - before_fds}
