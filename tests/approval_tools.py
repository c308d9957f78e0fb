"""Tools of the approval tests run by host processes (tests/test_approvals_durable.py):
each run is appended to ``$RHO_TEST_RUNS`` so a test counts runs across processes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rho_actors import tool


def _ran(what: str) -> None:
    with open(os.environ["RHO_TEST_RUNS"], "a") as runs:
        runs.write(what + "\n")
        runs.flush()
        os.fsync(runs.fileno())


@tool(requires_approval=True, timeout_ms=120_000)
def delete(path: str) -> str:
    """Delete a file; waits while ``$RHO_TEST_HOLD`` names a file that exists."""
    _ran(f"delete {path}")
    hold = os.environ.get("RHO_TEST_HOLD")
    until = time.monotonic() + 100
    while hold and Path(hold).exists() and time.monotonic() < until:
        time.sleep(0.01)
    return f"deleted {path}"


@tool
def look(path: str) -> str:
    """Look at a file."""
    return f"looked at {path}"


class Put:
    """A tool that stores a value: running a call of it twice does no harm (idempotent)."""

    idempotent = True
    requires_approval = True

    @staticmethod
    def name() -> str:
        return "put"

    @staticmethod
    def description() -> str:
        return "Store a value under a key."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}

    @staticmethod
    def timeout_ms() -> int:
        return 120_000

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return str(delete.func(args["key"])).replace("deleted", "stored")
