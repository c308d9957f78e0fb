"""Where one no-op ``run_turn`` spends its time, hop by hop, and what pooled threads save.

A measuring aid for issue #12, not a benchmark with targets. It wraps (never edits)
methods of ``LoopActor`` and ``CallActor`` in this process only, to stamp each step of
one call with ``time.perf_counter_ns``; ``--pooled`` also makes CallActors run their
loop on a reused thread (the prototype of "a fresh actor does not need a fresh OS
thread": a new actor, inbox and identity per call; only the OS thread is reused).

Usage::

    .venv/bin/python benchmarks/profile_call_path.py                 # hop-by-hop medians
    .venv/bin/python benchmarks/profile_call_path.py --pooled        # the same with pooled threads
    .venv/bin/python benchmarks/profile_call_path.py --pooled --spares 0
"""

from __future__ import annotations

import argparse
import queue
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors import call as call_module
from rho_actors import loop_actor as loop_module

_stamps: dict[str, int] = {}


class ThreadPool:
    """Threads that run actor loops one after another: a new thread only when none is
    idle. An abandoned (hung) call keeps its thread until the tool returns."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._serve, daemon=True, name="rho-call").start()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()  # an actor loop: rho_actors.Actor lets nothing escape it
            with self._lock:
                self._idle += 1


def stamp(name: str, method: Callable[..., Any], after: str | None = None) -> Callable[..., Any]:
    def wrapped(*args: Any) -> Any:
        _stamps[name] = time.perf_counter_ns()
        out = method(*args)
        if after is not None:
            _stamps[after] = time.perf_counter_ns()
        return out

    return wrapped


def instrument(pooled: bool) -> None:
    loop_cls, call_cls = loop_module.LoopActor, call_module.CallActor
    loop_cls._run_turn = stamp("loop_got_turn", loop_cls._run_turn)  # type: ignore[method-assign]
    loop_cls._dispatch = stamp("dispatch_start", loop_cls._dispatch, "dispatch_told")  # type: ignore[method-assign]
    call_cls._run = stamp("call_got_spec", call_cls._run, "call_stopped")  # type: ignore[method-assign]
    original_loop = call_cls._actor_loop

    def actor_loop(self: Any) -> None:
        original_loop(self)
        _stamps["call_replied"] = time.perf_counter_ns()

    call_cls._actor_loop = actor_loop  # type: ignore[method-assign]
    loop_cls._call_done = stamp("loop_got_done", loop_cls._call_done, "loop_done")  # type: ignore[method-assign]
    if pooled:
        pool = ThreadPool()
        call_cls._start_actor_loop = lambda self: pool.submit(self._actor_loop)  # type: ignore[method-assign]


STEPS = (
    ("host submit -> loop has the turn (hop 1)", "t0", "loop_got_turn"),
    ("loop: decode + look up + validate", "loop_got_turn", "dispatch_start"),
    ("loop: dispatch (ctx, CancelToken, timer, take, tell)", "dispatch_start", "dispatch_told"),
    ("loop told -> CallActor has the spec (hop 2)", "dispatch_told", "call_got_spec"),
    ("call: run the tool, build the result, stop()", "call_got_spec", "call_stopped"),
    ("call: pykka teardown, then the reply", "call_stopped", "call_replied"),
    ("reply -> loop has _CallDone (hop 3)", "call_replied", "loop_got_done"),
    ("loop: settle, events, set_result, replenish", "loop_got_done", "loop_done"),
    ("loop settled -> host returns (hop 4; < 0: the host woke first)", "loop_done", "t1"),
    ("run_turn, whole", "t0", "t1"),
)


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pooled", action="store_true", help="run CallActors on reused threads")
    parser.add_argument("--spares", type=int, default=None, help="ActorSystem(spare_calls=...)")
    parser.add_argument("-n", type=int, default=3000, help="calls timed (after 300 warm-up calls)")
    args = parser.parse_args()
    instrument(args.pooled)
    options = {} if args.spares is None else {"spare_calls": args.spares}
    samples: dict[str, list[float]] = {label: [] for label, _, _ in STEPS}
    with tempfile.TemporaryDirectory() as tmp, ActorSystem(data_dir=tmp, **options) as system:
        system.register(noop)
        loop = system.start_loop("profile")
        call = [ToolCall("c1", "noop", "{}")]
        for i in range(300 + args.n):
            _stamps.clear()
            _stamps["t0"] = time.perf_counter_ns()
            [result] = loop.run_turn(call)
            _stamps["t1"] = time.perf_counter_ns()
            if not result.ok:
                raise SystemExit(f"the no-op call failed: {result.content}")
            waited = time.monotonic() + 1.0  # the loop thread stamps its last step after the host wakes
            while not {"loop_done", "call_replied"} <= _stamps.keys() and time.monotonic() < waited:
                time.sleep(0)
            if i >= 300:
                for label, start, end in STEPS:
                    samples[label].append((_stamps[end] - _stamps[start]) / 1000)
        loop.stop()
    mode = "pooled threads" if args.pooled else "a new thread per CallActor"
    print(f"one no-op @tool run_turn, {mode}, spare_calls={args.spares}: medians of {args.n} calls (us)")
    for label, values in samples.items():
        print(f"   {statistics.median(values):8.1f}  {label}")


if __name__ == "__main__":
    main()
