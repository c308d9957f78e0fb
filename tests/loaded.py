"""Run a command while busy loops keep every core busy: ``make test-loaded``.

``python -m tests.loaded [--loops N] -- COMMAND...`` starts ``N`` Python processes that
spin until killed (default: twice the cores, at least 4: a load of 8 and more on two
cores once the command's own processes add to it), runs ``COMMAND``, kills the loops
(each by its process id) and exits with the command's status. It prints the load
average before and after and the command's wall time, the figures a loaded run reports.

The suite's time bounds scale with the machine (``tests/conftest.py``): a run under this
load must pass as a quiet one does.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

SPIN = "while True: pass"


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the command under load; returns its exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.loaded", description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=max(4, 2 * (os.cpu_count() or 1)),
                        help="busy processes to start (default: twice the cores, at least 4)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    options = parser.parse_args(argv)
    command = [c for c in options.command if c != "--"] or [sys.executable, "-m", "pytest"]
    signal.signal(signal.SIGTERM, _interrupted)  # a stopped run stops its command and its loops too
    loops = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(options.loops)]
    print(f"[loaded] {len(loops)} busy loops started; load average {_load()}", flush=True)
    began = time.monotonic()
    run = None
    try:
        run = subprocess.Popen(command, start_new_session=True)  # its group: pytest and its workers
        status = run.wait()
    except KeyboardInterrupt:
        status = 130
    finally:
        ended = _load()
        if run is not None and run.poll() is None:
            os.killpg(run.pid, signal.SIGTERM)
            status = run.wait()
        for loop in loops:
            loop.kill()
        for loop in loops:
            loop.wait()
    print(f"[loaded] {' '.join(command)}: exit {status} in {time.monotonic() - began:.0f} s;"
          f" load average at the end {ended}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
