"""Background calls as tasks (DESIGN §4 "Background calls", §6b "Tasks"): what open
tasks hold, and what polling one costs.

(1) ``--tasks`` (1,000) background calls of an ``async`` tool that waits a minute, opened
across 100 sessions: the threads they add to the host and the threads held per open task
(goal: none each; the system's tasks event loop runs them all), and the memory (resident
set) an open task adds, in KiB.
(2) Polling, with those tasks open: ``loop.tasks()``-side ``TaskRegistry.get`` and the
served ``tasks/get`` handler (``ServedTasks.get``: the principal checked, the task
looked up, its ``DetailedTask`` built) of a task created over MCP, each interleaved with
the baseline, ``json.dumps`` of the same ``DetailedTask`` (the least a server answering
it does). Printed: per poll in µs (p50, p99) and the handler ÷ baseline ratio (goal: a
poll costs at most 100 µs).

Usage::

    .venv/bin/python benchmarks/bench_tasks.py           # full run
    .venv/bin/python benchmarks/bench_tasks.py --quick   # smoke run (100 tasks)
    .venv/bin/python benchmarks/bench_tasks.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mcp_types as types
import psutil
from stats import environment, publish, summary, verdict

from rho_actors import ActorSystem, TaskSettings, ToolCall, tool
from rho_actors.mcp.call_results import call_tool_result  # the result a served task inlines
from rho_actors.mcp.tasks import EXTENSION, ServedTask, ServedTasks, TaskParams

POLL_GOAL_US = 100.0
SESSIONS = 100


@tool(background=True, background_timeout_ms=600_000)
async def waits(seconds: float) -> str:
    """Wait ``seconds`` (asyncio), then answer."""
    await asyncio.sleep(seconds)
    return "done"


def opened(system: ActorSystem, count: int) -> tuple[dict[str, Any], list[Any], list[str]]:
    loops = [system.start_loop(f"s{i}") for i in range(SESSIONS)]
    [warm] = loops[0].run_turn([ToolCall("warm", "waits", '{"seconds": 0}')])  # the tasks' event loop, started
    system.task_registry.wait(loops[0].session_id, loops[0].data_dir, warm.details["task_id"], 60)
    gc.collect()
    before, rss_before = threading.active_count(), psutil.Process().memory_info().rss
    task_ids = []
    for n in range(count):
        [ack] = loops[n % SESSIONS].run_turn([ToolCall(f"c{n}", "waits", '{"seconds": 60}')])
        assert ack.ok, ack.content
        task_ids.append(ack.details["task_id"])
    time.sleep(0.5)  # each call started in its isolation
    gc.collect()
    added = threading.active_count() - before
    rss_kib = (psutil.Process().memory_info().rss - rss_before) / 1024
    open_now = system.task_registry.stats()["open"]
    return {"tasks_open": open_now, "threads_added": added, "threads_per_task": round(added / max(1, open_now), 4),
            "rss_per_task_kib": round(rss_kib / max(1, open_now), 1), "goal": "no thread per task",
            "verdict": verdict(added < max(8, count // 100))}, loops, task_ids


def polling(system: ActorSystem, loops: list[Any], task_ids: list[str], rounds: int) -> dict[str, Any]:
    served = ServedTasks(system.task_registry, call_tool_result)
    loop = loops[0]
    session = SimpleNamespace(loop=loop, transcript=None)
    task = ServedTask("local", session, "waits")
    [ack] = loop.run_turn([ToolCall("polled", "waits", '{"seconds": 60}')])
    served.created(task, ack, None)
    ctx = SimpleNamespace(session=SimpleNamespace(client_capabilities=types.ClientCapabilities(
        extensions={EXTENSION: {}})), request=None)
    params = TaskParams(task_id=ack.details["task_id"])
    registry, session_id, data_dir = system.task_registry, loop.session_id, loop.data_dir
    registry_us, handler_us, base_us = [], [], []
    detailed = served.get(ctx, params, "local")
    for _ in range(rounds):
        started = time.perf_counter_ns()
        json.dumps(detailed)
        base_us.append((time.perf_counter_ns() - started) / 1e3)
        started = time.perf_counter_ns()
        registry.get(session_id, data_dir, params.task_id)
        registry_us.append((time.perf_counter_ns() - started) / 1e3)
        started = time.perf_counter_ns()
        served.get(ctx, params, "local")
        handler_us.append((time.perf_counter_ns() - started) / 1e3)
    served.close()
    handler, base = summary(handler_us, 2), summary(base_us, 2)
    return {"registry_get_us": summary(registry_us, 2), "tasks_get_us": handler, "baseline_json_us": base,
            "ratio_p50": round(float(handler["p50"]) / max(0.01, float(base["p50"])), 2),
            "goal": f"<= {POLL_GOAL_US:g} us a poll", "verdict": verdict(float(handler["p50"]) <= POLL_GOAL_US)}


def run(count: int, rounds: int) -> dict[str, Any]:
    settings = TaskSettings(max_tasks=count + 1, max_tasks_per_session=count // SESSIONS + 2)
    with tempfile.TemporaryDirectory(prefix="rho-bench-tasks-") as tmp, \
            ActorSystem(data_dir=tmp, tasks=settings) as system:
        system.register(waits)
        holding, loops, task_ids = opened(system, count)
        polls = polling(system, loops, task_ids, rounds)
    return {"environment": environment(count < 1000, tasks=count, rounds=rounds), "holding": holding,
            "polling": polls}


def print_text(report: Mapping[str, Any]) -> None:
    env, h, p = report["environment"], report["holding"], report["polling"]
    print(f"rho_actors tasks benchmark ({env['mode']}, {env['cpus']} CPUs, load {env['load_avg_1m']})")
    print(f"\n(1) {h['tasks_open']:,} open background tasks of an async tool: {h['threads_added']} threads added "
          f"({h['threads_per_task']} per task), {h['rss_per_task_kib']} KiB resident each  "
          f"goal {h['goal']}: {h['verdict']}")
    print(f"(2) a poll: TaskRegistry.get p50 {p['registry_get_us']['p50']} us; tasks/get handler p50 "
          f"{p['tasks_get_us']['p50']} us (p99 {p['tasks_get_us']['p99']}) vs json.dumps of its answer p50 "
          f"{p['baseline_json_us']['p50']} us: {p['ratio_p50']}x  goal {p['goal']}: {p['verdict']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 100 tasks, 2,000 polls")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--tasks", type=int, default=None, help="open background tasks (default 1,000)")
    args = parser.parse_args(argv)
    started = time.perf_counter_ns()
    report = run(args.tasks or (100 if args.quick else 1000), 2_000 if args.quick else 20_000)
    return publish(report, started, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
