"""Benchmarks of ``process`` isolation (rho_actors.sandbox), against its targets.

Everything is measured in one run, on one machine, next to its own baseline (the machine
may be shared and noisy: each part warms up first, repeats, and reports the median (p50)
and p99 of its samples; nothing here asserts a timing):

1. **No-op call.** The round trip of a no-op tool through a warm worker
   (``WorkerPool.run``) next to ``concurrent.futures.ProcessPoolExecutor`` with the same
   start method, warm, running a no-op function (``submit(noop).result()``), interleaved
   round by round: p50 and p99 in microseconds. Target: pool p50 / executor p50 <= 1.5x.
2. **Replacement.** A call of a tool that sleeps past its deadline (200 ms): the time
   from the deadline to the timeout result, and from the deadline to the replacement
   worker being ready (``WorkerPool.wait_warm``). Target: p50 of the latter <= 100 ms.
3. **Untrusted declarations.** 50 tools from a plugin file that is not on ``sys.path``,
   each read with ``read_declaration_isolated`` (a fresh child process each) and checked
   with ``check_declaration(raw_declaration(...))``, 4 reads at a time: the wall time per
   tool, next to one ``multiprocessing`` process start (start + join of a no-op process)
   with the same start method. Target: per-tool average < 50 ms.
4. **Untrusted calls through a system.** ``loop.run_turn`` of a no-op untrusted tool in an
   ``ActorSystem`` with its default confinement (DESIGN §5): (a) a warm call (its
   (tool, session) worker already running) next to a warm ``ProcessPoolExecutor``
   round trip; (b) the first call of a new session, which scopes a fresh spare worker to
   the (tool, session) pair, (c) a call of a ``worker_scope="call"`` tool (a fresh worker
   for every call) and (d) the first call of a new session with no spare kept
   (``warm_workers=0``: the worker is started on the call's path), each next to a new
   ``ProcessPoolExecutor(max_workers=1)`` running its first no-op (created and
   ``submit().result()``; its shutdown not timed). Samples of each pair are interleaved.
   Targets: (a) / its executor <= 1.0x, (b) / a new executor's first call <= 0.25x.
   ``--warm``: (a) alone (``--calls``: how many pairs, 500 by default).
5. **Start of one confined child.** One untrusted worker with the system's default
   confinement (uid drop, Landlock, rlimits, its cgroup and private folder), from the
   request to its ``READY``: started clean (rho's own fork server, ``python -I``, that
   never imported the host: what every untrusted child uses) next to the same child
   forked by ``multiprocessing``'s fork server (with the host's ``__main__`` preloaded:
   how untrusted children started before). Interleaved; reported, no target.

6. **Many sessions.** ``SESSIONS`` sessions (8 with ``--quick``) (one loop and one thread each) run turns of one
   call of a 5 ms untrusted tool (declared timeout 20 s), ``many_calls`` calls in all,
   next to the same tool registered trusted with ``isolation="process"`` in a system of
   its own: throughput (calls/s), call latency p50/p99 (ms), worker processes started,
   and calls that waited out their deadline for a worker, with the system's default
   caps (``max_workers``, ``max_running_workers``: printed). Target: untrusted throughput
   / trusted >= 0.8x, and no call that waited out its deadline.
7. **A system's first process calls** (``cold_start.py``): the first trusted ``process``
   call after registration / a warm call (target <= 2x), and 30 concurrent first calls
   at a 2 s deadline on a loaded machine (target: no ``timeout``). ``--cold``: this part only.

Targets are reported as PASS/FAIL, never enforced: the exit code is 0 unless a
measurement could not be made (an exception, or a call that did not come back as
expected).

Usage::

    .venv/bin/python benchmarks/bench_isolation.py            # full run, about 15 s
    .venv/bin/python benchmarks/bench_isolation.py --quick    # smoke run, a few seconds
    .venv/bin/python benchmarks/bench_isolation.py --json     # one JSON object on stdout
    .venv/bin/python benchmarks/bench_isolation.py --warm --calls 1000  # part 4 (a) alone
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gc
import importlib.util
import multiprocessing
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cold_start import bench_cold_start, print_cold_start
from stats import BenchmarkError, environment, percentile, publish, summary, verdict

from rho_actors import ActorSystem, ToolCall
from rho_actors.declarations.checks import DeclarationError, check_declaration
from rho_actors.sandbox import IsolatedReadError, WorkerPool, raw_declaration, read_declaration_isolated, wire
from rho_actors.sandbox.confine.enclosure import Enclosure, default_policy
from rho_actors.sandbox.processes import close, context, hold_servers, release_servers, spawn
from rho_actors.sandbox.reads import DEFAULT_HEAP_BYTES
from rho_actors.sandbox.worker import WorkerConfig, worker_child
from rho_actors.tool import ErrorKind

START_METHOD = "forkserver"
NOOP_TARGET = 1.5
REPLACEMENT_TARGET_MS = 100.0
DECLARATION_TARGET_MS = 50.0
WARM_CALL_TARGET = 1.0  # issue #42 (1.5 before)
NEW_SESSION_TARGET = 0.25
MANY_TARGET = 0.8  # issue #42 (0.6 before)
SESSIONS = 50

TOOLS = 50
READ_CONCURRENCY = 4
SLEEP_DEADLINE_S = 0.2


@dataclass(frozen=True)
class Plan:
    """How much to repeat each part (``--quick`` or a full run)."""

    warmup_calls: int
    rounds: int
    calls_per_round: int
    replacements: int
    declaration_rounds: int
    process_starts: int
    system_calls: int
    worker_starts: int
    many_calls: int
    sessions: int = SESSIONS


FULL = Plan(warmup_calls=300, rounds=20, calls_per_round=200, replacements=20, declaration_rounds=5,
            process_starts=30, system_calls=500, worker_starts=30, many_calls=2_000)
QUICK = Plan(warmup_calls=50, rounds=3, calls_per_round=50, replacements=3, declaration_rounds=1,
             process_starts=5, system_calls=30, worker_starts=3, many_calls=40, sessions=8)


# --- tools under test -----------------------------------------------------------------------


def noop() -> str:
    """The executor's no-op."""
    return "ok"


def idle_process() -> None:
    """The target of the bare process start."""


class NoOp:
    """The pool's no-op tool (shipped by value once: it lives in ``__main__``)."""

    @staticmethod
    def name() -> str:
        return "noop"

    @staticmethod
    def description() -> str:
        return "Do nothing."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {}}

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        return "ok"


class OneShot(NoOp):
    """The no-op registered with ``worker_scope="call"``."""

    @staticmethod
    def name() -> str:
        return "noop_once"


class Sleeper(NoOp):
    """Sleeps far past its deadline."""

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        time.sleep(30)
        return "late"


class FiveMs(NoOp):
    """A 5 ms tool with a declared timeout of 20 s (part 6)."""

    @staticmethod
    def name() -> str:
        return "five_ms"

    @staticmethod
    def timeout_ms() -> int:
        return 20_000

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        time.sleep(0.005)
        return "ok"


PLUGIN_TOOL = '''
class Tool{i:02d}:
    @staticmethod
    def name():
        return "plugin_tool_{i:02d}"

    @staticmethod
    def description():
        return "Plugin tool number {i}: looks a record up by id and returns its fields."

    @staticmethod
    def parameter_schema():
        return {{
            "type": "object",
            "properties": {{
                "id": {{"type": "integer", "minimum": 0}},
                "fields": {{"type": "array", "items": {{"type": "string", "enum": ["a", "b", "c"]}}}},
                "verbose": {{"type": "boolean", "default": False}},
            }},
            "required": ["id"],
            "additionalProperties": False,
        }}

    @staticmethod
    def timeout_ms():
        return 1000 + {i}

    @staticmethod
    def run(args, ctx):
        return args["id"]
'''


def load_plugin(folder: Path) -> list[Any]:
    """``TOOLS`` tool classes from a module file that is not on ``sys.path``."""
    path = folder / "rho_bench_plugin.py"
    path.write_text("".join(PLUGIN_TOOL.format(i=i) for i in range(TOOLS)))
    spec = importlib.util.spec_from_file_location("rho_bench_plugin", path)
    if spec is None or spec.loader is None:
        raise BenchmarkError("could not load the plugin file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return [getattr(module, f"Tool{i:02d}") for i in range(TOOLS)]


# --- statistics ------------------------------------------------------------------------------


# --- part 1: no-op round trip ----------------------------------------------------------------


def time_pool_call(pool: WorkerPool, ctx: Mapping[str, Any]) -> float:
    """One ``WorkerPool.run`` of the no-op, in microseconds."""
    t0 = time.perf_counter_ns()
    result = pool.run(NoOp, {}, ctx, time.monotonic() + 10.0, 1_000, name="noop")
    elapsed = time.perf_counter_ns() - t0
    if not result.ok:
        raise BenchmarkError(f"the no-op call failed: {result.error_kind}: {result.content}")
    return elapsed / 1_000


def time_executor_call(executor: concurrent.futures.ProcessPoolExecutor) -> float:
    """One ``submit(noop).result()``, in microseconds."""
    t0 = time.perf_counter_ns()
    value = executor.submit(noop).result(timeout=10)
    elapsed = time.perf_counter_ns() - t0
    if value != "ok":
        raise BenchmarkError(f"the executor's no-op returned {value!r}")
    return elapsed / 1_000


def bench_noop(plan: Plan) -> dict[str, Any]:
    ctx = {"session_id": "bench", "call_id": "c1"}
    mp_ctx = multiprocessing.get_context(START_METHOD)
    with WorkerPool(warm=1, start_method=START_METHOD) as pool, concurrent.futures.ProcessPoolExecutor(
        max_workers=1, mp_context=mp_ctx
    ) as executor:
        if not pool.wait_warm(30.0):
            raise BenchmarkError("the worker pool did not warm up")
        for _ in range(plan.warmup_calls):
            time_pool_call(pool, ctx)
            time_executor_call(executor)
        ours: list[float] = []
        theirs: list[float] = []
        # Interleave round by round, so a noisy neighbour slows both.
        for _ in range(plan.rounds):
            gc.collect()
            ours.extend(time_pool_call(pool, ctx) for _ in range(plan.calls_per_round))
            gc.collect()
            theirs.extend(time_executor_call(executor) for _ in range(plan.calls_per_round))
    ratio = percentile(ours, 50) / percentile(theirs, 50)
    return {
        "start_method": START_METHOD,
        "worker_pool_us": summary(ours),
        "process_pool_executor_us": summary(theirs),
        "ratio": round(ratio, 3),
        "ratio_p99": round(percentile(ours, 99) / percentile(theirs, 99), 3),
        "target": NOOP_TARGET,
        "pass": ratio <= NOOP_TARGET,
    }


# --- part 2: replacement after a deadline ----------------------------------------------------


def bench_replacement(plan: Plan) -> dict[str, Any]:
    to_result: list[float] = []
    to_ready: list[float] = []
    with WorkerPool(warm=1, start_method=START_METHOD) as pool:
        if not pool.wait_warm(30.0):
            raise BenchmarkError("the worker pool did not warm up")
        for i in range(plan.replacements + 1):  # the first one is a warm-up
            deadline = time.monotonic() + SLEEP_DEADLINE_S
            result = pool.run(Sleeper, {}, {"session_id": "bench", "call_id": f"t{i}"}, deadline, 1_000)
            returned = time.monotonic()
            if result.error_kind is not ErrorKind.TIMEOUT:
                raise BenchmarkError(f"the sleeper did not time out: {result.error_kind}: {result.content}")
            if not pool.wait_warm(10.0):
                raise BenchmarkError("no replacement worker became ready within 10 s")
            ready = time.monotonic()
            if i:
                to_result.append((returned - deadline) * 1000)
                to_ready.append((ready - deadline) * 1000)
        stats = pool.stats()
    p50 = percentile(to_ready, 50)
    return {
        "deadline_s": SLEEP_DEADLINE_S,
        "deadline_to_result_ms": summary(to_result),
        "deadline_to_ready_ms": summary(to_ready),
        "workers_killed": stats["killed"],
        "target_ms": REPLACEMENT_TARGET_MS,
        "pass": p50 <= REPLACEMENT_TARGET_MS,
    }


# --- part 3: untrusted declarations ----------------------------------------------------------


def read_and_check(tool: Any) -> bool:
    """Read one declaration in a child process and check it; whether it was accepted."""
    try:
        payload = read_declaration_isolated(tool, timeout_s=10.0, start_method=START_METHOD)
    except IsolatedReadError as exc:
        raise BenchmarkError(f"an isolated read failed: {exc.kind}: {exc}") from exc
    try:
        check_declaration(raw_declaration(payload))
    except DeclarationError:
        return False
    return True


def time_process_start(ctx: Any) -> float:
    """One start and join of a no-op process, in milliseconds."""
    t0 = time.perf_counter_ns()
    proc = ctx.Process(target=idle_process)
    proc.start()
    proc.join(10)
    elapsed = time.perf_counter_ns() - t0
    if proc.exitcode != 0:
        raise BenchmarkError(f"the bare process exited with {proc.exitcode}")
    proc.close()
    return elapsed / 1_000_000


def bench_declarations(plan: Plan, tools: list[Any]) -> dict[str, Any]:
    mp_ctx = multiprocessing.get_context(START_METHOD)
    read_and_check(tools[0])  # warm-up: the fork server starts
    time_process_start(mp_ctx)
    per_tool: list[float] = []
    single: list[float] = []
    accepted = 0
    with concurrent.futures.ThreadPoolExecutor(READ_CONCURRENCY) as threads:
        for _ in range(plan.declaration_rounds):
            gc.collect()
            t0 = time.perf_counter_ns()
            outcomes = list(threads.map(read_and_check, tools))
            per_tool.append((time.perf_counter_ns() - t0) / 1_000_000 / len(tools))
            accepted = sum(outcomes)
    for tool in tools[: max(5, plan.process_starts // 2)]:
        t0 = time.perf_counter_ns()
        read_and_check(tool)
        single.append((time.perf_counter_ns() - t0) / 1_000_000)
    starts = [time_process_start(mp_ctx) for _ in range(plan.process_starts)]
    mean = sum(per_tool) / len(per_tool)
    return {
        "tools": len(tools),
        "concurrency": READ_CONCURRENCY,
        "accepted": accepted,
        "per_tool_ms": summary(per_tool) | {"mean": round(mean, 2)},
        "one_read_alone_ms": summary(single),
        "process_start_ms": summary(starts),
        "target_ms": DECLARATION_TARGET_MS,
        "pass": mean < DECLARATION_TARGET_MS,
    }


# --- part 4: untrusted calls through a system ---------------------------------------------------


def time_turn(loop: Any, tool: str) -> float:
    """One ``run_turn`` of one no-op call, in microseconds."""
    t0 = time.perf_counter_ns()
    [result] = loop.run_turn([ToolCall("c", tool, "{}")])
    elapsed = time.perf_counter_ns() - t0
    if not result.ok:
        raise BenchmarkError(f"the untrusted no-op failed: {result.error_kind}: {result.content}")
    return elapsed / 1_000


def time_fresh_executor(mp_ctx: Any) -> float:
    """A new one-process ``ProcessPoolExecutor`` and its first no-op, in microseconds (its
    shutdown is not timed)."""
    t0 = time.perf_counter_ns()
    executor = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=mp_ctx)
    value = executor.submit(noop).result(timeout=30)
    elapsed = time.perf_counter_ns() - t0
    executor.shutdown()
    if value != "ok":
        raise BenchmarkError(f"the executor's no-op returned {value!r}")
    return elapsed / 1_000


def _first_calls(system: ActorSystem, plan: Plan, mp_ctx: Any, tag: str) -> tuple[list[float], list[float]]:
    """The first call of ``plan.worker_starts`` new sessions, each beside a fresh executor."""
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(plan.worker_starts + 1):  # the first pair is a warm-up
        loop = system.start_loop(f"{tag}{i}")
        sample = time_turn(loop, "noop")
        loop.stop()
        baseline = time_fresh_executor(mp_ctx)
        if i:
            ours.append(sample)
            theirs.append(baseline)
    return ours, theirs


def _warm_calls(loop: Any, executor: concurrent.futures.ProcessPoolExecutor, calls: int) -> dict[str, Any]:
    """Part 4 (a): ``calls`` warm no-op turns, each beside a warm executor's no-op."""
    for _ in range(max(10, calls // 10)):
        time_turn(loop, "noop")
        time_executor_call(executor)
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(calls):
        ours.append(time_turn(loop, "noop"))
        theirs.append(time_executor_call(executor))
    return _pair(ours, theirs, WARM_CALL_TARGET)


def bench_untrusted(plan: Plan, warm_only: bool = False) -> dict[str, Any]:
    """Part 4; with ``warm_only``, (a) alone."""
    mp_ctx = multiprocessing.get_context(START_METHOD)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(
        tmp, warm_workers=2, worker_idle_s=0.2
    ) as system, concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=mp_ctx) as executor:
        out["confinement"] = system.stats()["confinement"]["active"]
        system.register(NoOp, untrusted=True)
        system.register(OneShot, untrusted=True, worker_scope="call")
        loop = system.start_loop("warm")
        out["warm_call"] = _warm_calls(loop, executor, plan.system_calls)
        if warm_only:
            return out
        out["new_session_first_call"] = _pair(*_first_calls(system, plan, mp_ctx, "s"), NEW_SESSION_TARGET)
        ours, theirs = [], []
        for i in range(plan.worker_starts + 1):
            sample, baseline = time_turn(loop, "noop_once"), time_fresh_executor(mp_ctx)
            if i:
                ours.append(sample)
                theirs.append(baseline)
        out["worker_scope_call"] = _pair(ours, theirs)
    with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(
        tmp, warm_workers=0, worker_idle_s=0.2
    ) as system:
        system.register(NoOp, untrusted=True)
        out["cold_session_first_call"] = _pair(*_first_calls(system, plan, mp_ctx, "c"))
    return out


def _pair(ours: list[float], theirs: list[float], target: float | None = None) -> dict[str, Any]:
    ratio = percentile(ours, 50) / percentile(theirs, 50)
    out: dict[str, Any] = {
        "system_us": summary(ours),
        "process_pool_executor_us": summary(theirs),
        "ratio": round(ratio, 3),
    }
    if target is not None:
        out["target"], out["pass"] = target, ratio <= target
    return out


# --- part 5: the start of one confined child ---------------------------------------------------


def time_child_start(clean: bool) -> float:
    """One confined worker from the request to its ``READY``, in milliseconds: started
    clean, or (``clean=False``) by multiprocessing's fork server as before."""
    policy = default_policy()
    enclosure = Enclosure(policy, DEFAULT_HEAP_BYTES)
    setup = enclosure.setup
    if not clean:  # multiprocessing forks no child into a PID namespace of its own
        spec = setup.confinement
        if spec is not None and getattr(spec, "pid_namespace", False):
            spec = dataclasses.replace(spec, pid_namespace=False)
        setup = dataclasses.replace(setup, clean=False, confinement=spec)
    ctx = context(START_METHOD)
    try:
        t0 = time.perf_counter_ns()
        child = spawn(ctx, worker_child, WorkerConfig("plain", DEFAULT_HEAP_BYTES), setup, name="rho-bench")
        enclosure.started(child.pid)
        tag, _ = child.channel.recv(time.monotonic() + 30)
        elapsed = time.perf_counter_ns() - t0
        if tag != wire.READY:
            raise BenchmarkError(f"a confined child answered {tag!r}, not READY")
        enclosure.kill()
        child.proc.join(10)
        close(child.proc, child.channel.conn)
    finally:
        enclosure.remove()
    return elapsed / 1e6


def bench_child_start(plan: Plan) -> dict[str, Any]:
    hold_servers()
    try:
        for clean in (True, False, True, False):  # warm-up: both fork servers running
            time_child_start(clean)
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(plan.worker_starts):
            ours.append(time_child_start(True))
            theirs.append(time_child_start(False))
    finally:
        release_servers()
    return {
        "clean_ms": summary(ours),
        "forkserver_ms": summary(theirs),
        "ratio": round(percentile(ours, 50) / percentile(theirs, 50), 3),
    }


# --- part 6: many sessions -----------------------------------------------------------------------


def _many_sessions(untrusted: bool, calls: int, sessions: int) -> dict[str, Any]:
    """``sessions`` sessions, each a thread running turns of one ``five_ms`` call, until
    ``calls`` calls in all: throughput, latency, workers started, waits past a deadline."""
    per_session = max(1, calls // sessions)
    latencies: list[float] = []
    kinds: dict[str, int] = {}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(tmp, warm_workers=2) as system:
        if untrusted:
            system.register(FiveMs, untrusted=True)
        else:
            system.register(FiveMs, isolation="process")
        loops = [system.start_loop(f"m{i}") for i in range(sessions)]
        before = system.stats()
        go = threading.Barrier(sessions + 1)

        def session(loop: Any) -> None:
            go.wait(60)
            for _ in range(per_session):
                t0 = time.perf_counter_ns()
                [result] = loop.run_turn([ToolCall("c", "five_ms", "{}")], timeout_s=120)
                elapsed = (time.perf_counter_ns() - t0) / 1e6
                with lock:
                    latencies.append(elapsed)
                    if not result.ok:
                        key = f"{result.error_kind}: {result.content[:90]}"
                        kinds[key] = kinds.get(key, 0) + 1

        threads = [threading.Thread(target=session, args=(loop,), daemon=True) for loop in loops]
        for thread in threads:
            thread.start()
        go.wait(60)
        t0 = time.perf_counter_ns()
        for thread in threads:
            thread.join(600)
        wall = (time.perf_counter_ns() - t0) / 1e9
        after = system.stats()
    prefix = "untrusted_workers_" if untrusted else "workers_"
    return {
        "calls": len(latencies),
        "calls_per_s": round(len(latencies) / wall, 1),
        "latency_ms": summary(latencies),
        "workers_started": after.get(prefix + "started", 0) - before.get(prefix + "started", 0),
        "workers_cap": after.get("workers_cap"),
        "workers_running_cap": after.get("workers_running_cap", after.get("workers_cap")),
        "errors": kinds,
        "waited_out_deadline": sum(n for k, n in kinds.items() if "it did not start" in k),
    }


def bench_many_sessions(plan: Plan) -> dict[str, Any]:
    trusted = _many_sessions(False, plan.many_calls, plan.sessions)
    untrusted = _many_sessions(True, plan.many_calls, plan.sessions)
    ratio = untrusted["calls_per_s"] / trusted["calls_per_s"]
    return {
        "sessions": plan.sessions,
        "trusted": trusted,
        "untrusted": untrusted,
        "ratio": round(ratio, 3),
        "target": MANY_TARGET,
        "pass": ratio >= MANY_TARGET and untrusted["waited_out_deadline"] == 0 and not untrusted["errors"],
    }


# --- report ------------------------------------------------------------------------------------


def print_text(report: Mapping[str, Any]) -> None:
    env = report["environment"]
    print(
        f"rho_actors isolation benchmarks ({env['mode']} run; python {env['python']}, start method "
        f"{env['start_method']}, {env['cpus']} CPUs, load {env['load_avg_1m']})"
    )
    n = report["noop_call"]
    print("\n1. warm no-op call round trip (p50 / p99 in us, n samples)")
    for label, s in (
        ("ProcessPoolExecutor submit().result()", n["process_pool_executor_us"]),
        ("WorkerPool.run", n["worker_pool_us"]),
    ):
        print(f"   {label:<40} {s['p50']:>10.1f} / {s['p99']:>10.1f}   n={s['n']}")
    print(
        f"   ratio WorkerPool / executor (p50): {n['ratio']:.2f}x   target <= {n['target']:g}x   "
        f"{verdict(n['pass'])}   (p99 ratio {n['ratio_p99']:.2f}x)"
    )
    r = report["replacement"]
    print(f"\n2. a call past its deadline ({r['deadline_s'] * 1000:.0f} ms): worker killed and replaced (ms)")
    for label, s in (
        ("deadline -> timeout result", r["deadline_to_result_ms"]),
        ("deadline -> replacement ready", r["deadline_to_ready_ms"]),
    ):
        print(f"   {label:<40} {s['p50']:>10.2f} / {s['p99']:>10.2f}   n={s['n']}")
    print(
        f"   deadline -> ready (p50): {r['deadline_to_ready_ms']['p50']:.1f} ms   target <= "
        f"{r['target_ms']:g} ms   {verdict(r['pass'])}"
    )
    d = report["declarations"]
    print(
        f"\n3. {d['tools']} untrusted declarations read in child processes and checked, "
        f"{d['concurrency']} at a time ({d['accepted']} accepted)"
    )
    print(f"   wall time per tool p50 / p99: {d['per_tool_ms']['p50']:.2f} / {d['per_tool_ms']['p99']:.2f} ms   "
          f"n={d['per_tool_ms']['n']} rounds")
    s = d["one_read_alone_ms"]
    print(f"   one read alone p50 / p99:     {s['p50']:.2f} / {s['p99']:.2f} ms   n={s['n']}")
    s = d["process_start_ms"]
    print(f"   one bare process start+join:  {s['p50']:.2f} / {s['p99']:.2f} ms   n={s['n']}")
    print(
        f"   per tool (mean of rounds): {d['per_tool_ms']['mean']:.2f} ms   target < {d['target_ms']:g} ms   "
        f"{verdict(d['pass'])}"
    )
    u = report["untrusted"]
    print(f"\n4. untrusted no-op through an ActorSystem (confinement: {', '.join(u['confinement'])})")
    print("   p50 / p99 in us (n); baseline: ProcessPoolExecutor, warm for (a), new for (b)-(d)")
    for key, label in (
        ("warm_call", "(a) warm call"),
        ("new_session_first_call", "(b) first call of a new session"),
        ("worker_scope_call", '(c) worker_scope="call" call'),
        ("cold_session_first_call", "(d) (b) with no spare kept"),
    ):
        ours, theirs = u[key]["system_us"], u[key]["process_pool_executor_us"]
        goal = f"   target <= {u[key]['target']:g}x {verdict(u[key]['pass'])}" if "target" in u[key] else ""
        print(
            f"   {label:<34} {ours['p50']:>9.0f} / {ours['p99']:>9.0f}  vs {theirs['p50']:>9.0f} / "
            f"{theirs['p99']:>9.0f}   {u[key]['ratio']:.2f}x   n={ours['n']}{goal}"
        )
    c = report["child_start"]
    print("\n5. start of one confined child, request -> READY (p50 / p99 in ms, n samples)")
    for label, s in (("clean fork server (python -I)", c["clean_ms"]),
                     ("multiprocessing forkserver (before)", c["forkserver_ms"])):
        print(f"   {label:<40} {s['p50']:>10.2f} / {s['p99']:>10.2f}   n={s['n']}")
    print(f"   ratio clean / forkserver (p50): {c['ratio']:.2f}x")


def print_warm(report: Mapping[str, Any]) -> None:
    env, w = report["environment"], report["untrusted"]["warm_call"]
    ours, theirs = w["system_us"], w["process_pool_executor_us"]
    print(f"4 (a). warm untrusted no-op call (run_turn) vs warm ProcessPoolExecutor, load {env['load_avg_1m']}")
    print(f"   p50 / p99 in us: {ours['p50']:.0f} / {ours['p99']:.0f}  vs {theirs['p50']:.0f} / {theirs['p99']:.0f}"
          f"   {w['ratio']:.2f}x   n={ours['n']}   target <= {w['target']:g}x {verdict(w['pass'])}")


def print_many(report: Mapping[str, Any]) -> None:
    m = report["many_sessions"]
    print(f"\n6. {m['sessions']} sessions, turns of one 5 ms call (throughput, latency p50 / p99 ms, workers started)")
    for label in ("trusted", "untrusted"):
        r = m[label]
        print(
            f"   {label + ' ' + ('(process)' if label == 'trusted' else '(confined)'):<22} {r['calls_per_s']:>7.1f} "
            f"calls/s   {r['latency_ms']['p50']:>8.1f} / {r['latency_ms']['p99']:>8.1f} ms   "
            f"{r['workers_started']:>5} workers for {r['calls']} calls   errors {r['errors'] or 'none'}"
        )
    print(
        f"   ratio untrusted / trusted throughput: {m['ratio']:.2f}x   target >= {m['target']:g}x, no call waiting "
        f"out its deadline ({m['untrusted']['waited_out_deadline']})   {verdict(m['pass'])}"
    )
    u = m["untrusted"]
    print(f"   caps: {u['workers_cap']} worker processes (running or idle), {u['workers_running_cap']} running at once")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke run of a few seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every number, nothing else")
    parser.add_argument("--many", action="store_true", help="part 6 (many sessions) only")
    parser.add_argument("--cold", action="store_true", help="part 7 (a system's first process calls) only")
    parser.add_argument("--warm", action="store_true", help="part 4 (a) (a warm untrusted call) only")
    parser.add_argument("--calls", type=int, default=None, help="calls of part 4 (a) (default 500, --quick 30)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.calls is not None:
        plan = dataclasses.replace(plan, system_calls=args.calls)
    started = time.perf_counter_ns()
    report: dict[str, Any] = {"environment": environment(args.quick, start_method=START_METHOD)}
    try:
        if args.warm:
            report["untrusted"] = bench_untrusted(plan, warm_only=True)
        elif args.cold:
            report["cold_start"] = bench_cold_start(args.quick)
        elif not args.many:
            with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp:
                tools = load_plugin(Path(tmp))
                report["noop_call"] = bench_noop(plan)
                report["replacement"] = bench_replacement(plan)
                report["declarations"] = bench_declarations(plan, tools)
                report["untrusted"] = bench_untrusted(plan)
                report["child_start"] = bench_child_start(plan)
        if not (args.cold or args.warm):
            report["many_sessions"] = bench_many_sessions(plan)
        if not (args.cold or args.many or args.warm):
            report["cold_start"] = bench_cold_start(args.quick)
    except BenchmarkError as exc:
        print(f"benchmark error: {exc}", file=sys.stderr)
        return 1

    def show(r: Mapping[str, Any]) -> None:
        if "noop_call" in r:
            print_text(r)
        elif "untrusted" in r:
            print_warm(r)
        if "many_sessions" in r:
            print_many(r)
        if "cold_start" in r:
            print_cold_start(dict(r))

    return publish(report, started, args.json, show)


if __name__ == "__main__":
    sys.exit(main())
