"""What the benchmark scripts share: sample summaries, verdicts and the run's environment."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
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
