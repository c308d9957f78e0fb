"""A process stopped with ``SIGSTOP`` never holds a stop (:mod:`rho_actors.otp.pidfds`,
:func:`rho_actors.sandbox.processes.release_servers`).

A worker the pool started runs ``setsid`` as it begins; one stopped before that point
(a hostile round's ``SIGSTOP`` of a fresh spare) leads no process group, so a kill of
"the group it leads" reached no process: it lived on, stopped, with its copy of the fork
server's "alive" pipe, and the last ``release_servers`` waited, with no bound, for a fork
server that never saw the pipe's end (CI's ``make test``, 1 in a few runs under load:
``test_a_call_does_not_wait_on_a_stopped_spare_past_when_it_is_overdue`` hung in
``multiprocessing``'s ``os.waitpid`` of the fork server until pytest's timeout).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from rho_actors.otp.pidfds import PidFd

from .conftest import WAIT_S
from .helpers import run_host_script

pytestmark = pytest.mark.timeout(4 * WAIT_S)


@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "running"])
def test_a_group_kill_ends_a_process_that_leads_no_group(stopped: bool) -> None:
    """``PidFd.kill(group=True)`` of a process in its parent's group (it has not made its
    own yet) ends the process itself, stopped or not (before: ``ESRCH`` for the group it
    does not lead, and nothing was signalled), and leaves the group it is in alone (this
    test's own)."""
    proc = subprocess.Popen(["sleep", "120"])
    held = PidFd.open(proc.pid)
    try:
        if stopped:
            proc.send_signal(signal.SIGSTOP)
        held.kill(group=True)
        assert proc.wait(WAIT_S) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait(WAIT_S)
        held.close()


HOST = """
import json, os, signal, time
from loguru import logger
from rho_actors.sandbox import processes

logger.enable("rho_actors")

processes._SERVER_STOP_S = 1.0  # the bound this test waits out (5 s by default)
processes.hold_servers()
child = processes.context("forkserver").Process(target=time.sleep, args=(600,))
child.start()
processes._spawned.append(child.pid)  # one of rho's own children, whose kill missed it
os.kill(child.pid, signal.SIGSTOP)  # stopped, with its copy of the fork server's pipe
began = time.monotonic()
processes.release_servers()
took = time.monotonic() - began
try:
    with open(f"/proc/{child.pid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
except FileNotFoundError:
    state = "gone"
print(json.dumps({"took": took, "child": state}))
"""


def test_the_last_release_ends_a_fork_server_a_stopped_child_keeps_alive(tmp_path: Path) -> None:
    """A child of ``multiprocessing``'s fork server, stopped while it holds the fork
    server's "alive" pipe, keeps the fork server from ever seeing the pipe's end: the last
    ``release_servers`` waits for the fork server within its bound, then kills the fork
    server's tree (the child too) and returns (before: it waited in ``multiprocessing``'s
    unbounded ``os.waitpid`` for good, and this host never ended)."""
    done = run_host_script(tmp_path, HOST, timeout_s=4 * WAIT_S)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["child"] in ("gone", "Z"), seen  # killed with its fork server (a zombie of init's at most)
    assert seen["took"] < 2 * WAIT_S, seen
    assert "did not exit within 1 s of its release" in done.stderr, done.stderr
