"""Tools of tests/test_task_reruns.py, imported by its host processes: each run is
appended to ``$RHO_TEST_RUNS``; a run waits while ``$RHO_TEST_HOLD`` names a file that
exists (100 s at most)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rho_actors import tool


def _run(what: str) -> None:
    with open(os.environ["RHO_TEST_RUNS"], "a") as runs:
        runs.write(what + "\n")
    hold = os.environ.get("RHO_TEST_HOLD")
    until = time.monotonic() + 100
    while hold and Path(hold).exists() and time.monotonic() < until:
        time.sleep(0.01)


@tool(background=True, background_timeout_ms=120_000, idempotent=True)
def reindex(table: str) -> str:
    """Rebuild a table's index (idempotent: running it twice does no harm)."""
    _run(f"reindex {table}")
    return f"reindexed {table}"


@tool(background=True, background_timeout_ms=120_000)
def charge(amount: int) -> str:
    """Charge an amount (not idempotent)."""
    _run(f"charge {amount}")
    return f"charged {amount}"
