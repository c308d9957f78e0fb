"""Benchmarks of ``ray`` isolation (rho_actors.isolation.ray_tasks), against its targets.

Everything is measured in one run, on a local Ray started here (loopback, no dashboard,
16 logical CPUs so that 16 tasks can run at once), next to its own baseline:

1. **No-op call.** ``run_on_ray`` of a no-op tool next to a bare Ray task round trip
   (``ray.get(noop.remote())``, same options), interleaved round by round: p50 and p99 in
   microseconds (the three kinds take turns going first). Target: rho p50 / bare p50
   <= 1.2x. For reference, a bare task carrying
   the call's JSON payload and returning it (what Ray itself costs for the arguments).
2. **Parallel calls.** Wall time of 16 calls of a tool that sleeps 100 ms, each through
   ``run_on_ray`` from its own thread (as 16 CallActors would), next to 16 bare Ray tasks
   sleeping 100 ms (``ray.get`` of all): p50 in ms, and the ratio rho / bare, after 3
   warm-up rounds (the first, cold round is printed too).
3. **Deadline to killed worker.** A call of a tool that sleeps past its deadline (500 ms):
   the time from the deadline to the ``timeout`` result, and to its worker process being
   gone (polled every 1 ms).

Targets are reported as PASS/FAIL, never enforced: the exit code is 0 unless a
measurement could not be made.

Usage::

    .venv/bin/python benchmarks/bench_ray.py            # full run, about a minute
    .venv/bin/python benchmarks/bench_ray.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_ray.py --json     # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray
from stats import BenchmarkError, environment, publish, summary, verdict

from rho_actors.cancel import CancelToken
from rho_actors.isolation.ray_tasks import RayResources, RayRuntime, run_on_ray
from rho_actors.tool import ErrorKind

NOOP_TARGET = 1.2
PARALLEL = 16
SLEEP_S = 0.1
DEADLINE_S = 0.5
WARM_ROUNDS = 3  # rounds first run and not counted: Ray starts 16 workers, each gets the tool once


class Noop:
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        return "ok"


class Sleep:
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        if "pid_file" in args:
            Path(args["pid_file"]).write_text(str(os.getpid()))
        time.sleep(args["s"])
        return "slept"


@ray.remote(max_retries=0)
def bare_noop() -> str:
    return "ok"


@ray.remote(max_retries=0)
def bare_echo(payload: str) -> str:
    return payload


@ray.remote(max_retries=0)
def bare_sleep(s: float) -> str:
    time.sleep(s)
    return "slept"


def rho_call(runtime: RayRuntime, tool: Any, args: dict[str, Any], timeout_s: float = 30.0) -> Any:
    return run_on_ray(runtime, tool, args, {"call_id": "c"}, time.monotonic() + timeout_s, CancelToken(), 10_000,
                      RayResources(), name=tool.__name__)


def bench_noop(runtime: RayRuntime, rounds: int) -> dict[str, Any]:
    rho: list[float] = []
    bare: list[float] = []
    echo: list[float] = []
    payload = json.dumps(["0" * 32, "Noop", "c", {}, {"session_id": None, "call_id": "c", "data_dir": None,
                                                     "withheld": []}, 30.0, 10_000])
    def run_rho() -> None:
        result = rho_call(runtime, Noop, {})
        if not result.ok:
            raise BenchmarkError(f"no-op call failed: {result}")

    kinds = [(rho, run_rho), (bare, lambda: ray.get(bare_noop.remote())),
             (echo, lambda: ray.get(bare_echo.remote(payload)))]
    for i in range(rounds + 20):
        for samples, run in kinds[i % 3:] + kinds[:i % 3]:  # each kind goes first in turn
            t0 = time.perf_counter_ns()
            run()
            if i >= 20:  # warm-up
                samples.append((time.perf_counter_ns() - t0) / 1000)
    r, b, e = summary(rho, 0), summary(bare, 0), summary(echo, 0)
    ratio = r["p50"] / b["p50"]
    return {"rho_us": r, "bare_us": b, "bare_with_payload_us": e, "ratio_p50": round(ratio, 2),
            "ratio_vs_payload_p50": round(r["p50"] / e["p50"], 2), "target": NOOP_TARGET,
            "verdict": verdict(ratio <= NOOP_TARGET)}


def bench_parallel(runtime: RayRuntime, rounds: int) -> dict[str, Any]:
    rho: list[float] = []
    bare: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        for i in range(rounds + WARM_ROUNDS):
            t0 = time.perf_counter()
            results = list(pool.map(lambda _: rho_call(runtime, Sleep, {"s": SLEEP_S}), range(PARALLEL)))
            t1 = time.perf_counter()
            ray.get([bare_sleep.remote(SLEEP_S) for _ in range(PARALLEL)])
            t2 = time.perf_counter()
            if not all(r.ok for r in results):
                raise BenchmarkError(f"a parallel call failed: {next(r for r in results if not r.ok)}")
            if i == 0:
                cold = (t1 - t0) * 1000
            if i >= WARM_ROUNDS:
                rho.append((t1 - t0) * 1000)
                bare.append((t2 - t1) * 1000)
    r, b = summary(rho, 1), summary(bare, 1)
    return {"rho_ms": r, "bare_ms": b, "ratio_p50": round(r["p50"] / b["p50"], 2), "rho_cold_ms": round(cold, 1),
            "vs_sleep_p50": round(r["p50"] / (SLEEP_S * 1000), 2)}


def bench_deadline(runtime: RayRuntime, rounds: int) -> dict[str, Any]:
    to_result: list[float] = []
    to_gone: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            pid_file = Path(tmp) / f"pid{i}"
            deadline = time.monotonic() + DEADLINE_S
            result = run_on_ray(runtime, Sleep, {"s": 60, "pid_file": str(pid_file)}, {"call_id": "c"}, deadline,
                                CancelToken(), 10_000, RayResources(), name="Sleep")
            answered = time.monotonic()
            if result.error_kind is not ErrorKind.TIMEOUT or not pid_file.exists():
                raise BenchmarkError(f"expected a timeout of a running task, got {result}")
            pid = int(pid_file.read_text())
            until = answered + 10
            while time.monotonic() < until:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.001)
            else:
                raise BenchmarkError(f"worker {pid} still runs 10 s after its deadline")
            gone = time.monotonic()
            to_result.append((answered - deadline) * 1000)
            to_gone.append((gone - deadline) * 1000)
    return {"deadline_to_result_ms": summary(to_result, 1), "deadline_to_worker_gone_ms": summary(to_gone, 1)}


def print_text(report: Mapping[str, Any]) -> None:
    env = report["environment"]
    print(f"bench_ray ({env['mode']}): python {env['python']}, ray {env['ray']}, {env['cpus']} cpus, "
          f"load {env['load_avg_1m']}, ray.init {report['ray_init_s']} s")
    n = report["noop"]
    print(f"1. no-op call   rho p50 {n['rho_us']['p50']:.0f} us (p99 {n['rho_us']['p99']:.0f}) | bare Ray task p50 "
          f"{n['bare_us']['p50']:.0f} us (p99 {n['bare_us']['p99']:.0f}) | ratio {n['ratio_p50']}x "
          f"(target <= {n['target']}x) {n['verdict']}")
    print(f"                bare task carrying the same JSON payload p50 {n['bare_with_payload_us']['p50']:.0f} us"
          f" | ratio {n['ratio_vs_payload_p50']}x")
    p = report["parallel"]
    print(f"2. {PARALLEL} x {SLEEP_S * 1000:.0f} ms   rho p50 {p['rho_ms']['p50']} ms | bare p50 "
          f"{p['bare_ms']['p50']} ms | ratio {p['ratio_p50']}x; {p['vs_sleep_p50']}x one call's sleep "
          f"(first, cold round: {p['rho_cold_ms']} ms)")
    d = report["deadline"]
    print(f"3. deadline     to timeout result p50 {d['deadline_to_result_ms']['p50']} ms "
          f"(p99 {d['deadline_to_result_ms']['p99']}) | to worker gone p50 {d['deadline_to_worker_gone_ms']['p50']} ms"
          f" (p99 {d['deadline_to_worker_gone_ms']['p99']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run with few samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    opts = parser.parse_args(argv)
    started = time.perf_counter_ns()
    # Ray's own notices (the raylet's warnings) go to stdout: keep them off the report's.
    with contextlib.redirect_stdout(sys.stderr):
        t0 = time.monotonic()
        runtime = RayRuntime({"num_cpus": PARALLEL})
        runtime.connect()
        init_s = round(time.monotonic() - t0, 2)
        try:
            report: dict[str, Any] = {
                "environment": environment(opts.quick, ray=ray.__version__),
                "ray_init_s": init_s,
                "noop": bench_noop(runtime, 30 if opts.quick else 300),
                "parallel": bench_parallel(runtime, 1 if opts.quick else 5),
                "deadline": bench_deadline(runtime, 2 if opts.quick else 5),
            }
        finally:
            runtime.shutdown()
    return publish(report, started, opts.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
