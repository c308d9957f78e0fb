"""Background calls as tasks (DESIGN §4 "Background calls"): what a task's durability
costs.

``--tasks`` (2,000) background calls of a no-op ``async`` tool, one after another, each
started with ``loop.run_turn`` (its acknowledgement) and waited for with
``loop.task_result``, interleaved with the baseline: a ``run_turn`` of the same no-op as
an ordinary call. Printed: p50/p99 of each, the overhead of a task (p50 difference),
and the syncs a task made (its record written at its start and its end; counted by
wrapping ``os.fsync`` and ``os.fdatasync``), with what one ``fsync`` costs on this disk.
Then ``--agent-tasks`` (200) through the agent loop, where each result is
also delivered to the model (its record written a third time).

Usage::

    .venv/bin/python benchmarks/bench_task_durability.py           # full run
    .venv/bin/python benchmarks/bench_task_durability.py --quick   # smoke run (200 tasks)
    .venv/bin/python benchmarks/bench_task_durability.py --json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import environment, fsync_ms, publish, summary

from rho_actors import ActorSystem, Reply, ScriptedModel, ToolCall, tool

FSYNCS = [0]
_fsync, _fdatasync = os.fsync, os.fdatasync


def _counted(fd: Any) -> None:
    FSYNCS[0] += 1
    _fsync(fd)


def _counted_data(fd: Any) -> None:
    FSYNCS[0] += 1
    _fdatasync(fd)


@tool(background=True)
async def slow_noop(n: int) -> str:
    """A no-op run as a task."""
    return "ok"


@tool
async def noop(n: int) -> str:
    """The same no-op, as an ordinary call."""
    return "ok"


def tasks(data_dir: Path, count: int) -> dict[str, Any]:
    task_ms, call_ms = [], []
    fsyncs = 0
    with ActorSystem(data_dir=data_dir) as system:
        system.register(slow_noop)
        system.register(noop)
        loop = system.start_loop("bench")
        for i in range(count):
            started = time.perf_counter_ns()
            loop.run_turn([ToolCall(f"b{i}", "noop", '{"n": 0}')])
            call_ms.append((time.perf_counter_ns() - started) / 1e6)
            before = FSYNCS[0]
            started = time.perf_counter_ns()
            [ack] = loop.run_turn([ToolCall(f"t{i}", "slow_noop", '{"n": 0}')])
            done = loop.task_result(ack.details["task_id"], timeout_s=60)
            task_ms.append((time.perf_counter_ns() - started) / 1e6)
            fsyncs += FSYNCS[0] - before
            assert done.status == "completed", done
    task, call = summary(task_ms, 3), summary(call_ms, 3)
    return {"tasks": count, "task_ms": task, "call_ms": call,
            "task_overhead_ms_p50": round(float(task["p50"]) - float(call["p50"]), 3),
            "fsyncs_per_task": round(fsyncs / max(1, count), 2)}


def agent(data_dir: Path, count: int) -> dict[str, Any]:
    replies = []
    for i in range(count):
        replies += [Reply(tool_calls=(ToolCall(f"t{i}", "slow_noop", '{"n": 0}'),)), Reply(text="started")]
    model = ScriptedModel(replies + [Reply(text="noted")] * count)
    prompt_ms = []
    before = FSYNCS[0]
    with ActorSystem(data_dir=data_dir) as system:
        system.register(slow_noop)
        loop = system.start_loop("agent")
        for _ in range(count):
            started = time.perf_counter_ns()
            result = loop.prompt("go", model=model, wait_for_tasks=False)
            assert result.error is None, result.error
            prompt_ms.append((time.perf_counter_ns() - started) / 1e6)
        for info in loop.tasks():
            loop.task_result(info.task_id, timeout_s=60)
        loop.prompt("and?", model=model)  # the last results delivered
    return {"tasks": count, "prompt_ms": summary(prompt_ms, 3),
            "fsyncs_per_task": round((FSYNCS[0] - before) / max(1, count), 2)}



def run(count: int, agent_count: int) -> dict[str, Any]:
    os.fsync, os.fdatasync = _counted, _counted_data
    try:
        with tempfile.TemporaryDirectory(prefix="rho-bench-tasks-") as tmp:
            report = {"environment": environment(count < 2000, tasks=count),
                      "run_turn": tasks(Path(tmp) / "tasks", count), "fsync_ms": fsync_ms(Path(tmp), _fsync)}
            if agent_count:
                report["agent_loop"] = agent(Path(tmp) / "agent", agent_count)
    finally:
        os.fsync, os.fdatasync = _fsync, _fdatasync
    return report


def print_text(report: Mapping[str, Any]) -> None:
    env, t = report["environment"], report["run_turn"]
    print(f"rho_actors tasks benchmark ({env['mode']}, {env['cpus']} CPUs, load {env['load_avg_1m']})")
    print(f"\n(1) {t['tasks']:,} tasks, started and waited for: p50 {t['task_ms']['p50']} ms (p99 "
          f"{t['task_ms']['p99']}), the same call not as a task p50 {t['call_ms']['p50']} ms: overhead "
          f"{t['task_overhead_ms_p50']} ms; {t['fsyncs_per_task']} syncs a task (one fsync on this disk p50 "
          f"{report['fsync_ms']['p50']} ms)")
    a = report.get("agent_loop")
    if a:
        print(f"(2) {a['tasks']:,} prompts each starting a task (and giving the model the last one's result): "
              f"p50 {a['prompt_ms']['p50']} ms (p99 {a['prompt_ms']['p99']}); {a['fsyncs_per_task']} syncs a "
              "task, the transcript's included")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 tasks, 50 through the agent loop")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--tasks", type=int, default=None, help="tasks (default 2,000)")
    parser.add_argument("--agent-tasks", type=int, default=None, help="tasks through the agent loop (default 200)")
    args = parser.parse_args(argv)
    started = time.perf_counter_ns()
    report = run(args.tasks or (200 if args.quick else 2000), args.agent_tasks or (50 if args.quick else 200))
    return publish(report, started, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
