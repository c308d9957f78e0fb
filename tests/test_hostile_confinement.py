"""Untrusted tools as attackers against what surrounds their worker (DESIGN §5): the
descriptors it inherits, the cap on what it returns, and the limits it shares with
other sessions' workers. Each test checks that the attack fails and that the system
keeps serving another tool in another session."""

from __future__ import annotations

import json
import os
import stat
import time
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind
from rho_actors.encoding import DEFAULT_MAX_OUTPUT_CHARS
from rho_actors.sandbox import wire

from .test_hostile_untrusted import SESSIONS, Echo, Forge, assert_serving, call, frame, result_body

ROOT = os.geteuid() == 0


class Tracker:
    """Writes a ``REGISTER`` line for ``victim`` (a shared memory name) on every pipe it
    can write, as the ``multiprocessing`` resource tracker's protocol has it: a tracker
    running as the host unlinks every registered name when it ends. Returns what its
    descriptors point at."""

    name = staticmethod(lambda: "tracker")
    description = staticmethod(lambda: "Talk to the resource tracker.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    timeout_ms = staticmethod(lambda: 10_000)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        line = f"REGISTER:{args['victim']}:shared_memory\n".encode()
        seen = {}
        for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
            try:
                seen[str(fd)] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                try:
                    os.write(fd, line)
                except OSError:
                    pass
        return {"fds": seen}


@pytest.fixture
def hostile(system: ActorSystem) -> ActorSystem:
    for tool in (Echo, Forge, Tracker):
        registration = system.register(tool, untrusted=True)
        assert registration.info is not None, registration.reason
    return system


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_a_worker_cannot_reach_the_hosts_resource_tracker(hostile: ActorSystem) -> None:
    victim = f"/rho-hostile-{os.getpid()}-{time.monotonic_ns()}"
    shm = Path("/dev/shm" + victim)
    shm.write_text("the host's shared memory")
    try:
        resource_tracker.ensure_running()  # untrusted workers no longer start it: the host's may still run
        result = call(hostile, f"attacker-{next(SESSIONS)}", "tracker", {"victim": victim})
        assert result.ok, result
        fd = resource_tracker._resource_tracker._fd  # type: ignore[attr-defined]  # CPython private, not in typeshed
        assert fd is not None, "the host's resource tracker runs"
        tracker_pipe = f"pipe:[{os.fstat(fd).st_ino}]"
        fds = json.loads(result.content)["fds"]
        assert tracker_pipe not in fds.values(), fds
        assert_serving(hostile)
        hostile.stop()
        # the tracker ended: it unlinked what it held
        if resource_tracker._resource_tracker._fd is None:  # type: ignore[attr-defined]
            assert shm.exists(), "the host's resource tracker unlinked a name a worker registered"
    finally:
        shm.unlink(missing_ok=True)


def test_a_forged_result_cannot_pass_the_output_cap(hostile: ActorSystem) -> None:
    body = result_body(content="z" * (4 * DEFAULT_MAX_OUTPUT_CHARS))
    result = call(hostile, f"attacker-{next(SESSIONS)}", "forge", {"raw": [frame(wire.RESULT, body)]})
    assert result.ok, result
    assert len(result.content) <= DEFAULT_MAX_OUTPUT_CHARS + 200, len(result.content)
    assert result.content.startswith("zzz") and "characters" in result.content[-400:]
    assert result.error_kind is None or result.error_kind is not ErrorKind.CRASHED
    assert_serving(hostile)


class Hog:
    """Forks sleeping children until the kernel refuses one (at most ``most``); returns
    how many it started. They stay, in its worker's tree, until the worker is killed."""

    name = staticmethod(lambda: "hog")
    description = staticmethod(lambda: "Fork until refused.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    timeout_ms = staticmethod(lambda: 10_000)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        started = 0
        for _ in range(args["most"]):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            started += 1
        return started


class Forker:
    """Starts one subprocess."""

    name = staticmethod(lambda: "forker")
    description = staticmethod(lambda: "Run echo.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    timeout_ms = staticmethod(lambda: 10_000)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        import subprocess

        return subprocess.run(["echo", "forked"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(not ROOT, reason="workers share one dropped uid only when the host is root")
def test_a_fork_bomb_cannot_starve_other_sessions_of_processes(system: ActorSystem) -> None:
    if system.stats()["confinement"]["cgroup"]["available"] is not True:
        pytest.skip("no cgroup bounds a worker's process tree here")
    for tool in (Echo, Hog, Forker):
        assert system.register(tool, untrusted=True).info is not None
    started = call(system, f"attacker-{next(SESSIONS)}", "hog", {"most": 200})
    assert started.ok and 40 <= int(started.content) < 64, started  # its tree's bound (pids.max), not more
    result = call(system, f"victim-{next(SESSIONS)}", "forker", {})
    assert result.ok and result.content == "forked", result
    assert_serving(system)
