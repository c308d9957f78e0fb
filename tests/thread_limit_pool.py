"""A ThreadPool at the host's thread limit, for test_thread_starts: run as
``python thread_limit_pool.py CGROUP`` by a process already in the pids cgroup ``CGROUP``
(cgroup v1). With one idle thread kept, ``pids.max`` is set to the tasks it has, and two
jobs are submitted at once, the first waiting for the second to run (as the calls of a
turn that only end together). It prints ``raised`` when the second job's submit raised
(no thread for it), ``ran`` when it ran, ``LOST`` when it neither raised nor ran."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from rho_actors.otp import threads
from rho_actors.otp.threads import ThreadPool
from tests.conftest import WAIT_S


def main() -> None:
    cgroup = Path(sys.argv[1])
    threads._PATIENCE_S = 60.0  # the two submits count as one burst, however loaded the host
    pool = ThreadPool()
    warm = threading.Event()
    pool.submit(warm.set, "warm")
    until = time.monotonic() + WAIT_S
    while pool.idle() != 1 and time.monotonic() < until:  # the warm job's thread idle again
        time.sleep(0.001)
    second_ran, first_done = threading.Event(), threading.Event()

    def first() -> None:
        second_ran.wait(WAIT_S)
        first_done.set()

    limit = (cgroup / "pids.max").read_text()
    (cgroup / "pids.max").write_text((cgroup / "pids.current").read_text())
    try:
        pool.submit(first, "first")
        try:
            pool.submit(second_ran.set, "second")
        except RuntimeError:
            outcome = "raised"
        else:
            outcome = "ran" if second_ran.wait(WAIT_S) else "LOST"  # a started thread runs it, late when loaded
    finally:
        (cgroup / "pids.max").write_text(limit)
    second_ran.set()  # the first job ends either way
    first_done.wait(WAIT_S)
    print(outcome, flush=True)


if __name__ == "__main__":
    main()
