"""Calls that wait for a person (DESIGN §4 "Approvals"): what pending calls hold, and what
deciding one costs.

(1) ``--sessions`` sessions (1,000) each run one turn of ``--calls`` calls (10) of a tool
that requires approval: 10,000 pending calls, each recorded in its session's transcript
(a turn run directly records the calls it holds). Printed: the threads and the memory
they hold in the host (Python allocations traced by ``tracemalloc`` and the resident
set, each after minus before, the loops already started; goal: no thread, at most
64 MiB). Threads are counted once the sessions' first looks at their transcripts (a
pool job each, at most one per session at a time) are done; the pool's idle threads,
which end within 30 s and hold nothing, are shown apart.
(2) Deciding: ``loop.approve`` of a held no-op call, interleaved with the baseline, a
``loop.run_turn`` of the same no-op call that needs no approval (the call itself);
the overhead is their p50 difference (goal: at most 1 ms). ``loop.reject`` is shown too.
(3) Through the agent loop (``--agent-sessions``, 20): pending calls a prompt recorded
in its session's transcript, decided with ``loop.approve`` against the same baseline
(each decision locks the transcript, reads what it gained since the host's last look and
appends its records with one ``fsync`` before the call starts; the result is appended
after it, without one; goal: overhead at most 1 ms); and a decision
written into the transcript as another process would (``rho-actors approve``): how long
until the running host has run the call (goal: at most 1 s).

Usage::

    .venv/bin/python benchmarks/bench_approvals.py           # full run
    .venv/bin/python benchmarks/bench_approvals.py --quick   # smoke run (100 sessions)
    .venv/bin/python benchmarks/bench_approvals.py --json
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import environment, fsync_ms, publish, summary, verdict

from rho_actors import ActorSystem, Reply, ScriptedModel, ToolCall, tool
from rho_actors.loop.approvals import decide

MEMORY_GOAL_MIB = 64.0
DECIDE_GOAL_MS = 1.0
REMOTE_GOAL_S = 1.0
RAN: set[str] = set()


@tool(requires_approval=True)
def guarded(n: int) -> str:
    """A no-op that needs a person's approval."""
    RAN.add(f"{n}")
    return "ok"


@tool
def free(n: int) -> str:
    """The same no-op, free to run."""
    return "ok"


IDLE_THREAD = "rho_actors-idle"  # the name of a pool thread waiting for a job (it ends within 30 s)


def _held_threads() -> int:
    """The threads alive, the thread pool's idle ones left out."""
    return sum(t.name != IDLE_THREAD for t in threading.enumerate())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def held(system: ActorSystem, sessions: int, calls: int) -> tuple[dict[str, Any], list[Any]]:
    loops = [system.start_loop(f"s{i}") for i in range(sessions)]
    for loop in loops:  # each loop's turns are made: a baseline without pending calls
        loop.run_turn([ToolCall("warm", "free", '{"n": 0}')])
    gc.collect()
    threads_before = _held_threads()
    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    rss_before = _rss_bytes()
    for s, loop in enumerate(loops):
        results = loop.run_turn([ToolCall(f"c{s}-{i}", "guarded", f'{{"n": {i}}}') for i in range(calls)])
        assert all(r.error_kind == "pending_approval" for r in results), results[0]
    until = time.monotonic() + 30  # the sessions' first looks at their transcripts done
    while any(t.name.startswith("approvals:") for t in threading.enumerate()) and time.monotonic() < until:
        time.sleep(0.05)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - traced_before
    tracemalloc.stop()
    rss = _rss_bytes() - rss_before
    threads = _held_threads() - threads_before
    idle = sum(t.name == IDLE_THREAD for t in threading.enumerate())
    pending = sum(len(loop.pending()) for loop in loops)
    mib = max(traced, rss) / 2**20
    return {
        "pending_calls": pending, "sessions": sessions, "threads_added": threads, "idle_pool_threads": idle,
        "traced_mib": round(traced / 2**20, 2), "rss_mib": round(rss / 2**20, 2),
        "bytes_per_pending_call": round(traced / max(1, pending)),
        "goal": f"no thread, <= {MEMORY_GOAL_MIB:g} MiB", "verdict": verdict(threads <= 0 and mib <= MEMORY_GOAL_MIB),
    }, loops


def deciding(loops: list[Any], calls: int, rounds: int) -> dict[str, Any]:
    approve_ms, reject_ms, base_ms = [], [], []
    for r in range(rounds):
        loop = loops[r % len(loops)]
        s = r % len(loops)
        i = r // len(loops)
        if i >= calls:
            break
        started = time.perf_counter_ns()
        loop.run_turn([ToolCall(f"b{r}", "free", f'{{"n": {i}}}')])
        base_ms.append((time.perf_counter_ns() - started) / 1e6)
        started = time.perf_counter_ns()
        if r % 2:
            loop.reject(f"c{s}-{i}", "no")
            reject_ms.append((time.perf_counter_ns() - started) / 1e6)
        else:
            loop.approve(f"c{s}-{i}")
            approve_ms.append((time.perf_counter_ns() - started) / 1e6)
    approve, base = summary(approve_ms, 3), summary(base_ms, 3)
    overhead = float(approve["p50"]) - float(base["p50"])
    return {"approve_ms": approve, "reject_ms": summary(reject_ms, 3), "call_ms": base,
            "approve_overhead_ms_p50": round(overhead, 3), "goal": f"<= {DECIDE_GOAL_MS:g} ms plus the call",
            "verdict": verdict(overhead <= DECIDE_GOAL_MS)}


def agent(data_dir: Path, sessions: int, calls: int) -> dict[str, Any]:
    with ActorSystem(data_dir=data_dir) as system:
        system.register(guarded)
        system.register(free)
        loops = [system.start_loop(f"a{i}") for i in range(sessions)]
        for s, loop in enumerate(loops):
            reply = Reply(tool_calls=tuple(ToolCall(f"a{s}-{i}", "guarded", f'{{"n": {1000 + i}}}')
                                           for i in range(calls)))
            result = loop.prompt("go", model=ScriptedModel([reply]))
            assert len(result.pending) == calls, result.error
        approve_ms, base_ms = [], []
        for s, loop in enumerate(loops):
            for i in range(calls - 1):
                started = time.perf_counter_ns()
                loop.run_turn([ToolCall(f"ab{s}-{i}", "free", '{"n": 0}')])
                base_ms.append((time.perf_counter_ns() - started) / 1e6)
                started = time.perf_counter_ns()
                loop.approve(f"a{s}-{i}")
                approve_ms.append((time.perf_counter_ns() - started) / 1e6)
        remote_s = []
        for s in range(sessions):  # the last call of each: decided as another process would
            call_id = f"a{s}-{calls - 1}"
            RAN.discard(str(1000 + calls - 1))
            began = time.perf_counter()
            decide(data_dir, f"a{s}", call_id, "approved", decided_by="bench")
            until = began + 10
            while str(1000 + calls - 1) not in RAN and time.perf_counter() < until:
                time.sleep(0.001)
            remote_s.append(time.perf_counter() - began)
    approve, base = summary(approve_ms, 3), summary(base_ms, 3)
    overhead = float(approve["p50"]) - float(base["p50"])
    remote = summary(remote_s, 3)
    return {"approve_ms": approve, "call_ms": base, "approve_overhead_ms_p50": round(overhead, 3),
            "goal": f"<= {DECIDE_GOAL_MS:g} ms plus the call", "verdict": verdict(overhead <= DECIDE_GOAL_MS),
            "fsync_ms": fsync_ms(data_dir),
            "remote_decision_to_run_s": remote, "remote_goal": f"<= {REMOTE_GOAL_S:g} s",
            "remote_verdict": verdict(float(remote["p99"]) <= REMOTE_GOAL_S)}



def run(sessions: int, calls: int, agent_sessions: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rho-bench-approvals-") as tmp:
        with ActorSystem(data_dir=Path(tmp) / "held") as system:
            system.register(guarded)
            system.register(free)
            holding, loops = held(system, sessions, calls)
            decisions = deciding(loops, calls, min(2_000, sessions * calls))
        journaled = agent(Path(tmp) / "agent", agent_sessions, calls)
    return {"environment": environment(sessions < 1000, sessions=sessions, calls=calls),
            "holding": holding, "deciding": decisions, "agent_loop": journaled}


def print_text(report: Mapping[str, Any]) -> None:
    env, h, d, a = report["environment"], report["holding"], report["deciding"], report["agent_loop"]
    print(f"rho_actors approvals benchmark ({env['mode']}, {env['cpus']} CPUs, load {env['load_avg_1m']})")
    print(f"\n(1) {h['pending_calls']:,} pending calls across {h['sessions']:,} sessions: "
          f"{h['threads_added']} threads added ({h['idle_pool_threads']} idle pool threads apart), "
          f"{h['traced_mib']} MiB traced, {h['rss_mib']} MiB resident "
          f"({h['bytes_per_pending_call']} B per call)  "
          f"goal {h['goal']}: {h['verdict']}")
    print(f"(2) approve p50 {d['approve_ms']['p50']} ms (p99 {d['approve_ms']['p99']}), reject p50 "
          f"{d['reject_ms']['p50']} ms, the call itself p50 {d['call_ms']['p50']} ms: overhead "
          f"{d['approve_overhead_ms_p50']} ms  goal {d['goal']}: {d['verdict']}")
    print(f"(3) agent loop, recorded in the transcript: approve p50 {a['approve_ms']['p50']} ms (p99 "
          f"{a['approve_ms']['p99']}), the call p50 {a['call_ms']['p50']} ms: overhead "
          f"{a['approve_overhead_ms_p50']} ms (transcript locked twice, read past the last look, 1 fsync; one "
          f"fsync on this disk p50 {a['fsync_ms']['p50']} ms)  goal {a['goal']}: {a['verdict']}")
    r = a["remote_decision_to_run_s"]
    print(f"    a decision from another process run by the host after p50 {r['p50']} s, p99 {r['p99']} s  "
          f"goal {a['remote_goal']}: {a['remote_verdict']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 100 sessions, 5 agent sessions")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sessions", type=int, default=None, help="sessions holding calls (default 1,000)")
    parser.add_argument("--calls", type=int, default=10, help="pending calls per session (default 10)")
    parser.add_argument("--agent-sessions", type=int, default=None, help="agent-loop sessions (default 20)")
    args = parser.parse_args(argv)
    started = time.perf_counter_ns()
    report = run(args.sessions or (100 if args.quick else 1000), max(2, args.calls),
                 args.agent_sessions or (5 if args.quick else 20))
    return publish(report, started, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
