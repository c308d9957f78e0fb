"""Part 7 of ``bench_isolation.py``: a system's first ``process`` calls (DESIGN §5
"Starting a worker").

(a) **First call after registration.** A fresh ``ActorSystem`` registers a trusted no-op
    ``process`` tool (and the same tool in ``thread`` isolation); once registration had
    time to finish (its pool's warm workers idle and holding the tool, waited for, not
    timed), a session's first turn calls the thread tool (timed apart: what a session's
    first call costs in any isolation, its folder made, its first call thread started),
    then, after :data:`PAUSE_S` idle, its first ``process`` call is timed, then warm
    calls of the same session back to back, then one more after the same idle pause
    (a worker woken from idle, as an agent's calls seconds apart find it). Every timed
    process call sends arguments of its own (as a model's calls do: none is the text of
    an earlier call, which a session remembers valid and does not check again), so the
    first call and the others do the same work. Each round is a new system (so a new
    fork server) in this process; in as many more, each in a new process (``--one-round``:
    the system is the process's first, as an app's is), the same is timed apart. Ratio:
    first process call p50 / warm call p50 (the in-process rounds; the new processes'
    beside it). Target <= 2. Printed with it: the load average, the floor (the warm call
    after the same idle pause / a warm call: what any call pays after an idle pause on
    this machine) and first / that paused call (the first call's own cost over it). The
    system's very first call, a process call opening the session, is timed in other
    rounds and shown beside it.
(b) **30 concurrent first calls under load.** A fresh system registers a trusted
    ``process`` tool declaring ``timeout_ms=2000`` (it sleeps 10 ms) and at once gets 30
    calls from 30 sessions, while ``2 x cores`` processes spin on the CPU. Counted: calls
    that came back ``timeout`` (target 0), ``unavailable`` (no worker within
    ``start_timeout_ms``, 10 s by default) and ok, and the calls' latency.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
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
    """A trusted ``process`` tool: sleeps ``ms`` milliseconds (default 0); ``tag``: text the
    tool does not look at, which makes each call's arguments its own."""

    name = staticmethod(lambda: "quick")
    description = staticmethod(lambda: "Sleep a little.")
    parameter_schema = staticmethod(lambda: {"type": "object", "properties": {"ms": {"type": "integer"},
                                                                              "tag": {"type": "string"}}})
    timeout_ms = staticmethod(lambda: CONCURRENT_TIMEOUT_MS)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        time.sleep(args.get("ms", 0) / 1000)
        return "ok"


_calls = itertools.count()


def _timed(loop: Any, tool: str = "quick") -> float:
    """One turn of one call of ``tool`` with arguments of its own, timed (us)."""
    arguments = f'{{"tag": "call {next(_calls)}"}}'
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


def one_round(warm_calls: int, opening: bool = False) -> dict[str, Any]:
    """A new system: its first process call after registration (after a thread call that
    opened its session and :data:`PAUSE_S` idle), ``warm_calls`` warm calls, one after
    the same idle pause (us); ``opening``: the system's very first call instead, a process
    call opening its session."""
    with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(tmp) as system:
        system.register(Quick, isolation="process")
        system.register(QuickThread, isolation="thread")
        _warmed(system)
        loop = system.start_loop("s")
        if opening:
            return {"opening": _timed(loop)}
        session_first = _timed(loop, tool="quick_thread")
        time.sleep(PAUSE_S)
        first = _timed(loop)
        warm = [_timed(loop) for _ in range(warm_calls)]
        time.sleep(PAUSE_S)
        return {"session_first": session_first, "first": first, "warm": warm, "paused": _timed(loop)}


def _in_new_process(warm_calls: int) -> dict[str, Any]:
    """:func:`one_round` in a new Python process (this script with ``--one-round``)."""
    out = subprocess.run([sys.executable, __file__, "--one-round", str(warm_calls)], capture_output=True, text=True,
                         timeout=300, check=False)
    if out.returncode != 0:
        raise BenchmarkError(f"a new process's round failed: {out.stderr.strip()[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _ratios(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    first = [r["first"] for r in rounds]
    warm = [w for r in rounds for w in r["warm"]]
    paused = [r["paused"] for r in rounds]
    f, w, p = percentile(first, 50), percentile(warm, 50), percentile(paused, 50)
    return {"first_us": summary(first), "warm_us": summary(warm), "paused_us": summary(paused),
            "ratio": f / w, "paused_ratio": f / p, "floor": p / w}


def bench_first_call(rounds: int, warm_calls: int, new_processes: int) -> dict[str, Any]:
    """(a): first process call after registration, next to warm calls, in ``rounds`` new
    systems; in as many more, the system's very first call (a process call opening its
    session); then ``new_processes`` rounds each in a new process."""
    load_before = os.getloadavg()[0]
    here: list[dict[str, Any]] = []
    opening: list[float] = []
    for i in range(2 * rounds):
        if i % 2:
            opening.append(one_round(0, opening=True)["opening"])
        else:
            here.append(one_round(warm_calls))
    load_between = os.getloadavg()[0]
    apart = [_in_new_process(warm_calls) for _ in range(new_processes)]
    out = _ratios(here)
    ratio = out["ratio"]
    out.update({
        "session_first_thread_us": summary([r["session_first"] for r in here]), "system_first_us": summary(opening),
        "system_first_ratio": percentile(opening, 50) / out["warm_us"]["p50"],
        "new_process": _ratios(apart) if apart else None,
        "load_avg_1m": [round(load_before, 2), round(load_between, 2), round(os.getloadavg()[0], 2)],
        "target": FIRST_CALL_TARGET, "pass": ratio <= FIRST_CALL_TARGET,
    })
    return out


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
        first = one.submit(bench_first_call, 3 if quick else 9, 10 if quick else 30, 2 if quick else 5).result()
    return {"first_call": first, "concurrent_first_calls": bench_concurrent_first_calls()}


def print_cold_start(report: dict[str, Any]) -> None:
    from stats import verdict

    c = report["cold_start"]
    m = c["concurrent_first_calls"]
    print_first_call(c["first_call"])
    print(f"   {m['calls']} concurrent first calls, timeout {m['timeout_ms']} ms, {m['load_processes']} spinning "
          f"processes (load before {m['load_avg_1m_before']:.1f}):\n      ok {m['ok']}, timeout {m['timeouts']}, "
          f"unavailable {m['unavailable']}, other "
          f"{m['other_errors']}; all back after {m['done_after_ms']:.0f} ms; latency p50 / p99 "
          f"{m['duration_ms']['p50']:.0f} / {m['duration_ms']['p99']:.0f} ms   target 0 timeouts   "
          f"{verdict(m['pass'])}")


def print_first_call(f: dict[str, Any]) -> None:
    """Part (a)'s lines."""
    from stats import verdict

    def row(label: str, sample: dict[str, Any], extra: str = "") -> None:
        print(f"   {label:<46}{sample['p50']:>10.1f} / {sample['p99']:>10.1f}   n={sample['n']}{extra}")

    load = " -> ".join(f"{x:.1f}" for x in f["load_avg_1m"])
    print(f"\n7. a system's first process calls (us: p50 / p99, n samples; load average {load})")
    row("first process call after registration", f["first_us"])
    row("(its session's first turn, a thread call", f["session_first_thread_us"], ")")
    row("(the system's first call, opening its session", f["system_first_us"],
        f": {f['system_first_ratio']:.2f}x warm)")
    row("warm call", f["warm_us"])
    row(f"warm call after the same {PAUSE_S:g} s idle", f["paused_us"])
    print(f"   ratio first / warm (p50): {f['ratio']:.2f}x   target <= {f['target']:g}x   {verdict(f['pass'])}")
    print(f"      the floor, paused / warm: {f['floor']:.2f}x (any call after {PAUSE_S:g} s idle); "
          f"first / paused: {f['paused_ratio']:.2f}x (the first call's own cost)")
    n = f["new_process"]
    if n is not None:
        print(f"   each round in a new process (n={n['first_us']['n']}): first {n['first_us']['p50']:.1f}, warm "
              f"{n['warm_us']['p50']:.1f}, paused {n['paused_us']['p50']:.1f}: first / warm {n['ratio']:.2f}x, "
              f"floor {n['floor']:.2f}x, first / paused {n['paused_ratio']:.2f}x")


if __name__ == "__main__":  # --one-round N: one round of (a) in this new process, as a JSON line; --first: (a)
    if sys.argv[1:2] == ["--one-round"]:
        print(json.dumps(one_round(int(sys.argv[2]))))
    elif sys.argv[1:2] == ["--first"]:  # part (a) alone, as bench_isolation.py --cold runs it
        print_first_call(bench_first_call(9, 30, 5))
