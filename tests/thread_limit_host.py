"""A host that meets a call's deadline at its thread limit, for test_thread_starts: run as
``python thread_limit_host.py ISOLATION CGROUP READY_FILE`` by a process already in the
pids cgroup ``CGROUP`` (cgroup v1). It starts a system, makes one call of a tool that
outlives its deadline (``thread``: it sleeps; ``process``: its code's pickling sleeps, so
the call never reaches a worker and its backstop answers it), and once the call is under
way sets the cgroup's ``pids.max`` to the tasks it has: no thread can be started when the
deadline is met. It prints the call's result as JSON, or ``LOST`` when none came."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rho_actors import ActorSystem, ToolCall
from tests.helpers import make_tool


class _SlowToPickle:
    def __reduce__(self) -> tuple[Any, ...]:
        Path(sys.argv[3]).touch()
        time.sleep(20)
        return (int, ())


SLOW = _SlowToPickle()


def _outlives(args: Any, ctx: Any) -> str:
    if sys.argv[1] == "thread":
        Path(sys.argv[3]).touch()
        time.sleep(20)
    return repr(SLOW)


def main() -> None:
    isolation, cgroup, ready = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    with tempfile.TemporaryDirectory() as data, ActorSystem(data_dir=data, shutdown_ms=1_000) as system:
        system.register(make_tool("outlives", _outlives, timeout_ms=300), isolation=isolation)
        loop = system.start_loop("s")
        turn = loop.submit_turn([ToolCall("c1", "outlives", "{}")])
        until = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < until:
            time.sleep(0.01)
        limit = (cgroup / "pids.max").read_text()
        (cgroup / "pids.max").write_text((cgroup / "pids.current").read_text())
        try:
            [result] = turn.result(15)
            print(json.dumps({"call_id": result.call_id, "error_kind": str(result.error_kind)}), flush=True)
        except TimeoutError:
            print("LOST", flush=True)
        finally:
            (cgroup / "pids.max").write_text(limit)


if __name__ == "__main__":
    main()
