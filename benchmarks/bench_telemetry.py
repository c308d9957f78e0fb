"""The per-call cost of OpenTelemetry: one ``noop`` call per turn through a LoopActor,

- ``none``: no provider configured (the API's default; what every host gets until it
  configures OpenTelemetry): the baseline;
- ``off``: providers configured, ``ActorSystem(tracing=False)``;
- ``on``: providers configured (an SDK TracerProvider with a SimpleSpanProcessor into an
  InMemorySpanExporter, a MeterProvider with an InMemoryMetricReader), tracing on.

Prints the p50/p99 per call (microseconds) and each ratio to ``none``, measured in the
same run. ``off`` is meant to stay within noise of ``none``.

    .venv/bin/python benchmarks/bench_telemetry.py [--calls N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

from stats import summary

from rho_actors import ActorSystem, ToolCall, tool


@tool
def noop() -> str:
    """Do nothing."""
    return ""


def per_call_us(system: ActorSystem, calls: int) -> list[float]:
    system.register(noop)
    loop = system.start_loop("bench")
    batch = [ToolCall("c", "noop", "{}")]
    for _ in range(100):  # warm up
        loop.run_turn(batch)
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        loop.run_turn(batch)
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


def measure(calls: int, **system_kwargs: Any) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory() as data_dir, ActorSystem(data_dir, **system_kwargs) as system:
        return summary(per_call_us(system, calls), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    report: dict[str, Any] = {"none": measure(args.calls)}
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    report["off"] = measure(args.calls, tracing=False)
    report["on"] = measure(args.calls)
    report["spans_recorded"] = len(exporter.get_finished_spans())
    base = report["none"]["p50"]
    report["ratio_off"] = round(report["off"]["p50"] / base, 2)
    report["ratio_on"] = round(report["on"]["p50"] / base, 2)
    if args.json:
        print(json.dumps(report))
        return 0
    for key in ("none", "off", "on"):
        s = report[key]
        print(f"{key:>4}: p50 {s['p50']:8.1f} us  p99 {s['p99']:8.1f} us  ratio to none {s['p50'] / base:.2f}")
    print(f"spans recorded with tracing on: {report['spans_recorded']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
