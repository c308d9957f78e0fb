"""A host process for tests/test_held_tasks_restart.py: ``python -m tests.held_task_host
DATA_DIR``: a turn run directly holds a background call for approval (it waits as a
task, ``input_required``), then the host prints ``TASK <task id>`` and waits to be
killed. Each run of the tool is appended to ``$RHO_TEST_RUNS`` (counted across hosts)."""

from __future__ import annotations

import os
import sys
import time

from rho_actors import ActorSystem, ToolCall, tool


@tool(background=True, requires_approval=True)
def wipe_later(path: str) -> str:
    """Wipe a path as a task, once approved."""
    with open(os.environ["RHO_TEST_RUNS"], "a") as runs:
        runs.write(f"wipe {path}\n")
        runs.flush()
        os.fsync(runs.fileno())
    return f"wiped {path}"


CALL = ToolCall("c1", "wipe_later", '{"path": "/a"}')


def main(data_dir: str) -> None:
    system = ActorSystem(data_dir=data_dir)
    system.register(wipe_later)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([CALL])
    print("TASK", ack.details["task_id"], flush=True)
    time.sleep(300)


if __name__ == "__main__":
    main(*sys.argv[1:])
