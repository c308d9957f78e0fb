"""Registration at scale: registering N tools (default 10,000) with
``ActorSystem.register_many`` and with a loop of ``register`` calls (the baseline,
measured in the same run), and a loop's ``offered()`` over all of them.

Goals (issue "per call ahead of the OpenAI Agents SDK"): 10,000 tools registered in at
most 10 s in all, and ``offered()`` of 10,000 tools in at most 50 ms. With
``--before REV`` the ``register`` loop is also run against the package as it was at git
revision ``REV`` (extracted to a temporary folder and run in a child process), for
``--before-tools`` tools (default 1,000: before the change every registration rebuilt
the whole tool set, so N tools took time growing as N²).

Also printed: ``offered()`` followed by a read of every schema, and
``declarations("openai")``, the costs of callers that read every schema. ``--no-loop``
skips the ``register`` loop (for repeated ``offered()`` runs, e.g. alternating with an
older tree put first on ``PYTHONPATH``).

    .venv/bin/python benchmarks/bench_registry.py [--tools N] [--quick] [--json] [--before REV] [--no-loop]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from stats import environment, summary, verdict

GOAL_REGISTER_S = 10.0
GOAL_OFFERED_MS = 50.0
SCHEMA = {  # what @tool makes of ``def add(a: int, b: int = 0)``
    "additionalProperties": False,
    "properties": {"a": {"title": "A", "type": "integer"}, "b": {"default": 0, "title": "B", "type": "integer"}},
    "required": ["a"],
    "type": "object",
}


class Adder:
    """A tool object; each one has its own name."""

    def __init__(self, index: int) -> None:
        self.index = index

    def name(self) -> str:
        return f"add_{self.index}"

    def description(self) -> str:
        return "Add two integers."

    def parameter_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = json.loads(json.dumps(SCHEMA))
        return schema

    def run(self, args: dict[str, Any], ctx: Any) -> int:
        return int(args["a"]) + int(args.get("b", 0))


def measure(n: int, bulk: bool, loop: bool, offered_samples: int) -> dict[str, Any]:
    """Seconds to register ``n`` tools each way asked for, and ``offered()`` in ms."""
    from rho_actors import ActorSystem, ToolCall

    report: dict[str, Any] = {"tools": n}
    with tempfile.TemporaryDirectory() as data_dir:
        if loop:
            with ActorSystem(data_dir=data_dir) as system:
                tools = [Adder(i) for i in range(n)]
                started, cpu = time.perf_counter(), time.process_time()
                for tool in tools:
                    system.register(tool)
                report["register_loop_s"] = round(time.perf_counter() - started, 3)
                report["register_loop_cpu_s"] = round(time.process_time() - cpu, 3)
        if bulk:
            with ActorSystem(data_dir=data_dir) as system:
                tools = [Adder(i) for i in range(n)]
                started, cpu = time.perf_counter(), time.process_time()
                registrations = system.register_many(tools)
                report["register_many_s"] = round(time.perf_counter() - started, 3)
                report["register_many_cpu_s"] = round(time.process_time() - cpu, 3)
                if not all(r.offered for r in registrations):
                    raise RuntimeError("a tool was left out")
                session = system.start_loop("bench")
                times, cpu_times, read_all, declarations = [], [], [], []
                for _ in range(offered_samples):
                    started, cpu = time.perf_counter(), time.thread_time()
                    offered = session.offered()
                    times.append((time.perf_counter() - started) * 1000)
                    cpu_times.append((time.thread_time() - cpu) * 1000)
                    if len(offered) != n:
                        raise RuntimeError(f"offered {len(offered)} tools, not {n}")
                    del offered
                for _ in range(max(1, offered_samples // 4)) if offered_samples else ():
                    started = time.perf_counter()  # a caller that reads every schema
                    if sum(len(info.parameter_schema) for info in session.offered()) != 4 * n:
                        raise RuntimeError("a schema is not the registered one")
                    read_all.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    if len(session.declarations("openai")) != n:
                        raise RuntimeError("a declaration is missing")
                    declarations.append((time.perf_counter() - started) * 1000)
                if times:
                    report["offered_ms"] = summary(times)
                    report["offered_cpu_ms"] = summary(cpu_times)
                    report["offered_read_all_ms"] = summary(read_all)
                    report["declarations_ms"] = summary(declarations)
                [result] = session.run_turn([ToolCall("c1", f"add_{n - 1}", '{"a": 1, "b": 2}')])
                if result.content != "3":
                    raise RuntimeError(f"the last tool answered {result.content!r}")
    return report


def before(rev: str, n: int) -> dict[str, Any]:
    """The ``register`` loop against the package at git revision ``rev`` (a child process)."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "rho_actors"], capture_output=True,
                                 check=True).stdout
        with tempfile.TemporaryFile() as file:
            file.write(archive)
            file.seek(0)
            with tarfile.open(fileobj=file) as tar:
                tar.extractall(tree, filter="data")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, str(Path(__file__).parent)])}
        proc = subprocess.run([sys.executable, __file__, "--tools", str(n), "--loop-only", "--json"],
                              capture_output=True, text=True, env=env, check=False, cwd=tree)
        if proc.returncode != 0:
            raise RuntimeError(f"the run at {rev} failed: {proc.stderr[-2000:]}")
        report: dict[str, Any] = json.loads(proc.stdout)
        return {"rev": rev, **report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=None, help="tools to register (default 10,000; quick: 1,000)")
    parser.add_argument("--quick", action="store_true", help="1,000 tools, fewer samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--before", default=None, metavar="REV", help="also time the register loop at git REV")
    parser.add_argument("--before-tools", type=int, default=1000, metavar="N", help="tools for --before")
    parser.add_argument("--no-loop", action="store_true", help="skip the register loop (offered() runs)")
    parser.add_argument("--loop-only", action="store_true", help=argparse.SUPPRESS)  # the --before child
    args = parser.parse_args()
    n = args.tools or (1000 if args.quick else 10_000)
    if args.loop_only:
        print(json.dumps(measure(n, bulk=False, loop=True, offered_samples=0)))
        return
    report = measure(n, bulk=True, loop=not args.no_loop, offered_samples=5 if args.quick else 20)
    report["environment"] = environment(args.quick)
    scale = n / 10_000  # the goals are for 10,000 tools; both costs grow linearly
    goal_s, goal_ms = GOAL_REGISTER_S * scale, GOAL_OFFERED_MS * scale
    report["goals"] = {
        "register_many_s": {"goal": goal_s, "ok": report["register_many_s"] <= goal_s},
        "offered_ms": {"goal": goal_ms, "ok": report["offered_ms"]["p50"] <= goal_ms},
    }
    if args.before:
        old = before(args.before, args.before_tools)
        now = measure(args.before_tools, bulk=True, loop=True, offered_samples=0)
        report["before"] = {"tools": args.before_tools, "rev": args.before,
                            "register_loop_s": old["register_loop_s"],
                            "register_loop_cpu_s": old["register_loop_cpu_s"],
                            "now_register_loop_s": now["register_loop_s"],
                            "now_register_loop_cpu_s": now["register_loop_cpu_s"],
                            "now_register_many_s": now["register_many_s"]}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    goals = report["goals"]
    print(f"{n} tools (load {report['environment']['load_avg_1m']}); goals scaled to {n} tools")
    print(f"  register_many         {report['register_many_s']:8.3f} s   goal <= {goals['register_many_s']['goal']:g} s"
          f"   {verdict(goals['register_many_s']['ok'])}   (CPU {report['register_many_cpu_s']} s, all threads)")
    if "register_loop_s" in report:
        print(f"  register loop         {report['register_loop_s']:8.3f} s   "
              f"(register_many / loop = {report['register_many_s'] / report['register_loop_s']:.3f}; "
              f"CPU {report['register_loop_cpu_s']} s)")
    print(f"  offered() p50         {report['offered_ms']['p50']:8.2f} ms  goal <= {goals['offered_ms']['goal']:g} ms"
          f"  {verdict(goals['offered_ms']['ok'])}   (p99 {report['offered_ms']['p99']} ms; "
          f"thread CPU p50 {report['offered_cpu_ms']['p50']} ms)")
    print(f"  offered(), every schema read p50 {report['offered_read_all_ms']['p50']:8.2f} ms; "
          f"declarations('openai') p50 {report['declarations_ms']['p50']:8.2f} ms")
    if "before" in report:
        b = report["before"]
        print(f"  before ({b['rev']}, {b['tools']} tools): register loop {b['register_loop_s']:.3f} s "
              f"(CPU {b['register_loop_cpu_s']} s); now {b['now_register_loop_s']:.3f} s "
              f"(CPU {b['now_register_loop_cpu_s']} s), register_many {b['now_register_many_s']:.3f} s")


if __name__ == "__main__":
    main()
