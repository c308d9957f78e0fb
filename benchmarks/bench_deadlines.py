"""Deadlines under load: how late a 50 ms deadline answers, and whether any call answers
``ok`` after its deadline (DESIGN §5 "A deadline is a deadline").

``--sessions`` sessions (200) each run ``--turns`` turns (25) of ``--calls`` calls (8),
driven by ``--host-threads`` host threads (8) that start every session's turn at once
and wait for them all: 40,000 ``thread`` calls by default, up to sessions x calls of
them running at once. Each turn has one call of ``until_cancelled`` (timeout 50 ms:
it blocks until its ``ctx["cancel"]`` is set, then returns ``ok``: the race between the
deadline and a tool that returns when cancelled), one of ``near_deadline`` (timeout
50 ms: it sleeps 45 to 55 ms, then returns ``ok``) and the rest no-op calls.

Printed: the lateness of each ``timeout`` result (the time the host's ``on_result``
got it, minus the call's deadline; p50, p99, max in ms; goal: p99 <= 50 ms), how late
it was decided (its ``duration_ms`` minus 50 ms: when its timer fired, or the thread
that first saw the deadline passed settled it), and the
count of ``ok`` results that came into being after their deadline (``until_cancelled``
answering ``ok`` at all, or ``near_deadline`` returning ``ok`` at or past its deadline;
goal 0), with the load average. Nothing is asserted: the exit code is 0 unless a
measurement could not be made.

Usage::

    .venv/bin/python benchmarks/bench_deadlines.py           # full run (40,000 calls)
    .venv/bin/python benchmarks/bench_deadlines.py --quick   # smoke run (800 calls)
    .venv/bin/python benchmarks/bench_deadlines.py --json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import environment, percentile, publish, verdict

from rho_actors import ActorSystem, ToolCall, ToolResult, tool

LATENESS_GOAL_MS = 50.0
DEADLINE_MS = 50
WAIT_S = 30.0  # the bound of every wait of a tool: never reached unless the runtime is broken

# (session, call id) -> the call's deadline, and (for near_deadline) when the tool returned
DEADLINES: dict[tuple[str, str], float] = {}
RETURNED: dict[tuple[str, str], float] = {}


@tool(timeout_ms=DEADLINE_MS)
def until_cancelled(ctx: Mapping[str, Any]) -> str:
    """Block until cancelled, then return."""
    DEADLINES[(ctx["session_id"], ctx["call_id"])] = ctx["deadline"]
    ctx["cancel"].wait(WAIT_S)
    return "returned when cancelled"


@tool(timeout_ms=DEADLINE_MS)
def near_deadline(ctx: Mapping[str, Any]) -> str:
    """Sleep 45 to 55 ms, then return."""
    key = (ctx["session_id"], ctx["call_id"])
    DEADLINES[key] = ctx["deadline"]
    time.sleep(random.uniform(0.045, 0.055))
    RETURNED[key] = time.monotonic()
    return "slept"


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def run(sessions: int, turns: int, calls: int, host_threads: int) -> dict[str, Any]:
    """Run the load; returns the report's figures."""
    DEADLINES.clear()
    RETURNED.clear()
    # (session, call id) -> (when on_result got it, its error kind or "ok", its duration_ms): plain
    # values only, so that what the benchmark keeps adds nothing to the collector's full passes
    settled: dict[tuple[str, str], tuple[float, str, float]] = {}
    counted = [0]  # results of the turns' futures, under count_lock
    count_lock = threading.Lock()
    load_before = environment(False)["load_avg_1m"]
    with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(
        tmp, abandoned_threads=sessions * 4, abandoned_threads_per_session=calls, tracing=False,
    ) as system:
        for t in (until_cancelled, near_deadline, noop):
            system.register(t)
        loops = [system.start_loop(f"s{i}") for i in range(sessions)]
        names = ["until_cancelled", "near_deadline"] + ["noop"] * max(0, calls - 2)

        def drive(mine: Sequence[Any]) -> None:
            for turn in range(turns):
                futures: list[concurrent.futures.Future[list[ToolResult]]] = []
                for loop in mine:
                    session = loop.session_id

                    def on_result(index: int, result: ToolResult, session: str = session) -> None:
                        settled[(session, result.call_id)] = (time.monotonic(), str(result.error_kind or "ok"),
                                                              result.duration_ms)

                    batch = [ToolCall(f"t{turn}c{i}", name, "{}") for i, name in enumerate(names[:calls])]
                    futures.append(loop.submit_turn(batch, on_result=on_result))
                for future in futures:
                    got = len(future.result(WAIT_S * 4))
                    with count_lock:
                        counted[0] += got

        t0 = time.perf_counter()
        shares = [loops[i::host_threads] for i in range(host_threads)]
        with concurrent.futures.ThreadPoolExecutor(host_threads) as pool:
            for done in [pool.submit(drive, share) for share in shares if share]:
                done.result()
        wall = time.perf_counter() - t0
        abandoned = system.stats().get("abandoned_threads_total", 0)
    lateness: list[float] = []
    decided: list[float] = []  # when the timeout was decided (its duration_ms), past the deadline
    ok_after = 0
    kinds: dict[str, int] = {}
    for key, deadline in DEADLINES.items():
        at, kind, duration_ms = settled[key]
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "ok":
            returned = RETURNED.get(key)
            if returned is None or returned >= deadline:  # until_cancelled answered ok, or ok made too late
                ok_after += 1
        else:
            lateness.append((at - deadline) * 1000)
            decided.append(duration_ms - DEADLINE_MS)
    if not lateness:
        raise RuntimeError("no call timed out: the load did not run as planned")
    return {
        "calls": counted[0],
        "without_on_result": counted[0] - len(settled),
        "deadline_calls": len(DEADLINES),
        "outcomes_of_deadline_calls": kinds,
        "wall_s": round(wall, 2),
        "abandoned_threads_total": abandoned,
        "lateness_ms": {
            "n": len(lateness),
            "p50": round(percentile(lateness, 50), 2),
            "p99": round(percentile(lateness, 99), 2),
            "max": round(max(lateness), 2),
        },
        "decided_ms": {
            "p50": round(percentile(decided, 50), 2),
            "p99": round(percentile(decided, 99), 2),
            "max": round(max(decided), 2),
        },
        "ok_after_deadline": ok_after,
        "load_avg_1m_before": load_before,
        "goal_p99_ms": LATENESS_GOAL_MS,
    }


def print_text(report: Mapping[str, Any]) -> None:
    env, r = report["environment"], report["deadlines"]
    late = r["lateness_ms"]
    print(f"deadlines under load ({env['mode']}; Python {env['python']}, {env['cpus']} CPUs, "
          f"load {r['load_avg_1m_before']} before, {env['load_avg_1m']} after)")
    print(f"  {r['calls']} calls ({r['without_on_result']} without on_result) in {r['wall_s']} s; "
          f"{r['deadline_calls']} with a {DEADLINE_MS} ms deadline: {r['outcomes_of_deadline_calls']}; "
          f"abandoned threads {r['abandoned_threads_total']}")
    d = r["decided_ms"]
    print(f"  timeout decided past the deadline (ms, from its duration): p50 {d['p50']}  p99 {d['p99']}  "
          f"max {d['max']}")
    print(f"  timeout lateness (ms): p50 {late['p50']}  p99 {late['p99']}  max {late['max']}  (n={late['n']}; "
          f"goal p99 <= {LATENESS_GOAL_MS:g}) {verdict(late['p99'] <= LATENESS_GOAL_MS)}")
    ok_after = r["ok_after_deadline"]
    print(f"  ok results after their deadline: {ok_after} (goal 0) {verdict(ok_after == 0)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 sessions x 5 turns")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sessions", type=int, default=None, help="sessions (default 200; 20 with --quick)")
    parser.add_argument("--turns", type=int, default=None, help="turns per session (default 25; 5 with --quick)")
    parser.add_argument("--calls", type=int, default=8, help="calls per turn, at least 2 (default 8)")
    parser.add_argument("--host-threads", type=int, default=8, help="host threads driving the sessions (default 8)")
    args = parser.parse_args(argv)
    if args.calls < 2:
        parser.error("--calls must be at least 2")
    sessions = args.sessions or (20 if args.quick else 200)
    turns = args.turns or (5 if args.quick else 25)
    started = time.perf_counter_ns()
    figures = run(sessions, turns, args.calls, args.host_threads)
    report = {"environment": environment(args.quick, sessions=sessions, turns=turns), "deadlines": figures}
    return publish(report, started, args.json, print_text)


if __name__ == "__main__":
    threading.current_thread().name = "bench-deadlines"
    sys.exit(main())
