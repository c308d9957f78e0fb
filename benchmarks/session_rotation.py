"""Sessions calling in turn through fewer untrusted workers than sessions (DESIGN §5
"Fair shares"): ``N+1`` sessions each call a confined no-op tool in round robin, one
call at a time, through ``max_workers=N``; after each session's first call (a worker of
its own), it counts the worker starts of the timed calls and prints starts per call and
the calls' median and p90 wall time, beside ``N`` sessions (no rotation). Untrusted
workers serve one (tool, session) pair, so a cyclic access over more sessions than
workers evicts a worker at every call under a recency order (the longest idle, each
session's next one).

Usage: ``python benchmarks/session_rotation.py [N] [ROUNDS]`` (default 2 and 5).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from rho_actors import ActorSystem, ToolCall, UntrustedReads
from rho_actors.function_tool import tool


@tool
def echo(text: str) -> str:
    """Return ``text``."""
    return text


def rotate(max_workers: int, sessions: int, rounds: int) -> str:
    """One run: the line it prints."""
    with ActorSystem(tempfile.mkdtemp(), max_workers=max_workers, untrusted=UntrustedReads(timeout_s=30)) as system:
        assert system.register(echo, untrusted=True).info
        loops = [system.start_loop(f"s{i}") for i in range(sessions)]
        for i, loop in enumerate(loops):  # each session's first call: a worker of its own
            [result] = loop.run_turn([ToolCall(f"w{i}", "echo", '{"text": "x"}')])
            assert result.ok, result.content
        before = system.stats().get("untrusted_workers_started", 0)
        times = []
        for k in range(rounds):
            for i, loop in enumerate(loops):
                started = time.monotonic()
                [result] = loop.run_turn([ToolCall(f"c{k}-{i}", "echo", f'{{"text": "{k}"}}')])
                assert result.ok, result.content
                times.append(time.monotonic() - started)
        starts = system.stats().get("untrusted_workers_started", 0) - before
    times.sort()
    return (f"max_workers={max_workers} sessions={sessions} calls={len(times)} starts/call={starts / len(times):.2f} "
            f"median {1000 * times[len(times) // 2]:.1f} ms p90 {1000 * times[int(len(times) * 0.9)]:.1f} ms")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for sessions in (n, n + 1):
        print(rotate(n, sessions, rounds))
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
