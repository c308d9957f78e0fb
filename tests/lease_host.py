"""A host process for tests/test_session_lease.py: ``python -m tests.lease_host DATA_DIR
[--children]``: serves session ``s1``, whose turn holds call ``c1`` for approval as a
task (``input_required``), prints ``TASK <task id>`` and waits to be killed. With
``--children`` it first starts a worker process (a ``process`` tool's call that blocks)
and forks a child without an exec (a tool's ``os.fork``), and prints ``WORKER <pid>``
and ``FORKED <pid>``: both live on when the host is killed alone. Each run of the held
call's tool is appended to ``$RHO_TEST_RUNS``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from rho_actors import ActorSystem, ToolCall, tool
from tests.held_task_host import CALL, wipe_later


@tool
def wait_in_worker(pid_file: str) -> str:
    """Write this worker's pid, then block."""
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(600)
    return "woke"


@tool
def fork_a_child() -> int:
    """Fork a child that sleeps, never exec'd; its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(600)
        finally:
            os._exit(0)
    return pid


def main(data_dir: str, *flags: str) -> None:
    system = ActorSystem(data_dir=data_dir)
    system.register(wipe_later)
    system.register(wait_in_worker, isolation="process")
    system.register(fork_a_child)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([CALL])
    if "--children" in flags:
        pid_file = Path(data_dir) / "worker.pid"
        loop.submit_turn([ToolCall("w1", "wait_in_worker", f'{{"pid_file": "{pid_file}"}}')])
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.01)
        print("WORKER", pid_file.read_text(), flush=True)
        [forked] = loop.run_turn([ToolCall("f1", "fork_a_child", "{}")])
        print("FORKED", forked.content, flush=True)
    print("TASK", ack.details["task_id"], flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(*sys.argv[1:])
