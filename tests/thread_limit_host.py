"""A host that meets a call's deadline at its thread limit, for test_thread_starts: run as
``python thread_limit_host.py ISOLATION CGROUP READY_FILE`` by a process already in the
pids cgroup ``CGROUP`` (cgroup v1). It starts a system, makes one call of a tool that
outlives its deadline (``thread``: it sleeps; ``process``: its code's pickling sleeps, so
the call never reaches a worker and its backstop answers it), and once the call is under
way (``READY_FILE``, one per attempt, made) sets the cgroup's ``pids.max`` to the tasks it
has: no thread can be started when the deadline is met. On a loaded machine the deadline
may come before the call is under way (a ``process`` call then never starts): the call is
made again with a longer deadline, each well within the tool's 20 s. It prints the call's
result as JSON, or ``LOST`` when none came."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rho_actors import ActorSystem, ToolCall
from tests.conftest import WAIT_S
from tests.helpers import make_tool

DEADLINES_MS = (300, 1_200, 4_800)


class _SlowToPickle:
    def __init__(self, ready: Path) -> None:
        self.ready = ready

    def __reduce__(self) -> tuple[Any, ...]:
        self.ready.touch()
        time.sleep(20)
        return (int, ())


def _outlives(isolation: str, ready: Path) -> Callable[[Any, Any], str]:
    slow = _SlowToPickle(ready)  # pickled with the tool, when it is shipped to a worker

    def outlives(args: Any, ctx: Any) -> str:
        if isolation == "thread":
            ready.touch()
            time.sleep(20)
        return repr(slow)

    return outlives


def main() -> None:
    isolation, cgroup, ready = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    # the backstop of a call not yet in a worker answers at its start bound plus its deadline: 10 s, well
    # within the pickling's 20 s (the tests' environment raises the default to their hang bound)
    with (tempfile.TemporaryDirectory() as data,
          ActorSystem(data_dir=data, shutdown_ms=1_000, start_timeout_ms=10_000) as system):
        loop = system.start_loop("s")
        for attempt, timeout_ms in enumerate(DEADLINES_MS):
            under_way = Path(f"{ready}.{attempt}")
            system.register(make_tool(f"outlives{attempt}", _outlives(isolation, under_way), timeout_ms=timeout_ms),
                            isolation=isolation)
            turn = loop.submit_turn([ToolCall("c1", f"outlives{attempt}", "{}")])
            until = time.monotonic() + WAIT_S
            while not under_way.exists() and not turn.done() and time.monotonic() < until:
                time.sleep(0.01)
            if under_way.exists():
                break
            turn.result(WAIT_S)  # answered before it was under way: its deadline came first
        else:
            print("NEVER UNDER WAY", flush=True)
            return
        limit = (cgroup / "pids.max").read_text()
        (cgroup / "pids.max").write_text((cgroup / "pids.current").read_text())
        try:
            [result] = turn.result(WAIT_S)
            print(json.dumps({"call_id": result.call_id, "error_kind": str(result.error_kind)}), flush=True)
        except TimeoutError:
            print("LOST", flush=True)
        finally:
            (cgroup / "pids.max").write_text(limit)


if __name__ == "__main__":
    main()
