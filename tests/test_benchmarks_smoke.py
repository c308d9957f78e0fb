"""Smoke test of ``benchmarks/bench_calls.py``: it runs and reports every number.

Timings are never asserted here (the machine may be shared and noisy); only the shape
of the ``--json`` report and that its measurements are positive numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_calls.py"

pytestmark = pytest.mark.timeout(180)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _check_summary(s: Any) -> None:
    assert isinstance(s, dict)
    assert s["n"] >= 1
    for key in ("p50", "p99", "min"):
        assert _positive(s[key]), (key, s)
    assert s["min"] <= s["p50"] <= s["p99"]


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json"],
        capture_output=True,
        check=False,
        text=True,
        timeout=150,
        cwd=SCRIPT.parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert isinstance(data, dict)
    return data


def test_report_has_every_part(report: dict[str, Any]) -> None:
    assert {"environment", "noop_call", "parallel_turn", "bfcl_replay", "total_s"} <= set(report)
    assert report["environment"]["mode"] == "quick"
    assert _positive(report["total_s"])


def test_noop_call(report: dict[str, Any]) -> None:
    n = report["noop_call"]
    for key in ("rho_actors_us", "bare_pykka_us", "direct_us"):
        _check_summary(n[key])
    assert _positive(n["ratio"])
    assert _positive(n["ratio_p99"])
    assert n["target"] == 2.0
    assert isinstance(n["pass"], bool)


def test_parallel_turn(report: dict[str, Any]) -> None:
    p = report["parallel_turn"]
    assert (p["calls"], p["sleep_ms"], p["ideal_ms"]) == (16, 100, 100)
    _check_summary(p["wall_ms"])
    assert _positive(p["ratio"])
    assert p["target"] == 1.5
    assert isinstance(p["pass"], bool)


def test_bfcl_replay_or_skip_reason(report: dict[str, Any]) -> None:
    b = report["bfcl_replay"]
    if b["skipped"]:
        assert isinstance(b["reason"], str) and b["reason"]
        return
    assert b["category"] == "base"
    assert b["sessions"] >= 1 and b["calls"] >= 1 and b["runs"] >= 1
    _check_summary(b["replay_wall_s"])
    _check_summary(b["direct_wall_s"])
    assert _positive(b["ratio"])
    assert b["target"] == 10.0
    assert isinstance(b["pass"], bool)
