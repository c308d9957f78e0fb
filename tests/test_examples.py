"""Every example runs and prints what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=60,
                          check=True)
    return done.stdout


def test_the_kv_server_survives_a_crash_with_fresh_state() -> None:
    assert run("kv_server.py").splitlines() == ["stored", "Lisbon", "(not set)", "restarts: 1"]
