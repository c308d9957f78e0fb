"""What confining a worker costs: ``apply()`` in a fresh child, and creating plus removing
a cgroup, each beside a bare ``fork()`` + exit measured in the same run.

    python benchmarks/bench_confinement.py [--rounds 30]

Prints the median per worker in microseconds and the ratio to the bare fork. Every
mechanism this host offers is used (uid drop as root, Landlock, cgroup when possible).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import time

from rho_actors.cgroups import Cgroup
from rho_actors.confinement import Confinement, apply, make_private_dir, probe, python_read_paths


def _in_child(work: Confinement | None) -> float:
    """Fork; the child times ``apply(work)`` (nothing for None) and reports it; returns µs."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        start = time.perf_counter()
        if work is not None:
            apply(work)
        os.write(w, struct.pack("d", (time.perf_counter() - start) * 1e6))
        os._exit(0)
    os.close(w)
    elapsed = struct.unpack("d", os.read(r, 8))[0]
    os.close(r)
    os.waitpid(pid, 0)
    return float(elapsed)


def _fork_exit() -> float:
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return (time.perf_counter() - start) * 1e6


def _cgroup(i: int) -> float:
    start = time.perf_counter()
    group = Cgroup(f"bench-{i}", memory_max=256 * 2**20, pids_max=64)
    group.kill()
    group.remove()
    return (time.perf_counter() - start) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="workers per measurement (default 30)")
    rounds = parser.parse_args().rounds
    host = probe()
    print("mechanisms:", {k: v["available"] for k, v in host.as_dict().items()})
    private = make_private_dir()
    spec = Confinement(read_only=python_read_paths(), private_dir=private, landlock=host.landlock is None)
    try:
        fork = statistics.median(_fork_exit() for _ in range(rounds))
        applied = statistics.median(_in_child(spec) for _ in range(rounds))
        print(f"bare fork + exit        {fork:9.0f} µs")
        print(f"apply() in the child    {applied:9.0f} µs  ({applied / fork:.2f}x a bare fork)")
        if host.cgroup is None:
            cgroup = statistics.median(_cgroup(i) for i in range(rounds))
            print(f"cgroup create + remove  {cgroup:9.0f} µs  ({cgroup / fork:.2f}x a bare fork)")
        else:
            print(f"cgroup: unavailable ({host.cgroup})")
    finally:
        os.rmdir(private)


if __name__ == "__main__":
    main()
