"""Part 7 of ``bench_isolation.py``: a system's first ``process`` calls (DESIGN §5
"Starting a worker").

(a) **First call after registration.** A fresh ``ActorSystem`` registers a trusted no-op
    ``process`` tool (and the same tool in ``thread`` isolation); once registration had
    time to finish (its pool's warm workers idle and holding the tool, waited for, not
    timed), a session's first turn calls the thread tool (timed apart: what a session's
    first call costs in any isolation, its folder made, its first call thread started),
    then, after :data:`PAUSE_S` idle, its first ``process`` call is timed, then warm
    calls of the same session back to back, then one more after the same idle pause
    (a worker woken from idle, as an agent's calls seconds apart find it). Each
    round is a new system (so a new fork server). Ratio: first process call p50 / warm
    call p50. Target <= 2. The system's very first call, a process call opening the
    session, is timed in other rounds and shown beside it.
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
PAUSE_S = 0.2
"""The idle pause before the first process call, and before the warm call after a pause."""


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


def _timed(loop: Any, arguments: str = "{}", tool: str = "quick") -> float:
    t0 = time.perf_counter_ns()
    [result] = loop.run_turn([ToolCall("c", tool, arguments)])
    elapsed = (time.perf_counter_ns() - t0) / 1_000
    if not result.ok:
        raise BenchmarkError(f"a process call failed: {result.error_kind}: {result.content}")
    return elapsed


class QuickThread(Quick):
    """:class:`Quick` in ``thread`` isolation."""

    name = staticmethod(lambda: "quick_thread")


def _warmed(system: ActorSystem) -> None:
    """Until registration had time to finish: the warm workers idle, each holding the tool
    (no ``workers_loaded`` count: a pool that loads no tool ahead, as before #40)."""
    until = time.monotonic() + WARM_WAIT_S
    while system.stats().get("workers_idle", 0) < 2 or system.stats().get("workers_loaded", 2) < 2:
        if time.monotonic() > until:
            raise BenchmarkError(f"no warm worker {WARM_WAIT_S:g} s after registration")
        time.sleep(0.01)


def bench_first_call(rounds: int, warm_calls: int) -> dict[str, Any]:
    """(a): first process call after registration, next to warm calls, in ``rounds`` new
    systems; in as many more, the system's very first call (a process call opening its
    session)."""
    first: list[float] = []
    session_first: list[float] = []
    opening: list[float] = []
    warm: list[float] = []
    paused: list[float] = []
    for i in range(2 * rounds):
        with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(tmp) as system:
            system.register(Quick, isolation="process")
            system.register(QuickThread, isolation="thread")
            _warmed(system)
            loop = system.start_loop("s")
            if i % 2:
                opening.append(_timed(loop))
                continue
            session_first.append(_timed(loop, tool="quick_thread"))
            time.sleep(PAUSE_S)
            first.append(_timed(loop))
            warm.extend(_timed(loop) for _ in range(warm_calls))
            time.sleep(PAUSE_S)
            paused.append(_timed(loop))
    ratio = percentile(first, 50) / percentile(warm, 50)
    return {"first_us": summary(first), "warm_us": summary(warm), "session_first_thread_us": summary(session_first),
            "system_first_us": summary(opening), "system_first_ratio": percentile(opening, 50) / percentile(warm, 50),
            "paused_us": summary(paused), "paused_ratio": percentile(first, 50) / percentile(paused, 50),
            "ratio": ratio, "target": FIRST_CALL_TARGET, "pass": ratio <= FIRST_CALL_TARGET}


def bench_concurrent_first_calls(load: int | None = None) -> dict[str, Any]:
    """(b): 30 concurrent first calls at a 2 s deadline, on a loaded machine."""
    load_before = os.getloadavg()[0]
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
        "calls": CONCURRENT_CALLS, "load_processes": len(spinners), "load_avg_1m_before": round(load_before, 2),
        "timeout_ms": CONCURRENT_TIMEOUT_MS,
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
    print(f"   first process call after registration     {f['first_us']['p50']:>10.1f} / {f['first_us']['p99']:>10.1f}"
          f"   n={f['first_us']['n']}")
    print(f"   (its session's first turn, a thread call   {f['session_first_thread_us']['p50']:>10.1f} / "
          f"{f['session_first_thread_us']['p99']:>10.1f}   n={f['session_first_thread_us']['n']})")
    print(f"   (the system's first call, opening its session {f['system_first_us']['p50']:>7.1f} / "
          f"{f['system_first_us']['p99']:>10.1f}   n={f['system_first_us']['n']}: {f['system_first_ratio']:.2f}x warm)")
    print(f"   warm call                                 {f['warm_us']['p50']:>10.1f} / {f['warm_us']['p99']:>10.1f}"
          f"   n={f['warm_us']['n']}")
    print(f"   warm call after the same {PAUSE_S:g} s idle      {f['paused_us']['p50']:>10.1f} / "
          f"{f['paused_us']['p99']:>10.1f}   n={f['paused_us']['n']}: first / it {f['paused_ratio']:.2f}x")
    print(f"   ratio first / warm (p50): {f['ratio']:.2f}x   target <= {f['target']:g}x   {verdict(f['pass'])}")
    print(f"   {m['calls']} concurrent first calls, timeout {m['timeout_ms']} ms, {m['load_processes']} spinning "
          f"processes (load before {m['load_avg_1m_before']:.1f}):\n      ok {m['ok']}, timeout {m['timeouts']}, "
          f"unavailable {m['unavailable']}, other "
          f"{m['other_errors']}; all back after {m['done_after_ms']:.0f} ms; latency p50 / p99 "
          f"{m['duration_ms']['p50']:.0f} / {m['duration_ms']['p99']:.0f} ms   target 0 timeouts   "
          f"{verdict(m['pass'])}")
