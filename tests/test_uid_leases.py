"""Each confined child's own uid (DESIGN §5 "Confinement"): leased from a reserved range,
never twice at once (in this host or another), never one that runs a process or owns a
shared file, and a range the password database uses is refused with a warning."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rho_actors import ActorSystem, IsolationEvent, ToolCall
from rho_actors.sandbox.clean import zygote_pid
from rho_actors.sandbox.confine.cgroups import find_hierarchy
from rho_actors.sandbox.confine.confinement import Confinement, probe
from rho_actors.sandbox.confine.enclosure import Enclosure, system_policy
from rho_actors.sandbox.confine.uids import UidRange, UidRangeExhausted, lease, unavailable
from tests.conftest import READS, WAIT_S, read_line, wait_for
from tests.helpers import make_tool

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="leasing uids needs a root host")


def _range(count: int, part: int = 0) -> UidRange:
    """A range of this test process alone (tests on one machine run at once)."""
    return UidRange(0x7E000000 + (os.getpid() % 100_000) * 64 + part * 8, count)


def _whoami(args: object, ctx: object) -> str:
    return str(os.getuid())


def test_a_range_must_be_a_real_one() -> None:
    for first, count in ((0, 5), (5, 0), (65530, 10), (2**32 - 3, 5), ("1", 2)):
        with pytest.raises(ValueError, match="UidRange"):
            UidRange(first, count)  # type: ignore[arg-type]
    assert str(UidRange(100_000, 10)) == "100000-100009" and 100_009 in UidRange(100_000, 10)


@needs_root
def test_a_range_holding_a_users_uid_is_refused() -> None:
    reason = unavailable(UidRange(1, 10))
    assert reason is not None and "uid 1 of the password database" in reason, reason
    assert unavailable(_range(4)) is None


@needs_root
def test_leases_are_apart_and_given_back() -> None:
    uids = _range(2)
    first, second = lease(uids), lease(uids)
    try:
        assert {first.uid, second.uid} == {uids.first, uids.last}
        with pytest.raises(UidRangeExhausted, match=f"every uid of the range {uids}"):
            lease(uids)
        # another host on this machine: it sees the same leases
        code = ("import sys; from rho_actors.sandbox.confine.uids import UidRange, lease; "
                f"lease(UidRange({uids.first}, {uids.count}))")
        other = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                               timeout=WAIT_S)
        assert other.returncode == 1 and "UidRangeExhausted" in other.stderr, other.stderr
        first.release()
        first.release()  # idempotent
        again = lease(uids)
        assert again.uid == first.uid
        again.release()
    finally:
        first.release()
        second.release()


@needs_root
def test_a_uid_that_runs_a_process_is_not_leased() -> None:
    uids = _range(2, part=3)  # a range not leased from before in this process (processes are read once a minute)
    squatter = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys; os.setgid({uids.first}); os.setuid({uids.first}); "
                               "print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert squatter.stdout is not None and read_line(squatter.stdout) == "ready\n"
        got = lease(uids)
        assert got.uid == uids.last, got
        got.release()
    finally:
        squatter.kill()
        squatter.wait(WAIT_S)


@needs_root
def test_a_uid_that_owns_a_shared_file_is_not_leased() -> None:
    uids = _range(2, part=1)  # a range not leased from before in this process (shared folders are read once a minute)
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="someone-else-") as owned:
        os.chown(owned.name, uids.first, uids.first)
        got = lease(uids)
        assert got.uid == uids.last, got
        got.release()


@needs_root
def test_a_system_whose_range_is_taken_warns_and_shares_nobody(tmp_path: Path) -> None:
    events: list[IsolationEvent] = []
    spec = Confinement(uid_range=UidRange(1, 10))
    with ActorSystem(data_dir=tmp_path, untrusted=READS, shutdown_ms=2_000, confinement=spec) as system:
        system.subscribe(lambda e: events.append(e) if isinstance(e, IsolationEvent) else None)
        assert system.register(make_tool("whoami", _whoami), untrusted=True).info
        [result] = system.start_loop().run_turn([ToolCall("c", "whoami", "{}")])
        missing = system.stats()["confinement"]["missing"]
    assert result.ok and result.content == "65534", result
    [gap] = [m for m in missing if "per-uid kernel counters" in m]
    assert "uid 1 of the password database" in gap and any(e.detail == gap for e in events), (missing, events)


@needs_root
def test_a_worker_with_no_uid_left_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    uids = _range(1, part=2)
    spec = Confinement(uid_range=uids)
    with ActorSystem(data_dir=tmp_path, untrusted=READS, shutdown_ms=2_000, confinement=spec, warm_workers=0) as system:
        assert system.register(make_tool("whoami", _whoami), untrusted=True).info
        first = system.start_loop("alice").run_turn([ToolCall("c", "whoami", "{}")])[0]  # its worker stays, warm
        refused = system.start_loop("bob").run_turn([ToolCall("c", "whoami", "{}")])[0]
    assert first.ok and first.content == str(uids.first), first
    assert not refused.ok and f"every uid of the range {uids} is leased" in refused.content, refused


def _uid_of(pid: int) -> int | None:
    """The real uid of process ``pid`` (a zombie's too), ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
    except (OSError, StopIteration):
        return None


@needs_root
@pytest.mark.skipif(isinstance(find_hierarchy(), str), reason="no writable cgroup here")
def test_a_uid_is_not_given_back_while_a_process_of_it_is_not_yet_reaped() -> None:
    # A child's tree killed, but a process of it not yet reaped (its parent, the fork
    # server, slow to wait for it; or gone and init not there yet): it still runs as the
    # uid, counted and visible in /proc. The uid must not go to another child meanwhile.
    uids = _range(2, part=4)
    enclosure = Enclosure(system_policy(Confinement(uid_range=uids)), 64 * 2**20)
    assert enclosure.uid_lease is not None and enclosure.cgroup is not None
    uid = enclosure.uid_lease.uid
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: into the tree's cgroup, then its uid, as a worker does
        try:
            for path in enclosure.cgroup.procs_files:
                with open(path, "w", encoding="ascii") as procs:
                    procs.write(str(os.getpid()))
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.write(ready_w, b"x")
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        assert wait_for(lambda: _state(pid) == "Z"), _state(pid)  # ended, not reaped: a zombie of the uid
        enclosure.remove()
        taken = lease(uids)
        try:
            assert _uid_of(pid) == uid  # still there...
            assert taken.uid != uid, f"uid {uid} was leased again while process {pid} of it was not reaped"
        finally:
            taken.release()
    finally:
        os.close(ready_r)
        os.waitpid(pid, 0)
    assert wait_for(lambda: _leased_back(uids, uid)), f"uid {uid} was not given back once its process was reaped"
    assert not os.path.exists(enclosure.cgroup.dirs["pids"])  # and the cgroup is removed


def _leased_back(uids: UidRange, uid: int) -> bool:
    """Whether the next lease of ``uids`` is ``uid`` (the lease given back at once)."""
    taken = lease(uids)
    taken.release()
    return taken.uid == uid


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _linger(args: object, ctx: object) -> str:
    """The hostile tool: leave a tree behind that outlives the call (a daemon in a
    session of its own that ignores SIGTERM and SIGHUP, and a zombie never waited for),
    then say which uid it ran as; with ``hold``, wait (to be killed mid-call) first."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            while True:
                time.sleep(60)
        os._exit(0)  # a zombie of the worker: it never waits for it
    if isinstance(args, dict) and args.get("hold"):
        time.sleep(WAIT_S)
    return str(os.getuid())


class _UidWatch:
    """Scans ``/proc`` over and over in a thread of its own: a uid of ``uids`` that runs
    two process trees at once (processes whose ancestry within the uid ends at two
    different roots, both still there once the scan is done: a worker, a zombie worker
    not yet reaped) is a uid two workers hold at once."""

    def __init__(self, uids: UidRange) -> None:
        self.uids = uids
        self.shared: list[tuple[int, set[tuple[int, int]]]] = []
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _UidWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            procs = {pid: known for pid in (int(name) for name in os.listdir("/proc") if name.isdigit())
                     if (known := _process(pid)) is not None and known[0] in self.uids}
            roots: dict[int, set[tuple[int, int]]] = {}
            for pid, (uid, _, _) in procs.items():
                root = pid
                while (parent := procs.get(procs[root][1])) is not None and parent[0] == uid:
                    root = procs[root][1]
                roots.setdefault(uid, set()).add((root, procs[root][2]))
            self.seen.update(roots)
            for uid, trees in roots.items():
                if len(trees) > 1 and all(_started(pid) == started for pid, started in trees):
                    self.shared.append((uid, trees))
            time.sleep(0.001)


def _process(pid: int) -> tuple[int, int, int] | None:
    """``(real uid, parent pid, start)`` of process ``pid`` (a zombie's too), ``None`` once gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            fields = {line.split(":")[0]: line.split()[1:] for line in status}
        started = _started(pid)
        return None if started is None else (int(fields["Uid"][0]), int(fields["PPid"][0]), started)
    except (OSError, KeyError, IndexError, ValueError):
        return None


def _started(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _workers(uids: UidRange) -> dict[int, tuple[int, int]]:
    """The workers running as a uid of ``uids`` (PID 1 of their own namespace): host pid
    to ``(uid, how many children)``."""
    found: dict[int, tuple[int, int]] = {}
    children: dict[int, int] = {}
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit()):
        with contextlib.suppress(OSError, KeyError, IndexError, ValueError):
            with open(f"/proc/{pid}/status", encoding="ascii") as status:
                lines = {line.split(":")[0]: line.split()[1:] for line in status}
            children[int(lines["PPid"][0])] = children.get(int(lines["PPid"][0]), 0) + 1
            if int(lines["Uid"][0]) in uids and lines["NSpid"][-1] == "1":
                found[pid] = (int(lines["Uid"][0]), 0)
    return {pid: (uid, children.get(pid, 0)) for pid, (uid, _) in found.items()}


def _tree_made(uids: UidRange, before: set[int]) -> bool:
    """Whether a worker not among ``before`` made its tree (two children: a zombie, a daemon)."""
    return any(pid not in before and children >= 2 for pid, (_, children) in _workers(uids).items())


@needs_root
@pytest.mark.skipif(isinstance(find_hierarchy(), str) or probe().namespaces is not None,
                    reason="workers' trees need a cgroup and namespaces")
def test_no_two_workers_hold_one_uid_under_churn_and_kills(tmp_path: Path) -> None:
    # Workers of session after session leave trees behind (a daemon, a zombie); their
    # workers are killed with SIGKILL from outside, their fork server too, others retired
    # when their session ends: the next session's worker gets a freed uid (a range of 8),
    # never while a process of the uid's last worker is still there. Twelve sessions (four
    # of each kind) outnumber the 8 uids: some uid is leased again.
    uids = _range(8, part=5)
    spec = Confinement(uid_range=uids)
    got: list[int] = []
    with (ActorSystem(data_dir=tmp_path, untrusted=READS, shutdown_ms=2_000, confinement=spec, warm_workers=0,
                      worker_idle_s=0.0) as system, _UidWatch(uids) as watch):
        assert system.register(make_tool("linger", _linger), untrusted=True).info
        for turn in range(12):
            loop = system.start_loop(f"session-{turn}")
            if turn % 3 == 0:  # its worker killed mid-call, once its tree is made
                before = set(_workers(uids))
                with ThreadPoolExecutor(1) as running:
                    turned = running.submit(loop.run_turn, [ToolCall("c", "linger", '{"hold": true}')])
                    assert wait_for(functools.partial(_tree_made, uids, before))
                    # the worker that made the tree runs the call (a loaded machine may have started a spare too)
                    [(pid, (uid, _))] = [(p, w) for p, w in _workers(uids).items() if p not in before and w[1] >= 2]
                    os.kill(pid, signal.SIGKILL)
                    [result] = turned.result(WAIT_S)
                assert not result.ok and "SIGKILL" in result.content, result
                got.append(uid)
                loop.stop()
                continue
            [result] = loop.run_turn([ToolCall("c", "linger", "{}")])
            assert result.ok, (turn, got, result.content)
            got.append(int(result.content))
            if turn % 3 == 1 and (server := zygote_pid()) is not None:
                os.kill(server, signal.SIGKILL)  # not a worker: its workers are orphaned
                assert wait_for(lambda: zygote_pid() is None)  # the next worker from a new one
            loop.stop()
    assert watch.shared == [], watch.shared
    assert set(got) <= set(range(uids.first, uids.last + 1)) and len(set(got)) < len(got), got
    assert watch.seen, "the watch saw no worker"


@needs_root
def test_a_uid_this_host_gave_back_is_leased_again_at_once() -> None:
    """A uid whose lease this host holds runs this host's own child: when the processes
    are read (once a minute), it is not taken for someone else's, so once the child is
    gone and its lease given back the next lease gets it again (leases stay dense; a
    small range does not run out in churn)."""
    from rho_actors.sandbox.confine import uids as uid_leases

    uids = _range(3, part=6)  # a range not leased from before in this process
    ours = lease(uids)
    child = subprocess.Popen(  # this host's child, running with its leased uid
        [sys.executable, "-c", f"import os, sys; os.setgid({ours.uid}); os.setuid({ours.uid}); "
                               "print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        uid_leases._owners.cache_clear()  # the once-a-minute read happens now, while the child runs
        other = lease(uids)
        assert other.uid == uids.first + 1, other
    finally:
        child.kill()
        child.wait(WAIT_S)
    ours.release()  # its tree is gone: given back
    again = lease(uids)
    try:
        assert again.uid == uids.first, again  # not held for someone else's until the next read
    finally:
        again.release()
        other.release()
