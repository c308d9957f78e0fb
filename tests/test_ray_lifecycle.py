"""Reaching Ray and leaving it: an unreachable cluster never hangs a call, the Ray guide's
example runs as written, and ``stop()`` leaves no Ray process behind. Each runs in a
fresh Python (Ray's connection is per process), on loopback only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import WAIT_S, slack

pytest.importorskip("ray", reason="ray is not installed (pip install 'rho_actors[ray]')")

ROOT = Path(__file__).resolve().parent.parent

UNREACHABLE = textwrap.dedent('''
    import json, socket, time
    from rho_actors import ActorSystem, ToolCall, tool

    silent = socket.socket()  # a "cluster" that takes connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)

    @tool(timeout_ms=2000)
    def probe() -> str:
        """Probe."""
        return "ran"

    out = {}
    system = ActorSystem(ray={"address": f"127.0.0.1:{silent.getsockname()[1]}", "connect_timeout_s": 4})
    system.register(probe, isolation="ray")
    loop = system.start_loop("s")
    for call_id in ("c1", "c2", "c3"):
        began = time.monotonic()
        [result] = loop.run_turn([ToolCall(call_id, "probe", "{}")])
        out[call_id] = [result.error_kind.value if result.error_kind else None, result.content,
                        time.monotonic() - began]
    began = time.monotonic()
    system.stop()
    out["stop_s"] = time.monotonic() - began
    print(json.dumps(out))
''')


def _run(code: str, timeout_s: float) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=timeout_s,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_an_unreachable_cluster_makes_calls_unavailable_on_time() -> None:
    """Connecting runs off the call path and is bounded: a 2 s call made while Ray does
    not answer is ``unavailable`` at its deadline, a call after ``connect_timeout_s`` at
    once, and ``stop()`` does not wait for the connection."""
    out = _run(UNREACHABLE, 90)
    kind, text, took = out["c1"]
    assert kind == "unavailable" and "still connecting to the Ray cluster at 127.0.0.1:" in text, out
    assert 1.9 < took < 2.0 + slack(1.5), out
    for call_id in ("c2", "c3"):
        kind, text, took = out[call_id]
        assert kind == "unavailable" and took < 2.0 + slack(1.5), out
    kind, text, took = out["c3"]
    assert "no answer within 4 s" in text and took < slack(0.5), out  # the bound has passed: at once
    assert out["stop_s"] < slack(5.0), out


def _snippet() -> str:
    guide = (ROOT / "docs" / "guides" / "ray.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    return str(code)


GUIDE_RUN = '''
import ctypes, json, time
import psutil
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphaned Ray processes stay ours to see
seen = set()
exec(compile(SNIPPET, "ray.md", "exec"))  # stops its system as written: the with block
left, until = [], time.monotonic() + WAIT_S  # the Ray processes' exits, slower on a loaded machine
while time.monotonic() < until:
    left = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    if not left:
        break
    time.sleep(0.05)
print(json.dumps({"left": [" ".join(p.cmdline()[:2]) for p in left], "counted": [counted.ok, counted.content]}))
'''


def test_the_guide_s_ray_example_runs_as_written_and_stop_leaves_no_ray_process() -> None:
    """The Ray guide's snippet (docs/guides/ray.md), unchanged, in a fresh process: a
    local Ray is started, the ``ray`` tool runs on it, the RayActor server (no ``runtime=``) runs on the system's
    own Ray runtime and is reached from the tool; after the ``with`` block no Ray process
    the system started is left (GCS, raylet, workers: all children of the host)."""
    code = f"SNIPPET = {_snippet()!r}\nWAIT_S = {WAIT_S!r}\n" + GUIDE_RUN
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=5 * WAIT_S,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert lines[0] == "opened 1 page(s): https://example.com", run.stdout
    assert json.loads(lines[-1]) == {"left": [], "counted": [True, "3"]}, run.stdout
