"""Where one no-op ``run_turn`` spends its time, hop by hop.

A measuring aid for issue #12, not a benchmark with targets. It wraps (never edits)
methods of the loop's ``Turns``, of ``ThreadIsolation`` (the call thread's job) and of
the call's ``Answer`` in this process only, to stamp each step of one call with
``time.perf_counter_ns``.

Usage::

    .venv/bin/python benchmarks/profile_call_path.py          # hop-by-hop medians
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.isolation import thread as thread_module
from rho_actors.loop import turns as turns_module

_stamps: dict[str, int] = {}


def stamp(name: str, method: Callable[..., Any], after: str | None = None) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _stamps[name] = time.perf_counter_ns()
        out = method(*args, **kwargs)
        if after is not None:
            _stamps[after] = time.perf_counter_ns()
        return out

    return wrapped


def instrument() -> None:
    loop_cls, thread_cls, answer_cls = turns_module.Turns, thread_module.ThreadIsolation, thread_module._Running
    loop_cls.submit = stamp("loop_got_turn", loop_cls.submit)  # type: ignore[method-assign]
    loop_cls._dispatch = stamp("dispatch_start", loop_cls._dispatch, "dispatch_told")  # type: ignore[method-assign]
    answer_cls.__call__ = stamp("call_got_spec", answer_cls.__call__)  # type: ignore[method-assign]  # its thread's job
    thread_cls._run = stamp("call_ran_start", thread_cls._run, "call_ran")  # type: ignore[method-assign]
    answer_cls.settle = stamp("call_ended", answer_cls.settle)  # type: ignore[method-assign]
    loop_cls._finish = stamp("settled", loop_cls._finish, "loop_done")  # type: ignore[method-assign]


STEPS = (
    ("host: checks, find the loop's turns", "t0", "loop_got_turn"),
    ("host: decode + look up + validate", "loop_got_turn", "dispatch_start"),
    ("host: dispatch (ctx, CancelToken, timer, hand-off)", "dispatch_start", "dispatch_told"),
    ("host hand-off -> the call thread runs the job (hop 1)", "dispatch_told", "call_got_spec"),
    ("call: run the tool, build the result", "call_got_spec", "call_ran"),
    ("call: count itself ended, to the reply", "call_ran", "call_ended"),
    ("call: reply settles the turn (timer, lock, budget)", "call_ended", "settled"),
    ("call: hand the results to the turn's future", "settled", "loop_done"),
    ("future set -> host returns (hop 2; < 0: the host woke first)", "loop_done", "t1"),
    ("run_turn, whole", "t0", "t1"),
)


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3000, help="calls timed (after 300 warm-up calls)")
    args = parser.parse_args()
    instrument()
    samples: dict[str, list[float]] = {label: [] for label, _, _ in STEPS}
    with tempfile.TemporaryDirectory() as tmp, ActorSystem(data_dir=tmp) as system:
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
            waited = time.monotonic() + 1.0  # the call's thread stamps its last step after the host wakes
            while "loop_done" not in _stamps and time.monotonic() < waited:
                time.sleep(0)
            if i >= 300:
                for label, start, end in STEPS:
                    samples[label].append((_stamps[end] - _stamps[start]) / 1000)
        loop.stop()
    print(f"one no-op @tool run_turn: medians of {args.n} calls (us)")
    for label, values in samples.items():
        print(f"   {statistics.median(values):8.1f}  {label}")


if __name__ == "__main__":
    main()
