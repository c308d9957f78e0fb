"""What the benchmark scripts share: sample summaries, verdicts and the run's environment."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


class BenchmarkError(RuntimeError):
    """A measurement could not be made (not a missed target)."""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float], digits: int = 2) -> dict[str, float | int]:
    """``n``, ``p50``, ``p99`` and ``min`` of the samples; ``BenchmarkError`` when none."""
    if not values:
        raise BenchmarkError("no samples")
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), digits),
        "p99": round(percentile(values, 99), digits),
        "min": round(min(values), digits),
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def environment(quick: bool, **extra: Any) -> dict[str, Any]:
    """The run's mode, Python version, CPU count and 1-minute load, plus ``extra``."""
    return {
        "mode": "quick" if quick else "full",
        "python": platform.python_version(),
        **extra,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def publish(
    report: dict[str, Any], started_ns: int, as_json: bool, print_text: Callable[[Mapping[str, Any]], None]
) -> int:
    """Add ``total_s`` (since ``started_ns``, a ``time.perf_counter_ns()`` reading) and
    print the report as JSON or as text; returns the exit code, 0."""
    report["total_s"] = round((time.perf_counter_ns() - started_ns) / 1e9, 2)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_text(report)
        print(f"\ntotal {report['total_s']:.1f} s")
    return 0


def fsync_ms(folder: Path, sync: Callable[[int], None] = os.fsync) -> dict[str, float | int]:
    """What one append of a 300-byte record and its ``sync`` (``os.fsync`` unless given:
    a benchmark that counts syncs passes the real one) cost on the disk of ``folder``, in
    milliseconds: :func:`summary` of 30 samples. The floor of anything durable."""
    path = folder / "fsync-probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    samples = []
    try:
        for _ in range(30):
            started = time.perf_counter_ns()
            os.write(fd, b"x" * 300 + b"\n")
            sync(fd)
            samples.append((time.perf_counter_ns() - started) / 1e6)
    finally:
        os.close(fd)
        path.unlink()
    return summary(samples, 3)
