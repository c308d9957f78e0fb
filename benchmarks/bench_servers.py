"""Benchmarks of stateful servers in each isolation (rho_actors.isolation.servers), and of
the BFCL replay with its backends in a server of each isolation.

Everything is measured in one run, each isolation next to ``thread`` as its baseline:

1. **Server calls.** ``ref.ask(ServerCall("get", ...))`` of a key-value server started
   with ``ThreadActor``, ``ProcessActor`` (trusted) and ``ProcessActor(trusted=False)``
   (confined), interleaved round by round: p50 and p99 in microseconds, and each ÷ thread.
2. **Server start and stop.** ``start_child`` to the first answer, then ``stop_child``, of
   each kind: p50 in milliseconds.
3. **Deadline to fresh server.** A call past its 300 ms deadline on a process server:
   from the deadline to the caller's ``ServerDown`` (the process tree killed and reaped)
   and to the restarted server's first answer.
4. **BFCL replay.** ``replay(category="base", isolation=X)`` for X in thread, process and
   (with the ``ray`` extra, unless ``--no-ray``) ray: whole-session seconds
   (``replay_sessions_wall_s``), the turns alone (``replay_wall_s``), the rest (each
   session's server start, its states read, its stop), and each ÷ thread, with the
   verdicts (identical results, rejections, identical states).

Usage::

    .venv/bin/python benchmarks/bench_servers.py            # full run: 200 sessions each
    .venv/bin/python benchmarks/bench_servers.py --quick    # smoke run: 10 sessions
    .venv/bin/python benchmarks/bench_servers.py --json     # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import time
from collections.abc import Mapping
from typing import Any

from stats import environment, publish, summary

from rho_actors import ActorSystem, ChildSpec
from rho_actors.isolation.servers import ProcessActor, ServerCall, ServerDown, ThreadActor

KINDS = ("thread", "process", "untrusted")


class Kv:
    """The benchmarks' server: one dict."""

    def __init__(self) -> None:
        self.data = {"k": "v"}

    def get(self, key: str) -> str:
        return self.data[key]

    def stall(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"


def _start(kind: str) -> Any:
    if kind == "thread":
        return ThreadActor(Kv)
    return ProcessActor(Kv, trusted=kind == "process")


def bench_calls(system: ActorSystem, rounds: int) -> dict[str, Any]:
    refs = {}
    for kind in KINDS:
        refs[kind] = system.start_child(ChildSpec(f"calls-{kind}", _start(kind), name=f"calls-{kind}"))
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    call = ServerCall("get", ("k",))
    for i in range(rounds):
        for kind in KINDS[i % 3:] + KINDS[: i % 3]:  # each kind takes its turn going first
            t0 = time.perf_counter_ns()
            refs[kind].ask(call)
            samples[kind].append((time.perf_counter_ns() - t0) / 1e3)
    for kind in KINDS:
        system.stop_child(f"calls-{kind}")
    out: dict[str, Any] = {kind: summary(samples[kind][rounds // 10:]) for kind in KINDS}
    for kind in KINDS[1:]:
        out[f"{kind}_vs_thread_p50"] = round(out[kind]["p50"] / out["thread"]["p50"], 1)
    return out


def bench_start(system: ActorSystem, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        starts, stops = [], []
        for i in range(rounds):
            name = f"start-{kind}-{i}"
            t0 = time.perf_counter_ns()
            system.start_child(ChildSpec(name, _start(kind), name=name))
            ref = system.whereis(name)
            assert ref is not None
            ref.ask(ServerCall("get", ("k",)))
            t1 = time.perf_counter_ns()
            system.stop_child(name)
            starts.append((t1 - t0) / 1e6)
            stops.append((time.perf_counter_ns() - t1) / 1e6)
        out[kind] = {"start_ms": summary(starts), "stop_ms": summary(stops)}
    return out


def bench_deadline(system: ActorSystem, rounds: int) -> dict[str, Any]:
    system.start_child(ChildSpec("deadline", ProcessActor(Kv), name="deadline"), max_restarts=rounds + 1,
                       max_seconds=3600)
    to_down, to_fresh = [], []
    for _ in range(rounds):
        ref = system.whereis("deadline")
        assert ref is not None
        deadline = time.perf_counter() + 0.3
        try:
            ref.ask(ServerCall("stall", (30,), timeout_ms=300))
            raise RuntimeError("the stalled call answered")
        except ServerDown:
            to_down.append((time.perf_counter() - deadline) * 1e3)
        until = time.monotonic() + 30
        while True:  # the supervisor's restart: poll the name until the new server answers
            fresh = system.whereis("deadline")
            if fresh is not None and fresh is not ref:
                with contextlib.suppress(Exception):
                    fresh.ask(ServerCall("get", ("k",)), timeout=5)
                    break
            if time.monotonic() > until:
                raise RuntimeError("the server was not restarted within 30 s")
            time.sleep(0.001)
        to_fresh.append((time.perf_counter() - deadline) * 1e3)
    system.stop_child("deadline")
    return {"deadline_to_server_down_ms": summary(to_down), "deadline_to_fresh_server_ms": summary(to_fresh)}


def bench_replay(sessions: int, isolations: list[str]) -> dict[str, Any]:
    from rho_actors.integrations.bfcl import replay

    out: dict[str, Any] = {}
    for isolation in isolations:
        report = replay(category="base", limit=sessions, isolation=isolation)
        out[isolation] = {
            "sessions": report.sessions, "calls": report.calls, "identical": report.identical,
            "rejected": len(report.rejections), "different": len(report.differences),
            "sessions_identical_state": report.sessions_identical_state,
            "whole_sessions_s": round(report.replay_sessions_wall_s, 3),
            "turns_s": round(report.replay_wall_s, 3),
            "set_up_and_tear_down_s": round(report.replay_sessions_wall_s - report.replay_wall_s, 3),
            "per_call_overhead_us": report.overhead_us,
        }
    base = out["thread"]["whole_sessions_s"]
    for isolation in isolations[1:]:
        out[f"{isolation}_vs_thread"] = round(out[isolation]["whole_sessions_s"] / base, 1)
        out[f"{isolation}_turns_vs_thread"] = round(out[isolation]["turns_s"] / out["thread"]["turns_s"], 1)
    return out


def print_text(report: Mapping[str, Any]) -> None:
    env = report["environment"]
    print(f"servers benchmark ({env['mode']}, {env['cpus']} CPUs, load {env['load_avg_1m']})")
    calls = report["calls"]
    for kind in KINDS:
        s = calls[kind]
        ratio = "" if kind == "thread" else f"  ({calls[f'{kind}_vs_thread_p50']}x thread)"
        print(f"  call, {kind:9s} p50 {s['p50']:8.1f} us  p99 {s['p99']:8.1f} us{ratio}")
    for kind in KINDS:
        s = report["start"][kind]
        print(f"  start, {kind:9s} p50 {s['start_ms']['p50']:7.1f} ms   stop p50 {s['stop_ms']['p50']:6.1f} ms")
    d = report["deadline"]
    print(f"  deadline -> ServerDown p50 {d['deadline_to_server_down_ms']['p50']:.1f} ms, "
          f"-> fresh server p50 {d['deadline_to_fresh_server_ms']['p50']:.1f} ms")
    replay = report.get("replay")
    if isinstance(replay, dict):
        for isolation, r in replay.items():
            if isinstance(r, dict):
                print(f"  BFCL base {r['sessions']} sessions, {isolation:7s}: whole {r['whole_sessions_s']:8.2f} s, "
                      f"turns {r['turns_s']:7.2f} s, set-up/tear-down {r['set_up_and_tear_down_s']:7.2f} s; "
                      f"identical {r['identical']}/{r['calls']}, rejected {r['rejected']}, "
                      f"different {r['different']}, states {r['sessions_identical_state']}/{r['sessions']}")
            elif isolation.endswith("_vs_thread"):
                print(f"  BFCL whole sessions, {isolation.replace('_', ' ')}: {r}x")
    else:
        print(f"  BFCL replay: {replay}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run with few samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-ray", action="store_true", help="leave out the BFCL replay on Ray")
    opts = parser.parse_args(argv)
    started = time.perf_counter_ns()
    with contextlib.redirect_stdout(sys.stderr), ActorSystem() as system:  # Ray's notices go to stdout
        report: dict[str, Any] = {
            "environment": environment(opts.quick),
            "calls": bench_calls(system, 50 if opts.quick else 1_000),
            "start": bench_start(system, 2 if opts.quick else 10),
            "deadline": bench_deadline(system, 1 if opts.quick else 5),
        }
    isolations = ["thread", "process"]
    if not opts.no_ray and importlib.util.find_spec("ray") is not None:
        isolations.append("ray")
    if importlib.util.find_spec("bfcl_eval") is None:
        report["replay"] = "skipped: bfcl_eval is not installed"
    else:
        with contextlib.redirect_stdout(sys.stderr):
            report["replay"] = bench_replay(10 if opts.quick else 200, isolations)
    return publish(report, started, opts.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
