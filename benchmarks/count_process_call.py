"""The hand-offs of one warm ``process`` call, counted (PROFILE §22).

A measuring aid, not a benchmark with targets: ``N`` warm no-op ``run_turn`` calls of a
``process`` tool (``trusted``, ``untrusted``; ``thread`` for comparison) after 300 of
warm-up, then per call: p50 and mean wall time, the host's CPU, and each thread's (by
name) and the worker's voluntary and involuntary context switches and CPU, read from
``/proc/<pid>/task/*/``, with the load average.

Under callgrind (``--instr-atstart=no``) instructions are counted only over the measured
calls (switched on and off around them with ``callgrind_control``; every thread of the
host, not the worker): run it with N = 1,100 and N = 100 and divide the difference of the
totals by 1,000 for the instructions of one call (PROFILE §32).

Usage::

    .venv/bin/python benchmarks/count_process_call.py 2000 trusted,untrusted
    valgrind --tool=callgrind --instr-atstart=no .venv/bin/python benchmarks/count_process_call.py 1100 untrusted
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from rho_actors import ActorSystem, ToolCall

TICK = os.sysconf("SC_CLK_TCK")
Counts = dict[int, tuple[str, int, int, float]]  # thread id -> (name, voluntary, involuntary, CPU s)


class NoOp:
    """The no-op tool."""

    name = staticmethod(lambda: "noop")
    description = staticmethod(lambda: "Do nothing.")
    parameter_schema = staticmethod(lambda: {"type": "object", "properties": {}})

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        return "ok"


def task_counts(pid: int, names: Mapping[int, str]) -> Counts:
    """Each thread of ``pid``: its name (``names``, else the kernel's), switches and CPU."""
    out: Counts = {}
    base = f"/proc/{pid}/task"
    if not os.path.isdir(base):  # a spare retired meanwhile (it served no measured call)
        return out
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/status") as f:
                status = f.read()
            with open(f"{base}/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = names.get(int(tid)) or status.split("\n", 1)[0].split("\t", 1)[1]
        voluntary = int(status.split("voluntary_ctxt_switches:\t")[1].split("\n")[0])
        involuntary = int(status.split("nonvoluntary_ctxt_switches:\t")[1].split("\n")[0])
        fields = stat.rsplit(")", 1)[1].split()
        out[int(tid)] = (name, voluntary, involuntary, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def by_name(before: Counts, after: Counts) -> dict[str, list[float]]:
    """What each thread name added from ``before`` to ``after``: [voluntary, involuntary, CPU s]."""
    added: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for tid, (name, voluntary, involuntary, cpu) in after.items():
        _, v0, i0, c0 = before.get(tid, (name, 0, 0, 0.0))
        row = added[name]
        row[0] += voluntary - v0
        row[1] += involuntary - i0
        row[2] += cpu - c0
    return added


def instrument(on: bool) -> None:
    """Switch callgrind's counting on or off (nothing when not run under valgrind)."""
    if "vgpreload" in os.environ.get("LD_PRELOAD", ""):
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def count(kind: str, n: int) -> None:
    """Run and print the counts of ``n`` warm calls of a ``kind`` no-op."""
    with tempfile.TemporaryDirectory() as tmp, ActorSystem(tmp, warm_workers=1) as system:
        if kind == "untrusted":
            system.register(NoOp, untrusted=True)
        else:
            system.register(NoOp, isolation="process" if kind == "trusted" else kind)
        loop = system.start_loop("s")
        for _ in range(300):
            [result] = loop.run_turn([ToolCall("c", "noop", "{}")])
            if not result.ok:
                raise SystemExit(f"the no-op failed: {result.content}")
        workers = system.worker_pids()
        names: dict[int, str] = {}
        host_before = task_counts(os.getpid(), names)
        workers_before = {p: task_counts(p, names) for p in workers}
        instrument(True)
        cpu0, t0 = time.process_time(), time.perf_counter()
        latencies = []
        for _ in range(n):
            start = time.perf_counter_ns()
            loop.run_turn([ToolCall("c", "noop", "{}")])
            latencies.append((time.perf_counter_ns() - start) / 1000)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        instrument(False)
        names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id is not None})
        host_after = task_counts(os.getpid(), names)
        workers_after = {p: task_counts(p, names) for p in workers}
    latencies.sort()
    print(f"== {kind}: {n} calls, load {os.getloadavg()[0]:.2f}; p50 {latencies[n // 2]:.0f} us, mean "
          f"{wall / n * 1e6:.0f} us, host CPU {cpu / n * 1e6:.0f} us a call")
    rows = [(f"host {name}", row) for name, row in by_name(host_before, host_after).items()]
    rows += [(f"worker {p}", row) for p in workers for row in by_name(workers_before[p], workers_after[p]).values()]
    for label, (voluntary, involuntary, spent) in rows:
        if voluntary or involuntary:
            print(f"   {label:36s} voluntary {voluntary / n:5.2f} involuntary {involuntary / n:5.2f} "
                  f"CPU {spent / n * 1e6:6.0f} us")


if __name__ == "__main__":
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for which in (sys.argv[2] if len(sys.argv) > 2 else "trusted,untrusted").split(","):
        count(which, calls)
