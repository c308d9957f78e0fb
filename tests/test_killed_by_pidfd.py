"""A kill or a wait by pid never reaches a process given that pid since its own was
reaped, and a stop waits for each process it killed until it is reaped
(:mod:`rho_actors.otp.pidfds`). A pid is made again through ``ns_last_pid``
(:func:`tests.conftest.reuse_pid`; root), leading a session of its own, so that a
``killpg`` of the old pid reaches it too.

Before, each of these reached the newcomer: the system's stop ended an owned process
reaped before it (a stdio MCP server's) by ``killpg`` of its pid, then waited
``KILLED_REAP_S`` for that pid to leave ``/proc`` and warned that it was "not reaped";
a stdio MCP server's end SIGKILLed its old pid's group after the server had exited and
been reaped; a worker without an enclosure, reaped, had its old pid's group killed by a
later kill of its tree. And a pool's stop that gave up reaping a worker said nothing.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rho_actors.otp.owned import OwnedProcesses, owning
from rho_actors.otp.pidfds import PidFd
from rho_actors.sandbox import KILLED_REAP_S, WorkerPool

from .conftest import WAIT_S, reuse_pid, slack, wait_for

pytestmark = pytest.mark.timeout(4 * WAIT_S)


def _not_killed(proc: subprocess.Popen[Any]) -> bool:
    """Whether ``proc`` still runs half a second on (a kill would have ended it at once)."""
    try:
        proc.wait(0.5)
    except subprocess.TimeoutExpired:
        return True
    return False


def _end(proc: subprocess.Popen[Any]) -> None:
    proc.kill()
    proc.wait(WAIT_S)


def test_a_stop_neither_kills_nor_waits_for_an_owned_process_reaped_before_it(logs: list[str]) -> None:
    """An owned process (a stdio MCP server's, killed by its group) that ended and was
    reaped before the system's stop: the stop kills nothing, returns at once, and warns
    of nothing (before: its pid's group, now another process's, was SIGKILLed, and the
    stop waited its ``KILLED_REAP_S`` for the pid to leave ``/proc``, then warned that
    the process was not reaped)."""
    first = subprocess.Popen(["sleep", "120"], start_new_session=True)
    held = PidFd.open(first.pid)
    owned = OwnedProcesses()
    owned.add(held, functools.partial(held.kill, True), "MCP server")
    _end(first)  # ended and reaped before the stop
    other = reuse_pid(first.pid, session=True)
    try:
        began = time.monotonic()
        assert owned.end_all(KILLED_REAP_S) == []
        took = time.monotonic() - began
        assert _not_killed(other), "the stop killed the process given the reaped pid since"
        assert took < slack(KILLED_REAP_S / 2), f"the stop waited {took:.2f} s for a process reaped before it"
        assert not [line for line in logs if "not reaped" in line], logs
    finally:
        _end(other)
        held.close()


def test_a_stop_waits_until_an_owned_process_it_killed_is_reaped_and_names_one_that_is_not(
        logs: list[str]) -> None:
    """The stop's wait is for the reap, through the pidfd: a killed process its parent
    reaps is waited for, one left a zombie (its parent does not reap it) is named in the
    warning once the bound passed."""
    reaped = subprocess.Popen(["sleep", "120"])
    zombie = subprocess.Popen(["sleep", "120"])
    owned = OwnedProcesses()
    for proc, what in ((reaped, "reaped server"), (zombie, "zombie server")):
        held = PidFd.open(proc.pid)
        owned.add(held, functools.partial(PidFd.open(proc.pid).kill), what)
        held.close()  # the ledger waits through a pidfd of its own
    waiter = threading.Thread(target=reaped.wait, args=(WAIT_S,), daemon=True)  # its parent reaps it
    waiter.start()
    try:
        assert owned.end_all(KILLED_REAP_S) == [zombie.pid]
        waiter.join(WAIT_S)
        assert reaped.returncode is not None
        [line] = [line for line in logs if "not reaped" in line]
        assert f"zombie server (pid {zombie.pid})" in line and "reaped server" not in line
    finally:
        zombie.kill()
        zombie.wait(WAIT_S)


def _stdio_server(tmp_path: Path, script: str) -> tuple[list[str], Path]:
    marker = tmp_path / "pid"
    return ["-c", f"echo $$ > {marker}; {script}"], marker


def _pid_written(marker: Path) -> int:
    assert wait_for(lambda: marker.exists() and marker.read_text().strip().isdigit())
    return int(marker.read_text())


def test_a_stdio_servers_group_is_never_killed_by_a_pid_reaped_meanwhile(tmp_path: Path) -> None:
    """A stdio MCP server that died and was reaped (by asyncio's child watcher thread)
    while its connection's loop had not yet noted it: a system's stop kills its group
    through its pidfd, never the group given its pid since (before: its ``returncode``
    still ``None``, ``killpg`` of its pid SIGKILLed the newcomer's group)."""
    pytest.importorskip("mcp")
    from rho_actors.mcp.bounds import stdio_transport

    args, marker = _stdio_server(tmp_path, "exec sleep 120")
    owned = OwnedProcesses()
    others: list[subprocess.Popen[Any]] = []

    async def connect() -> None:
        with open(tmp_path / "stderr", "wb") as stderr:
            async with stdio_transport("/bin/sh", args, cwd=None, stderr=stderr, label="test server"):
                pid = _pid_written(marker)
                server = PidFd.open(pid)
                server.kill()
                # reaped by the watcher thread; this loop, not run meanwhile, has not noted it
                if not server.wait_reaped(WAIT_S):
                    pytest.skip("this asyncio's child watcher reaps on the loop")
                server.close()
                others.append(reuse_pid(pid, session=True))
                assert owned.end_all(KILLED_REAP_S) == []  # the system's stop, from its own thread

    try:
        with owning(owned):
            asyncio.run(connect())
        assert _not_killed(others[0]), "the stop killed the group given the reaped server's pid since"
    finally:
        for other in others:
            _end(other)


def test_a_stdio_servers_end_never_kills_the_group_given_its_pid_once_it_exited(tmp_path: Path) -> None:
    """A stdio MCP server that exited on its own and was reaped: the connection's end
    kills what is left of its group through its pidfd, never the group given its pid
    since (before: ``killpg`` of its pid, after its exit, SIGKILLed the newcomer's group)."""
    pytest.importorskip("mcp")
    from rho_actors.mcp.bounds import stdio_transport

    args, marker = _stdio_server(tmp_path, "exit 0")
    others: list[subprocess.Popen[Any]] = []

    async def connect() -> None:
        with open(tmp_path / "stderr", "wb") as stderr:
            async with stdio_transport("/bin/sh", args, cwd=None, stderr=stderr, label="test server"):
                pid = _pid_written(marker)
                server = PidFd.open(pid)
                deadline = time.monotonic() + WAIT_S
                while not server.reaped() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)  # exited, and reaped by this loop's child watcher
                assert server.reaped()
                server.close()
                others.append(reuse_pid(pid, session=True))

    try:
        asyncio.run(connect())
        assert _not_killed(others[0]), "the connection's end killed the group given the exited server's pid since"
    finally:
        for other in others:
            _end(other)


def test_a_reaped_workers_tree_kill_never_reaches_the_group_given_its_pid() -> None:
    """A worker without an enclosure (``confinement=False``), killed and reaped: a later
    kill of its tree (the pool's stop kills every worker it holds, reaped or not) goes
    through its pidfd, never to the group given its pid since (before: ``killpg`` of its
    pid SIGKILLed the newcomer's group)."""
    pool = WorkerPool(warm=1, codec="pickle")
    other = None
    try:
        assert pool.wait_warm(WAIT_S)
        with pool._lock:  # the pool lets go of it: this test ends it
            [worker] = pool._idle
            pool._forget_locked(worker)
        worker.kill()
        assert worker.reap(WAIT_S) is not None
        other = reuse_pid(worker.pid, session=True)
        worker.kill_tree()
        assert _not_killed(other), "the kill of a reaped worker's tree killed the group given its pid since"
        worker.close()
    finally:
        pool.stop()
        if other is not None:
            _end(other)


def test_a_pool_stop_names_the_workers_it_killed_and_could_not_reap(monkeypatch: pytest.MonkeyPatch,
                                                                     logs: list[str]) -> None:
    """A worker whose fork server does not report it reaped within the stop's bound: the
    stop returns by its bound and names it in a warning (before: it returned saying
    nothing, the worker maybe still a process)."""
    from rho_actors.sandbox import processes, worker_handle

    pool = WorkerPool(warm=1, codec="pickle")
    assert pool.wait_warm(WAIT_S)
    [pid] = pool.pids()
    real_reap = processes.reap

    def never_reaped(proc: Any, timeout_s: float) -> int | None:
        if proc.pid != pid:
            return real_reap(proc, timeout_s)
        time.sleep(timeout_s)
        return None

    monkeypatch.setattr(worker_handle, "reap", never_reaped)
    began = time.monotonic()
    pool.stop(0)
    took = time.monotonic() - began
    monkeypatch.setattr(worker_handle, "reap", real_reap)
    assert took < slack(2 * KILLED_REAP_S), f"the stop took {took:.2f} s"
    [line] = [line for line in logs if "killed but not reaped" in line]
    assert str(pid) in line


@pytest.mark.parametrize("group_flag", [True, False], ids=["pidfd-group", "before-6.9"])
def test_a_group_kill_reaches_the_members_its_reaped_leader_left(tmp_path: Path, group_flag: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's leader that exited and was reaped, a member of its group left (a stdio MCP
    server's shell that started its server in the background): the kill of the group ends
    the member (the kernel signals no group through a reaped leader's pidfd; its pid, still
    the group's id, is given to no other process while the member lives)."""
    monkeypatch.setattr("rho_actors.otp.pidfds._group_flag", [group_flag])
    marker = tmp_path / "member"
    leader = subprocess.Popen(["/bin/sh", "-c", f"sleep 300 & echo $! > {marker}; exit 0"], start_new_session=True)
    handle = PidFd.open(leader.pid)
    member = 0
    try:
        assert leader.wait(WAIT_S) == 0 and handle.reaped()
        member = int(marker.read_text())
        assert os.getpgid(member) == leader.pid
        handle.kill(group=True)
        assert wait_for(lambda: not Path(f"/proc/{member}").exists() or _zombie(member), WAIT_S), \
            "the member of the reaped leader's group outlived the group's kill"
    finally:
        handle.close()
        if member and Path(f"/proc/{member}").exists():
            os.kill(member, 9)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
