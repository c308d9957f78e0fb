"""What confining a worker costs: ``apply()`` in a fresh child, and creating plus removing
a cgroup, each beside a bare ``fork()`` + exit measured in the same run.

    python benchmarks/bench_confinement.py [--rounds 30]

Prints the median per worker in microseconds and the ratio to the bare fork. Every
mechanism this host offers is used (uid drop as root, Landlock, cgroup when possible).
Then the start cost of one confined child with each newer mechanism on, beside the
confinement without them ("before": uid drop, Landlock, rlimits): ``apply()`` alone and
the child's whole life (fork, ``apply()``, exit and reaping, which includes the kernel's
teardown of its namespaces), for namespaces (IPC, mount with the tmpfs private folder,
network), namespaces with ``network=True``, seccomp, and all of them (the default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import time
from dataclasses import replace

from rho_actors.sandbox.confine.cgroups import Cgroup
from rho_actors.sandbox.confine.confinement import (
    Confinement,
    apply,
    available,
    make_private_dir,
    probe,
    python_read_paths,
)
from rho_actors.sandbox.confine.namespaces import fork_into_pid_namespace


def _in_child(work: Confinement | None) -> float:
    """Fork; the child times ``apply(work)`` (nothing for None) and reports it; returns µs."""
    return _child_life(work)[0]


def _child_life(work: Confinement | None) -> tuple[float, float]:
    """Fork; the child times ``apply(work)`` and reports it; returns (apply µs, whole life µs)."""
    began = time.perf_counter()
    r, w = os.pipe()
    own_pids = work is not None and work.namespaces and work.pid_namespace  # as the clean fork server forks it
    pid = fork_into_pid_namespace() if own_pids else os.fork()
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
    return float(elapsed), (time.perf_counter() - began) * 1e6


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
        _mechanisms(spec, rounds)
    finally:
        os.rmdir(private)


def _mechanisms(spec: Confinement, rounds: int) -> None:
    full, missing = available(spec)
    for text in missing:
        print(f"unavailable here: {text}")
    before = replace(full, namespaces=False, disk_bytes=None, seccomp=False)
    variants = {
        "before (no namespaces, no seccomp)": before,
        "+ namespaces (pid, ipc, mount+tmpfs, net)": replace(before, namespaces=full.namespaces,
                                                            disk_bytes=spec.disk_bytes),
        "+ namespaces, network=True": replace(before, namespaces=full.namespaces, network=True,
                                               disk_bytes=spec.disk_bytes),
        "+ seccomp": replace(before, seccomp=full.seccomp, seccomp_filter=full.seccomp_filter),
        "all (the default)": full,
    }
    print(f"{'start cost of one confined child':38} {'apply()':>9} {'life':>9}   life ÷ before")
    base_life = 0.0
    for label, variant in variants.items():
        samples = [_child_life(variant) for _ in range(rounds)]
        applied = statistics.median(a for a, _ in samples)
        life = statistics.median(t for _, t in samples)
        base_life = base_life or life
        print(f"{label:38} {applied:7.0f}µs {life:7.0f}µs   {life / base_life:.2f}x")


if __name__ == "__main__":
    main()
