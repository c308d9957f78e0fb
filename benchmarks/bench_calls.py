"""Benchmarks of the cost of a tool call through rho_actors, against the targets of issue #2.

Everything is measured in one run, on one machine, next to its own baseline (the machine
may be shared and noisy: each part warms up first, repeats, and reports the median (p50)
and p99 of its samples; nothing here asserts a timing):

1. **No-op call.** The per-call cost of a no-op tool through a loop
   (``loop.run_turn([ToolCall(...)])`` with one call), next to (a) a direct call of the
   same no-op function and (b) a bare pykka actor start + ask + stop
   (``A.start(); ref.ask(msg); ref.stop()`` with a trivial ``ThreadingActor``): p50 and
   p99 in microseconds. Target (issue #2): rho_actors p50 / bare-pykka p50 <= 2x.
2. **Parallel turn.** The wall time of one turn of 16 calls of a ``"parallel"`` tool that
   sleeps 100 ms, next to the ideal 100 ms. Target (issue #2): p50 / 100 ms <= 1.5x.
3. **BFCL replay.** :func:`rho_actors.integrations.bfcl.replay` of ``multi_turn_base``, whole
   sessions (``ReplayReport.replay_sessions_wall_s``: backends built, loop started, turns
   run, loop stopped) against direct execution of the same sessions
   (``direct_sessions_wall_s``: backends built, calls made). Target (issue #2):
   replay / direct <= 10x. The calls-only ratio (summed ``run_turn`` against summed
   direct calls) is printed beside it. Skipped, with the reason printed, when
   ``bfcl_eval`` is missing.
4. **The governor** (issue #38). What :meth:`rho_actors.governor.Governor.start` adds to
   a no-op call: (a) alone, starting a call whose isolation answers at once (the
   governor's own work: its admission, places, reply and release), against the same
   start made directly, for a tool with no bound and for one with every bound (a
   system and a per-session place, a call budget, the repeated-call breaker, a rate and
   retries, none of them reached); (b) through ``loop.run_turn`` of the no-op, the same
   three ways, rounds interleaved. Targets (issue #38): (a) no bound <= 3 us, every
   bound <= 10 us, p50 difference.

Targets are reported as PASS/FAIL, never enforced: the exit code is 0 unless a
measurement could not be made (an exception, or a call that did not return ``ok``).

Usage::

    .venv/bin/python benchmarks/bench_calls.py            # full run, under a minute
    .venv/bin/python benchmarks/bench_calls.py --quick    # smoke run, a few seconds
    .venv/bin/python benchmarks/bench_calls.py --json     # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pykka
from stats import BenchmarkError, environment, percentile, publish, summary, verdict

from rho_actors import ActorSystem, GovernorSettings, Loop, ToolCall, ToolResult

NOOP_TARGET = 2.0
PARALLEL_TARGET = 1.5
BFCL_TARGET = 10.0
GOVERNOR_PLAIN_TARGET_US = 3.0
GOVERNOR_BOUNDED_TARGET_US = 10.0
GOVERNOR_BATCH = 200

PARALLEL_CALLS = 16
SLEEP_MS = 100
DIRECT_BATCH = 1_000


@dataclass(frozen=True)
class Plan:
    """How much to repeat each part (``--quick`` or a full run)."""

    warmup_calls: int
    rounds: int
    calls_per_round: int
    direct_batches_per_round: int
    parallel_warmup: int
    parallel_turns: int
    bfcl_limit: int | None
    bfcl_runs: int


FULL = Plan(
    warmup_calls=300,
    rounds=30,
    calls_per_round=300,
    direct_batches_per_round=100,
    parallel_warmup=2,
    parallel_turns=20,
    bfcl_limit=None,
    bfcl_runs=3,
)
QUICK = Plan(
    warmup_calls=30,
    rounds=3,
    calls_per_round=40,
    direct_batches_per_round=30,
    parallel_warmup=1,
    parallel_turns=3,
    bfcl_limit=5,
    bfcl_runs=1,
)


# --- tools and actors under test ---------------------------------------------------------


def noop(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
    """The no-op: what every variant of part 1 runs."""
    return "ok"


class NoOp:
    """A tool whose ``run`` is :func:`noop`; plain static callbacks, so the loop's cost is
    not mixed with pydantic's (``@tool`` validates arguments with pydantic)."""

    @staticmethod
    def name() -> str:
        return "noop"

    @staticmethod
    def description() -> str:
        return "Do nothing."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {}, "additionalProperties": False}

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        return noop(args, ctx)


class Sleep:
    """A ``"parallel"`` tool that sleeps ``SLEEP_MS`` milliseconds."""

    @staticmethod
    def name() -> str:
        return "sleep"

    @staticmethod
    def description() -> str:
        return f"Sleep {SLEEP_MS} ms."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {}, "additionalProperties": False}

    @staticmethod
    def timeout_ms() -> int:
        return 20 * SLEEP_MS

    @staticmethod
    def concurrency() -> str:
        return "parallel"

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        time.sleep(SLEEP_MS / 1000)
        return "slept"


class Echo(pykka.ThreadingActor):
    """The bare-pykka baseline: a trivial actor that answers its message."""

    def on_receive(self, message: Any) -> Any:
        return message


# --- statistics ------------------------------------------------------------------------


def ratio_line(label: str, part: Mapping[str, Any]) -> str:
    ratio, target = part["ratio"], part["target"]
    return f"   ratio {label}: {ratio:.2f}x   target <= {target:g}x   {verdict(ratio <= target)}"


# --- part 1: no-op call ----------------------------------------------------------------


def time_loop_call(loop: Loop, call: ToolCall) -> float:
    """One ``run_turn`` of one call, in microseconds."""
    t0 = time.perf_counter_ns()
    [result] = loop.run_turn([call])
    elapsed = time.perf_counter_ns() - t0
    if not result.ok:
        raise BenchmarkError(f"the no-op call failed: {result.error_kind}: {result.content}")
    return elapsed / 1_000


def time_bare_pykka() -> float:
    """One ``Echo.start(); ref.ask(msg); ref.stop()``, in microseconds."""
    t0 = time.perf_counter_ns()
    ref = Echo.start()
    ref.ask("ping")
    ref.stop()
    return (time.perf_counter_ns() - t0) / 1_000


def time_direct_batch(ctx: Mapping[str, Any]) -> float:
    """``DIRECT_BATCH`` direct calls of the no-op; the mean per call, in microseconds (a
    single call is shorter than the clock's own overhead, so calls are timed in batches)."""
    args: dict[str, Any] = {}
    t0 = time.perf_counter_ns()
    for _ in range(DIRECT_BATCH):
        noop(args, ctx)
    return (time.perf_counter_ns() - t0) / 1_000 / DIRECT_BATCH


def bench_noop(system: ActorSystem, plan: Plan) -> dict[str, Any]:
    loop = system.start_loop("bench-noop")
    call = ToolCall("c1", "noop", "{}")
    ctx = {"session_id": "bench", "call_id": "c1"}
    try:
        for _ in range(plan.warmup_calls):
            time_loop_call(loop, call)
            time_bare_pykka()
        for _ in range(plan.direct_batches_per_round):
            time_direct_batch(ctx)
        rho: list[float] = []
        bare: list[float] = []
        direct: list[float] = []
        # Interleave the variants round by round, so a noisy neighbour slows all of them.
        for _ in range(plan.rounds):
            gc.collect()
            rho.extend(time_loop_call(loop, call) for _ in range(plan.calls_per_round))
            gc.collect()
            bare.extend(time_bare_pykka() for _ in range(plan.calls_per_round))
            direct.extend(time_direct_batch(ctx) for _ in range(plan.direct_batches_per_round))
    finally:
        loop.stop()
    rho_s, bare_s, direct_s = summary(rho), summary(bare), summary(direct, 4)
    ratio = percentile(rho, 50) / percentile(bare, 50)
    return {
        "rho_actors_us": rho_s,
        "bare_pykka_us": bare_s,
        "direct_us": direct_s | {"batch": DIRECT_BATCH},
        "ratio": round(ratio, 3),
        "ratio_p99": round(percentile(rho, 99) / percentile(bare, 99), 3),
        "target": NOOP_TARGET,
        "pass": ratio <= NOOP_TARGET,
    }


# --- part 2: parallel turn --------------------------------------------------------------


def time_parallel_turn(loop: Loop) -> float:
    """One turn of ``PARALLEL_CALLS`` sleeping calls, in milliseconds."""
    calls = [ToolCall(f"c{i}", "sleep", "{}") for i in range(PARALLEL_CALLS)]
    t0 = time.perf_counter_ns()
    results = loop.run_turn(calls)
    elapsed = time.perf_counter_ns() - t0
    failed = [r for r in results if not r.ok]
    if len(results) != PARALLEL_CALLS or failed:
        detail = f"{failed[0].error_kind}: {failed[0].content}" if failed else f"{len(results)} results"
        raise BenchmarkError(f"the parallel turn did not return {PARALLEL_CALLS} ok results ({detail})")
    return elapsed / 1_000_000


def bench_parallel(system: ActorSystem, plan: Plan) -> dict[str, Any]:
    loop = system.start_loop("bench-parallel")
    try:
        for _ in range(plan.parallel_warmup):
            time_parallel_turn(loop)
        walls = []
        for _ in range(plan.parallel_turns):
            gc.collect()
            walls.append(time_parallel_turn(loop))
    finally:
        loop.stop()
    ratio = percentile(walls, 50) / SLEEP_MS
    return {
        "calls": PARALLEL_CALLS,
        "sleep_ms": SLEEP_MS,
        "ideal_ms": SLEEP_MS,
        "wall_ms": summary(walls),
        "ratio": round(ratio, 3),
        "target": PARALLEL_TARGET,
        "pass": ratio <= PARALLEL_TARGET,
    }


# --- part 3: BFCL replay ----------------------------------------------------------------


def skipped(reason: str) -> dict[str, Any]:
    return {"skipped": True, "reason": reason}


def bench_bfcl(plan: Plan) -> dict[str, Any]:
    from rho_actors.integrations import bfcl

    try:
        bfcl.replay(category="base", limit=3, progress=False)  # warm-up: imports, data, first calls
        reports = [bfcl.replay(category="base", limit=plan.bfcl_limit, progress=False) for _ in range(plan.bfcl_runs)]
    except bfcl.BfclUnavailableError as exc:
        return skipped(f"BFCL is unavailable ({exc})")
    if any(r.direct_wall_s <= 0 or r.replay_wall_s <= 0 for r in reports):
        raise BenchmarkError("the BFCL replay measured no time (no calls replayed?)")
    ratio = percentile([r.replay_sessions_wall_s / r.direct_sessions_wall_s for r in reports], 50)
    calls_ratio = percentile([r.replay_wall_s / r.direct_wall_s for r in reports], 50)
    last = reports[-1]
    out: dict[str, Any] = {
        "skipped": False,
        "category": "base",
        "limit": plan.bfcl_limit,
        "runs": len(reports),
        "sessions": last.sessions,
        "calls": last.calls,
        "replay_wall_s": summary([r.replay_wall_s for r in reports], 4),
        "direct_wall_s": summary([r.direct_wall_s for r in reports], 4),
        "replay_sessions_wall_s": summary([r.replay_sessions_wall_s for r in reports], 4),
        "direct_sessions_wall_s": summary([r.direct_sessions_wall_s for r in reports], 4),
        "calls_ratio": round(calls_ratio, 3),
        "ratio": round(ratio, 3),
        "target": BFCL_TARGET,
        "pass": ratio <= BFCL_TARGET,
    }
    out["overhead_us"] = dict(last.overhead_us)
    out["replay_exit_code"] = last.exit_code
    return out


# --- part 4: the governor ------------------------------------------------------------------


class Bounded(NoOp):
    """The no-op with every bound of the governor, none of them reached."""

    @staticmethod
    def name() -> str:
        return "bounded"

    @staticmethod
    def max_concurrency() -> int:
        return 64

    @staticmethod
    def max_concurrency_per_session() -> int:
        return 32

    @staticmethod
    def max_calls() -> int:
        return 10**9

    @staticmethod
    def rate_limit() -> str:
        return "1000000/s"

    @staticmethod
    def idempotent() -> bool:
        return True


def governor_batch(system: ActorSystem, name: str, governed: bool) -> float:
    """``GOVERNOR_BATCH`` starts of a call of tool ``name`` whose isolation answers at
    once: through the governor, or made directly; the mean per call, in microseconds."""
    from rho_actors.cancel import CancelToken
    from rho_actors.isolation.call import CallSpec

    runtime = system._runtime  # the benchmark reaches the governor itself
    entry = runtime.tools.current.entries[name]
    governor = runtime.governor
    answered: list[Any] = []

    def start(spec: CallSpec) -> Any:  # an isolation that answers at once: what is left is the governor's
        places = spec.places  # a thread call's: its answer gives them back first, as ThreadIsolation's does
        ready = places.give_back(spec) if places is not None else None
        spec.reply(ok_result)
        if ready:
            places.gov.launch(ready)  # type: ignore[union-attr]  # ready: given back from places
        return start

    ok_result = ToolResult("c", name, True, "ok")
    deadline = time.monotonic() + 3600
    specs = [CallSpec("c", name, entry.tool, {"i": i}, {}, 0.0, deadline, 30_000, CancelToken(), 1000,
                      answered.append) for i in range(GOVERNOR_BATCH)]
    t0 = time.perf_counter_ns()
    if governed:
        for spec in specs:
            governor.start(entry, spec, "bench-governor", start, False)
    else:
        for spec in specs:
            start(spec)
    elapsed = time.perf_counter_ns() - t0
    if len(answered) != GOVERNOR_BATCH or any(not r.ok for r in answered):
        raise BenchmarkError(f"the governor did not answer every call of {name} ok")
    return elapsed / 1_000 / GOVERNOR_BATCH


def bench_governor(system: ActorSystem, bounded: ActorSystem, plan: Plan) -> dict[str, Any]:
    """``system`` has the default settings, ``bounded`` every system bound too."""
    runtime = system._runtime
    loop, bounded_loop = system.start_loop("bench-governor-loop"), bounded.start_loop("bench-governor-loop")
    calls = {"plain": ToolCall("c1", "noop", "{}"), "bounded": ToolCall("c1", "bounded", "{}")}
    governed = runtime.governor.start
    bypass = lambda entry, spec, session, start, inline: start(spec)  # noqa: E731 (the governor left out)
    samples: dict[str, list[float]] = {k: [] for k in ("direct", "plain", "bounded")}
    turns: dict[str, list[float]] = {k: [] for k in ("bypassed", "plain", "bounded")}
    try:
        for _ in range(plan.warmup_calls // 10 + 1):
            for name, flag in (("noop", False), ("noop", True)):
                governor_batch(system, name, flag)
            governor_batch(bounded, "bounded", True)
            time_loop_call(bounded_loop, calls["bounded"])
            time_loop_call(loop, calls["plain"])
        for _ in range(plan.rounds):
            gc.collect()
            for _ in range(plan.direct_batches_per_round // 10 + 1):
                samples["direct"].append(governor_batch(system, "noop", False))
                samples["plain"].append(governor_batch(system, "noop", True))
                samples["bounded"].append(governor_batch(bounded, "bounded", True))
            for _ in range(plan.calls_per_round // 3 + 1):
                runtime.governor.start = bypass  # type: ignore[method-assign]
                turns["bypassed"].append(time_loop_call(loop, calls["plain"]))
                runtime.governor.start = governed  # type: ignore[method-assign]
                turns["plain"].append(time_loop_call(loop, calls["plain"]))
                turns["bounded"].append(time_loop_call(bounded_loop, calls["bounded"]))
    finally:
        runtime.governor.start = governed  # type: ignore[method-assign]
        loop.stop()
        bounded_loop.stop()
    direct = percentile(samples["direct"], 50)
    plain_us = percentile(samples["plain"], 50) - direct
    bounded_us = percentile(samples["bounded"], 50) - direct
    bypassed = percentile(turns["bypassed"], 50)
    return {
        "start_us": {k: summary(v, 3) for k, v in samples.items()},
        "added_plain_us": round(plain_us, 3),
        "added_bounded_us": round(bounded_us, 3),
        "run_turn_us": {k: summary(v) for k, v in turns.items()},
        "run_turn_added_plain_us": round(percentile(turns["plain"], 50) - bypassed, 1),
        "run_turn_added_bounded_us": round(percentile(turns["bounded"], 50) - bypassed, 1),
        "target_plain_us": GOVERNOR_PLAIN_TARGET_US,
        "target_bounded_us": GOVERNOR_BOUNDED_TARGET_US,
        "pass": plain_us <= GOVERNOR_PLAIN_TARGET_US and bounded_us <= GOVERNOR_BOUNDED_TARGET_US,
    }


# --- report -------------------------------------------------------------------------------


def pykka_version() -> str:
    try:
        return version("pykka")
    except PackageNotFoundError:
        return "unknown"


def print_text(report: Mapping[str, Any]) -> None:
    env = report["environment"]
    print(
        f"rho_actors call benchmarks ({env['mode']} run; python {env['python']}, pykka {env['pykka']}, "
        f"{env['cpus']} CPUs, load {env['load_avg_1m']})"
    )
    n = report["noop_call"]
    print("\n1. no-op tool call, per call (p50 / p99 in us, n samples)")
    rows = [
        (f"direct function call (batches of {n['direct_us']['batch']})", n["direct_us"], 4),
        ("bare pykka start + ask + stop", n["bare_pykka_us"], 1),
        ("rho_actors loop.run_turn, 1 call", n["rho_actors_us"], 1),
    ]
    for label, s, digits in rows:
        print(f"   {label:<40} {s['p50']:>10.{digits}f} / {s['p99']:>10.{digits}f}   n={s['n']}")
    print(ratio_line("rho_actors / bare pykka (p50)", n) + f"   (p99 ratio {n['ratio_p99']:.2f}x)")
    p = report["parallel_turn"]
    w = p["wall_ms"]
    print(f"\n2. one turn of {p['calls']} parallel calls, each sleeping {p['sleep_ms']} ms")
    print(f"   wall time p50 / p99: {w['p50']:.1f} / {w['p99']:.1f} ms   n={w['n']}   ideal {p['ideal_ms']} ms")
    print(ratio_line("(p50 / ideal)", p))
    print_bfcl(report["bfcl_replay"])
    print_governor(report["governor"])


def print_bfcl(b: Mapping[str, Any]) -> None:
    print("\n3. BFCL multi_turn_base replay vs direct execution")
    if b["skipped"]:
        print(f"   skipped: {b['reason']}")
        return
    scope = "all entries" if b["limit"] is None else f"first {b['limit']} entries"
    print(f"   {scope}: {b['sessions']} sessions, {b['calls']} calls; {b['runs']} run(s), medians")
    print(
        f"   whole sessions: replay {b['replay_sessions_wall_s']['p50']:.4f} s, "
        f"direct {b['direct_sessions_wall_s']['p50']:.4f} s (backends built, loop started and stopped)"
    )
    print(
        f"   calls only: replay (run_turn) {b['replay_wall_s']['p50']:.4f} s, "
        f"direct {b['direct_wall_s']['p50']:.4f} s, ratio {b['calls_ratio']:.2f}x"
    )
    print(ratio_line("replay / direct, whole sessions (median of runs)", b))
    o = b.get("overhead_us")
    if o and o.get("n"):
        print(f"   per-call overhead (dispatch to result) p50 / p99: {o['p50']} / {o['p99']} us   n={o['n']}")
    if b.get("replay_exit_code"):
        print(f"   note: the replay found result differences (its exit code is {b['replay_exit_code']})")


def print_governor(g: Mapping[str, Any]) -> None:
    s, t = g["start_us"], g["run_turn_us"]
    print(f"\n4. the governor: what Governor.start adds to a no-op call (p50 / p99 in us, batches of {GOVERNOR_BATCH})")
    for label, key in (("start made directly", "direct"), ("through the governor, no bound", "plain"),
                       ("through the governor, every bound", "bounded")):
        print(f"   {label:<40} {s[key]['p50']:>10.3f} / {s[key]['p99']:>10.3f}   n={s[key]['n']}")
    for label, key, target in (("no bound", "added_plain_us", "target_plain_us"),
                               ("every bound", "added_bounded_us", "target_bounded_us")):
        print(f"   added, {label}: {g[key]:.2f} us   target <= {g[target]:g} us   {verdict(g[key] <= g[target])}")
    print(f"   loop.run_turn p50: governor left out {t['bypassed']['p50']:.1f}, no bound {t['plain']['p50']:.1f} "
          f"(+{g['run_turn_added_plain_us']}), every bound {t['bounded']['p50']:.1f} "
          f"(+{g['run_turn_added_bounded_us']}) us (noisier: the whole call path)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke run of a few seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every number, nothing else")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    started = time.perf_counter_ns()
    report: dict[str, Any] = {"environment": environment(args.quick, pykka=pykka_version())}
    try:
        with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(data_dir=tmp) as system:
            system.register(NoOp)
            system.register(Sleep)
            report["noop_call"] = bench_noop(system, plan)
            report["parallel_turn"] = bench_parallel(system, plan)
            with ActorSystem(data_dir=f"{tmp}/bounded", governor=GovernorSettings(
                    max_calls_per_session=10**9, max_repeats=10**9)) as bounded:
                bounded.register(Bounded)
                report["governor"] = bench_governor(system, bounded, plan)
        report["bfcl_replay"] = bench_bfcl(plan)
    except BenchmarkError as exc:
        print(f"benchmark error: {exc}", file=sys.stderr)
        return 1
    return publish(report, started, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
