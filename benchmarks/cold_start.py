"""Part 7 of ``bench_isolation.py``: a system's first ``process`` calls (DESIGN §5
"Starting a worker").

(a) **First call after registration.** A fresh ``ActorSystem`` registers a trusted no-op
    ``process`` tool; once registration had time to finish (its pool's warm workers idle,
    waited for, not timed), the system's first call is timed, then warm calls of the same
    session. Each round is a new system (so a new fork server). Ratio: first call p50 /
    warm call p50. Target <= 2.
(b) **30 concurrent first calls under load.** A fresh system registers a trusted
    ``process`` tool declaring ``timeout_ms=2000`` (it sleeps 10 ms) and at once gets 30
    calls from 30 sessions, while ``2 x cores`` processes spin on the CPU. Counted: calls
    that came back ``timeout`` (target 0), ``unavailable`` (no worker within
    ``start_timeout_ms``, 10 s by default) and ok, and the calls' latency.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from stats import BenchmarkError, percentile, summary

from rho_actors import ActorSystem, ToolCall
from rho_actors.tool import ErrorKind

FIRST_CALL_TARGET = 2.0
CONCURRENT_CALLS = 30
CONCURRENT_TIMEOUT_MS = 2_000
WARM_WAIT_S = 60.0


class Quick:
    """A trusted ``process`` tool: sleeps ``ms`` milliseconds (default 0)."""

    name = staticmethod(lambda: "quick")
    description = staticmethod(lambda: "Sleep a little.")
    parameter_schema = staticmethod(lambda: {"type": "object", "properties": {"ms": {"type": "integer"}}})
    timeout_ms = staticmethod(lambda: CONCURRENT_TIMEOUT_MS)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        time.sleep(args.get("ms", 0) / 1000)
        return "ok"


def _timed(loop: Any, arguments: str = "{}") -> float:
    t0 = time.perf_counter_ns()
    [result] = loop.run_turn([ToolCall("c", "quick", arguments)])
    elapsed = (time.perf_counter_ns() - t0) / 1_000
    if not result.ok:
        raise BenchmarkError(f"a process call failed: {result.error_kind}: {result.content}")
    return elapsed


def _warmed(system: ActorSystem) -> None:
    until = time.monotonic() + WARM_WAIT_S
    while system.stats().get("workers_idle", 0) < 1:
        if time.monotonic() > until:
            raise BenchmarkError(f"no warm worker {WARM_WAIT_S:g} s after registration")
        time.sleep(0.01)


def bench_first_call(rounds: int, warm_calls: int) -> dict[str, Any]:
    """(a): first call after registration, next to warm calls, in ``rounds`` new systems."""
    first: list[float] = []
    warm: list[float] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(tmp) as system:
            system.register(Quick, isolation="process")
            _warmed(system)
            loop = system.start_loop("s")
            first.append(_timed(loop))
            warm.extend(_timed(loop) for _ in range(warm_calls))
    ratio = percentile(first, 50) / percentile(warm, 50)
    return {"first_us": summary(first), "warm_us": summary(warm), "ratio": ratio, "target": FIRST_CALL_TARGET,
            "pass": ratio <= FIRST_CALL_TARGET}


def bench_concurrent_first_calls(load: int | None = None) -> dict[str, Any]:
    """(b): 30 concurrent first calls at a 2 s deadline, on a loaded machine."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(load if load is not None else 2 * (os.cpu_count() or 1))]
    try:
        with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(tmp) as system:
            system.register(Quick, isolation="process")
            loops = [system.start_loop(f"c{i}") for i in range(CONCURRENT_CALLS)]
            t0 = time.perf_counter()
            futures = [loop.submit_turn([ToolCall("c", "quick", '{"ms": 10}')]) for loop in loops]
            done = []
            for future in futures:
                [result] = future.result(timeout=120)
                done.append((result, (time.perf_counter() - t0) * 1000))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    kinds = [r.error_kind for r, _ in done]
    return {
        "calls": CONCURRENT_CALLS, "load_processes": len(spinners), "timeout_ms": CONCURRENT_TIMEOUT_MS,
        "ok": sum(1 for r, _ in done if r.ok), "timeouts": kinds.count(ErrorKind.TIMEOUT),
        "unavailable": kinds.count(ErrorKind.UNAVAILABLE), "other_errors": sum(
            1 for r, _ in done if not r.ok and r.error_kind not in (ErrorKind.TIMEOUT, ErrorKind.UNAVAILABLE)),
        "duration_ms": summary([r.duration_ms for r, _ in done]), "done_after_ms": max(t for _, t in done),
        "pass": kinds.count(ErrorKind.TIMEOUT) == 0,
    }


def bench_cold_start(quick: bool) -> dict[str, Any]:
    """Part 7: (a) and (b)."""
    with concurrent.futures.ThreadPoolExecutor(1) as one:  # its own thread: nothing of the caller's kept
        first = one.submit(bench_first_call, 2 if quick else 5, 10 if quick else 30).result()
    return {"first_call": first, "concurrent_first_calls": bench_concurrent_first_calls()}


def print_cold_start(report: dict[str, Any]) -> None:
    from stats import verdict

    c = report["cold_start"]
    f, m = c["first_call"], c["concurrent_first_calls"]
    print("\n7. a system's first process calls (us: p50 / p99, n samples)")
    print(f"   first call after registration             {f['first_us']['p50']:>10.1f} / {f['first_us']['p99']:>10.1f}"
          f"   n={f['first_us']['n']}")
    print(f"   warm call                                 {f['warm_us']['p50']:>10.1f} / {f['warm_us']['p99']:>10.1f}"
          f"   n={f['warm_us']['n']}")
    print(f"   ratio first / warm (p50): {f['ratio']:.2f}x   target <= {f['target']:g}x   {verdict(f['pass'])}")
    print(f"   {m['calls']} concurrent first calls, timeout {m['timeout_ms']} ms, {m['load_processes']} spinning "
          f"processes: ok {m['ok']}, timeout {m['timeouts']}, unavailable {m['unavailable']}, other "
          f"{m['other_errors']}; all back after {m['done_after_ms']:.0f} ms; latency p50 / p99 "
          f"{m['duration_ms']['p50']:.0f} / {m['duration_ms']['p99']:.0f} ms   target 0 timeouts   "
          f"{verdict(m['pass'])}")
