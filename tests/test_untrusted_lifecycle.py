"""Nothing of an untrusted tool outlives its system (DESIGN §5): a host killed with
``kill -9`` while a worker is busy, and a system stopped while a tool's ``setsid`` child
runs, leave no worker, no tool child, no fork server and no resource tracker behind.
The host runs as a subprocess where its own death or its servers are the subject."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall
from rho_actors.sandbox.confine.uids import DEFAULT_UID_RANGE
from tests.conftest import READS, WAIT_S, read_line, wait_for
from tests.helpers import make_tool

_HOST = """
import json, sys, time
from rho_actors import ActorSystem, ToolCall

class Busy:
    name = staticmethod(lambda: "busy")
    description = staticmethod(lambda: "Starts a setsid child, then spins.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    timeout_ms = staticmethod(lambda: 60_000)

    @staticmethod
    def run(args, ctx):
        import subprocess
        subprocess.Popen(["sleep", args["tag"]], start_new_session=True)
        while True:
            pass

if __name__ == "__main__":
    system = ActorSystem(sys.argv[1], warm_workers=1)
    system.register(Busy, untrusted=True)
    loop = system.start_loop("s")
    loop.submit_turn([ToolCall("b", "busy", json.dumps({"tag": sys.argv[2]}))])
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "stop":
        system.stop()
        print("stopped", flush=True)
    time.sleep(600)
"""


def _sleepers(tag: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", tag]]


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _line(stream: IO[bytes]) -> str:
    return read_line(stream, 3 * WAIT_S).decode().strip()  # (select would miss a line already buffered)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Any]:
    """Start a host running a busy untrusted call whose tool started ``sleep <tag>`` with
    ``setsid``; yields ``(host, tag, everything the host started)``."""
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(_HOST))
    tag = f"{307 + time.monotonic_ns() % 1000 / 1000:.3f}"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "data"), tag],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        assert _line(proc.stdout) == "ready"
        assert wait_for(lambda: bool(_sleepers(tag)), 3 * WAIT_S), "the tool's child did not start"
        yield proc, tag
    finally:
        proc.kill()
        proc.wait(WAIT_S)
        for sleeper in _sleepers(tag):  # only if the test failed
            sleeper.kill()


def _started_by(host: subprocess.Popen[bytes], tag: str) -> dict[str, list[int]]:
    """The host's processes by role: its clean fork server (untrusted workers never come
    from multiprocessing's), any resource tracker, workers, and the tool's child (an
    escape from its worker's session, still in its worker's tree)."""
    [sleeper] = _sleepers(tag)
    worker = psutil.Process(sleeper.ppid())
    fork_server = psutil.Process(worker.ppid())
    assert fork_server.ppid() == host.pid
    children = psutil.Process(host.pid).children()
    trackers = [p.pid for p in children if "resource_tracker" in " ".join(p.cmdline())]
    cmdline = fork_server.cmdline()
    assert cmdline[1:3] == ["-I", "-c"] and "rho_actors.sandbox.zygote" in cmdline[3], cmdline
    assert len(trackers) <= 1
    workers = [p.pid for p in fork_server.children()]
    assert worker.pid in workers and os.getsid(sleeper.pid) == sleeper.pid  # it left its worker's session
    if psutil.Process(host.pid).uids().real == 0:
        assert worker.uids().real in DEFAULT_UID_RANGE  # a root host's workers: each a uid of its own
    return {"fork_server": [fork_server.pid], "resource_tracker": trackers, "workers": workers,
            "tool_child": [sleeper.pid]}


def test_kill_9_of_a_host_with_a_busy_worker_leaves_nothing(host: Any) -> None:
    proc, tag = host
    started = _started_by(proc, tag)
    proc.kill()
    assert proc.wait(WAIT_S) == -signal.SIGKILL
    pids = [pid for group in started.values() for pid in group]
    assert wait_for(lambda: _gone(pids)), {
        role: [p for p in group if not _gone([p])] for role, group in started.items()
    }


def _leftovers(host_pid: int) -> list[Path]:
    """Private folders and cgroups named for the host ``host_pid``."""
    from rho_actors.sandbox.confine import cgroups

    prefix = f"rho-actors-{host_pid}-"
    places = [Path(tempfile.gettempdir())]
    hierarchy = cgroups.find_hierarchy()
    if not isinstance(hierarchy, str):
        places += [Path(d) for d in set(hierarchy.dirs.values())]
    return [p for place in places for p in place.iterdir() if p.name.startswith(prefix)]


def test_a_start_sweeps_what_a_host_killed_with_kill_9_left_behind(host: Any, tmp_path: Path) -> None:
    """The busy worker's private folder and cgroup outlive a host killed with
    ``kill -9``; the next system's start removes them. (Any system's start on this machine
    sweeps them: another test's, beside this one, may be first, so the folder is looked
    for while the host lives, not between its kill and the next start.)"""
    proc, tag = host
    started = _started_by(proc, tag)
    left = _leftovers(proc.pid)
    assert any(p.parent == Path(tempfile.gettempdir()) for p in left), left  # the worker's private folder
    proc.kill()
    assert proc.wait(WAIT_S) == -signal.SIGKILL
    assert wait_for(lambda: _gone([pid for group in started.values() for pid in group]))
    ActorSystem(tmp_path / "next", shutdown_ms=2_000).stop()
    assert _leftovers(proc.pid) == []


def test_stop_ends_the_fork_server_the_resource_tracker_and_every_worker_tree(host: Any) -> None:
    proc, tag = host
    started = _started_by(proc, tag)
    proc.stdin.write(b"stop\n")
    proc.stdin.flush()
    assert _line(proc.stdout) == "stopped"
    pids = [pid for group in started.values() for pid in group]
    assert wait_for(lambda: _gone(pids)), {
        role: [p for p in group if not _gone([p])] for role, group in started.items()
    }
    assert proc.poll() is None  # the host lives on without them


def _escape_and_wait(args: Any, ctx: Any) -> str:
    subprocess.Popen(["sleep", args["tag"]], start_new_session=True)
    time.sleep(60)
    return "never"


def test_a_setsid_child_dies_at_stop(tmp_path: Path) -> None:
    tag = "308.25"
    system = ActorSystem(tmp_path, untrusted=READS, warm_workers=1, shutdown_ms=1_000)
    try:
        system.register(make_tool("escape", _escape_and_wait, timeout_ms=60_000), untrusted=True)
        future = system.start_loop("s").submit_turn([ToolCall("e", "escape", json.dumps({"tag": tag}))])
        assert wait_for(lambda: bool(_sleepers(tag)))
        [sleeper] = _sleepers(tag)
        assert os.getsid(sleeper.pid) == sleeper.pid
    finally:
        system.stop()
    assert future.result(WAIT_S)[0].error_kind is ErrorKind.CANCELLED
    assert wait_for(lambda: _gone([sleeper.pid]))


def test_a_stop_cut_short_by_shutdown_ms_leaves_no_idle_workers_cgroup(tmp_path: Path) -> None:
    """A system stopped with a ``shutdown_ms`` too short to reap its killed workers (1 ms)
    still removes each idle worker's cgroup (and private folder) before ``stop()``
    returns: before, the reap got no time, each cgroup was left to a thread waiting for its
    tree's end, and a host that exited after ``stop()`` left them in its cgroup's parent
    for good (a later start sweeps only hosts no longer running)."""
    from rho_actors.sandbox.confine import cgroups

    if isinstance(cgroups.find_hierarchy(), str):
        pytest.skip(f"no cgroup: {cgroups.find_hierarchy()}")
    before = set(_leftovers(os.getpid()))
    system = ActorSystem(tmp_path, untrusted=READS, warm_workers=1, shutdown_ms=1)
    try:
        assert system.register(make_tool("echo", lambda args, ctx: "hi"), untrusted=True).info
        [result] = system.start_loop("s").run_turn([ToolCall("c", "echo", "{}")])
        assert result.ok, result.content
        made = set(_leftovers(os.getpid())) - before
        assert any(p.parent != Path(tempfile.gettempdir()) for p in made), made  # the workers' cgroups
    finally:
        system.stop()
    assert sorted(p for p in made if p.exists()) == []
