"""Tools of tests/test_held_mcp_restart.py, served by real ``rho-actors mcp serve``
processes: each run is appended to ``$RHO_TEST_RUNS`` (counted across servers)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rho_actors import tool


def _ran(what: str) -> None:
    with open(os.environ["RHO_TEST_RUNS"], "a") as runs:
        runs.write(what + "\n")
        runs.flush()
        os.fsync(runs.fileno())


@tool(requires_approval=True, timeout_ms=120_000)
def wipe(path: str) -> str:
    """Wipe a path, once approved (its tools/call waits for the decision)."""
    _ran(f"wipe {path}")
    return f"wiped {path}"


@tool(background=True, requires_approval=True, timeout_ms=120_000)
def wipe_later(path: str) -> str:
    """Wipe a path as a task, once approved."""
    _ran(f"wipe_later {path}")
    return f"wiped {path} later"


def _held_while_hold_exists(what: str) -> None:
    """Record the start of ``what``, then wait while ``$RHO_TEST_HOLD`` exists (at most 100 s)."""
    _ran(what)
    until = time.monotonic() + 100
    while Path(os.environ["RHO_TEST_HOLD"]).exists() and time.monotonic() < until:
        time.sleep(0.01)


@tool(background=True, timeout_ms=120_000)
def crawl(path: str) -> str:
    """Crawl a path as a task (running it twice would do harm: not run again after a crash)."""
    _held_while_hold_exists(f"crawl {path}")
    return f"crawled {path}"


@tool(background=True, idempotent=True, timeout_ms=120_000)
def index(path: str) -> str:
    """Index a path as a task (idempotent: run again after a crash)."""
    _held_while_hold_exists(f"index {path}")
    return f"indexed {path}"
