"""A host whose main script starts threads at import (numpy's OpenBLAS, torch, many
clients) runs trusted ``process`` tools and ``ProcessActor`` servers (DESIGN §5): the
trusted worker re-imports the script, so it is multi-threaded before it runs anything,
and the containment of a trusted worker needs no single-threaded process. The untrusted
path still refuses to confine a multi-threaded process (tests/test_confinement.py), and
its children never import the host's script (tests/test_clean_start.py). The host runs
as a real subprocess: what matters is its own ``__main__``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import WAIT_S
from tests.helpers import run_host_script

HOST = f"WAIT_S = {WAIT_S}  # tests/conftest.py's bound, in this host too\n" + '''
import json, os, sys, threading

import numpy as np  # OpenBLAS starts its threads here, in every process importing this script

from rho_actors import ActorSystem, ChildSpec, ToolCall, tool
from rho_actors.isolation.servers import ProcessActor, ServerCall


@tool(timeout_ms=int(WAIT_S * 1000))
def total(n: int) -> str:
    """The sum of 0..n-1, and how many threads the worker has."""
    return json.dumps({"sum": int(np.arange(n).sum()), "threads": threading.active_count(),
                       "os_threads": len(os.listdir("/proc/self/task")), "pid": os.getpid()})


class Matrix:
    def __init__(self) -> None:
        self.m = np.eye(3)

    def trace(self) -> float:
        return float(np.trace(self.m @ self.m))


if __name__ == "__main__":
    out = {"host_threads": len(os.listdir("/proc/self/task"))}
    with ActorSystem(sys.argv[1]) as system:
        system.register(total, isolation="process")
        system.start_child(ChildSpec("matrix", ProcessActor(Matrix), name="matrix"))
        [r] = system.start_loop("s").run_turn([ToolCall("c1", "total", json.dumps({"n": 10}))])
        out["tool"] = {"ok": r.ok, "content": r.content}
        ref = system.whereis("matrix")
        out["server"] = ref.ask(ServerCall("trace"), timeout=WAIT_S)
    print(json.dumps(out))
'''


def test_a_host_importing_numpy_runs_process_tools_and_servers(tmp_path: Path) -> None:
    done = run_host_script(tmp_path, HOST, str(tmp_path / "data"))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["host_threads"] > 1  # the premise: importing the script starts threads
    assert out["tool"]["ok"], out["tool"]["content"]
    found = json.loads(out["tool"]["content"])
    assert found["sum"] == 45 and found["pid"] != os.getpid()
    assert out["server"] == 3.0
    assert "single-threaded" not in done.stderr
