"""One host serves a session at a time: its folder's lease (DESIGN §4 "Approvals",
docs/guides/resuming.md "One host a session").

A second host opening a session a live host serves (``start_loop`` of a session whose
folder exists, or the first use of a folder made since) is refused there with a
:class:`SessionLeaseError` naming the session, the folder and the pid holding it; the
lease dies with its holder (``kill -9`` too, a worker process or a child it forked
living on), so the next host takes the session back at once; a clean stop (the loop's,
the system's) releases it, and a call still running then writes nothing into the
folder after it (its waiter still gets its result); deciding a held call from another process
(``rho-actors approve``) takes none and works while a host serves the session."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rho_actors import ActorSystem, ErrorKind, SessionLeaseError, ToolCall, tool
from rho_actors.agent.session_lease import SessionLease, writing
from rho_actors.lifecycle.tasks import OPEN
from tests.conftest import WAIT_S, read_line, wait_for
from tests.held_task_host import CALL, wipe_later

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parent.parent


@tool
def echo(text: str) -> str:
    """Say ``text`` back."""
    return text


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "runs.log"
    path.touch()
    monkeypatch.setenv("RHO_TEST_RUNS", str(path))
    return path


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """Processes a test started (a host, its children): each killed at the end."""
    started: list[int] = []
    yield started
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _system(data: Path) -> ActorSystem:
    system = ActorSystem(data_dir=data, shutdown_ms=1_000)
    system.register(wipe_later)
    system.register(echo)
    return system


def _host(data: Path, pids: list[int], *flags: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """A host process serving ``s1`` (tests/lease_host.py): it and what it printed, by word."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "tests.lease_host", str(data), *flags], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    pids.append(proc.pid)
    assert proc.stdout is not None
    said: dict[str, str] = {}
    while "TASK" not in said:
        word, value = read_line(proc.stdout, WAIT_S * 3).split()
        said[word] = value
    return proc, said


def _kill_9(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)  # the host alone: its workers and forked children live on
    proc.wait(WAIT_S)
    assert proc.stdout is not None
    proc.stdout.close()


def _free(folder: Path) -> bool:
    """Whether no process holds the folder's lease now (taken and let go at once, never waited for)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_second_host_is_refused_by_name_and_takes_the_session_once_the_first_is_killed(
        tmp_path: Path, runs: Path, pids: list[int]) -> None:
    data = tmp_path / "data"
    folder = data / "sessions" / "s1"
    proc, said = _host(data, pids)
    with _system(data) as system:
        with pytest.raises(SessionLeaseError) as refused:
            system.start_loop("s1")
        err = refused.value
        assert (err.session_id, err.folder, err.pid) == ("s1", folder, proc.pid), err
        assert "'s1'" in str(err) and str(folder) in str(err) and f"process {proc.pid}" in str(err), err
        assert isinstance(err, OSError)  # as the folder's other failures are
        assert proc.poll() is None and not _free(folder)  # the first host serves on, untouched

        _kill_9(proc)
        assert _free(folder), "the lease outlived its holder"  # released by the kernel with it: nothing to wait for
        loop = system.start_loop("s1")  # the same system, refused before: takes it now
        assert [p.call_id for p in loop.pending()] == ["c1"]
        loop.approve("c1", decided_by="test")
        info = loop.task_result(said["TASK"], WAIT_S)
        assert info.status == "completed", info
    assert runs.read_text().splitlines() == ["wipe /a"]


def test_neither_a_worker_nor_a_forked_child_of_a_killed_host_keeps_its_session(
        tmp_path: Path, runs: Path, pids: list[int]) -> None:
    """The lease is an ``flock`` of the folder, which every process holding a descriptor of
    it keeps: a worker (started by exec) never had one, and a child the host forked
    without an exec (a tool's ``os.fork``) closes its copy as it starts."""
    data = tmp_path / "data"
    folder = data / "sessions" / "s1"
    proc, said = _host(data, pids, "--children")
    worker, forked = int(said["WORKER"]), int(said["FORKED"])
    pids += [worker, forked]
    assert _alive(worker) and _alive(forked)
    _kill_9(proc)
    assert _free(folder), "a child of the killed host keeps its session's lease"
    assert _alive(forked), "the forked child must outlive its host for this test"  # (the worker ends with its fork
    with _system(data) as system:  # server, which sees its host gone: it may have by now; it never held the lease)
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c1"]
        loop.reject("c1", "keep /a", decided_by="test")
        assert loop.task_result(said["TASK"], WAIT_S).status == "failed"
        assert _alive(forked)  # it lived all along
    assert runs.read_text().splitlines() == []


def test_a_clean_stop_releases_the_lease(tmp_path: Path) -> None:
    data = tmp_path / "data"
    folder = data / "sessions" / "s1"
    one, two = _system(data), _system(data)
    try:
        loop = one.start_loop("s1")
        [ack] = loop.run_turn([CALL])
        assert ack.ok, ack
        with pytest.raises(SessionLeaseError, match=r"another ActorSystem of this process") as refused:
            two.start_loop("s1")
        assert refused.value.pid == os.getpid()
        loop.stop()  # the loop's stop: the session's end on this host
        assert _free(folder)
        taken = two.start_loop("s1")
        assert [p.call_id for p in taken.pending()] == ["c1"]
        with pytest.raises(SessionLeaseError):
            one.start_loop("s1")
        two.stop(60)  # the system's stop: every session it serves released
        assert _free(folder)
        again = one.start_loop("s1")
        assert [p.call_id for p in again.pending()] == ["c1"]
    finally:
        one.stop(60)
        two.stop(60)
    assert _free(folder)


def test_a_session_made_by_another_host_since_its_start_runs_no_call(tmp_path: Path) -> None:
    """Both hosts start the session before its folder exists: the first to make it serves
    it; the other's calls do not start (named why) and its ``data_dir`` raises."""
    data = tmp_path / "data"
    with _system(data) as one, _system(data) as two:
        first, second = one.start_loop("s1"), two.start_loop("s1")
        [ran] = first.run_turn([ToolCall("c1", "echo", '{"text": "hi"}')])
        assert ran.ok and ran.content == "hi", ran
        [refused] = second.run_turn([ToolCall("c2", "echo", '{"text": "hi"}')])
        assert not refused.ok and refused.error_kind is ErrorKind.CANCELLED, refused
        assert "session 's1' is served by another ActorSystem" in refused.content, refused
        with pytest.raises(SessionLeaseError):
            second.data_dir  # noqa: B018
        first.stop()
        [after] = second.run_turn([ToolCall("c3", "echo", '{"text": "again"}')])
        assert after.ok and after.content == "again", after


def test_a_decision_from_another_process_needs_no_lease(tmp_path: Path, runs: Path) -> None:
    """``rho-actors approve`` is not a host: it decides a call the serving host holds."""
    data = tmp_path / "data"
    with _system(data) as system:
        loop = system.start_loop("s1")
        [ack] = loop.run_turn([CALL])
        approve = subprocess.run([sys.executable, "-m", "rho_actors.cli", "approve", str(data), "s1", "c1",
                                  "--by", "ann"], cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S, check=False)
        assert approve.returncode == 0, approve.stdout + approve.stderr
        info = loop.task_result(ack.details["task_id"], WAIT_S)
        assert info.status == "completed" and info.status not in OPEN, info
        assert wait_for(lambda: loop.pending() == [])
    assert runs.read_text().splitlines() == ["wipe /a"]


def test_a_child_forked_while_the_lease_is_being_taken_keeps_no_copy_of_it(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread forks (no exec) while another takes a session's lease (its folder opened,
    its ``flock`` waited for): the child closes its copy of the folder's descriptor at once,
    so it never keeps the lease after the host is gone (before: the at-fork close knew only
    leases taken, and the child shared the open file the host then locked)."""
    from rho_actors.agent import session_lease

    folder = tmp_path / "s1"
    folder.mkdir()
    kept = tmp_path / "kept"
    taking = session_lease.flock_within

    def fork_first(fd: int, wait_s: float) -> bool:
        pid = os.fork()
        if pid == 0:  # the child: which of its descriptors still name the folder
            try:
                names = [os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
                         if os.path.exists(f"/proc/self/fd/{n}")]
                kept.write_text("\n".join(n for n in names if n == str(folder)))
            finally:
                os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        return taking(fd, wait_s)

    monkeypatch.setattr(session_lease, "flock_within", fork_first)
    lease = session_lease.SessionLease("s1", folder, object())
    try:
        lease.hold()
        assert lease.held
        assert kept.read_text() == "", "a child forked as the lease was taken kept the folder's descriptor"
    finally:
        lease.release()


_ENDING = threading.Event()
_BEGUN = threading.Event()


@tool(background=True)
def long_count(n: int) -> str:
    """Count to ``n`` once the test lets it end (a background call)."""
    _BEGUN.set()
    _ENDING.wait(WAIT_S)
    return f"counted to {n}"


def test_a_call_outliving_its_loops_stop_writes_nothing_into_the_session_folder(
        tmp_path: Path, logs: list[str]) -> None:
    data = tmp_path / "data"
    _ENDING.clear()
    _BEGUN.clear()
    with ActorSystem(data_dir=data, shutdown_ms=1_000) as system:
        system.register(long_count)
        loop = system.start_loop("s1")
        [ack] = loop.run_turn([ToolCall("c1", "long_count", '{"n": 3}')], timeout_s=WAIT_S)
        assert ack.ok, ack
        task_id = ack.details["task_id"]
        record = data / "sessions" / "s1" / "tasks" / f"{task_id}.json"
        assert _BEGUN.wait(WAIT_S)
        loop.stop()  # a stop is a stop: the lease goes now, the call runs on
        assert _free(data / "sessions" / "s1")
        before = record.read_bytes()
        _ENDING.set()
        done = loop.task_result(task_id, WAIT_S)  # its waiter, in this host's memory, still gets the result
        assert done.status == "completed" and done.result is not None and done.result.content == "counted to 3"
        assert record.read_bytes() == before and json.loads(before)["status"] == "working"
        assert any("session s1" in m and task_id in m and "lease" in m for m in logs), logs


def test_a_write_under_way_holds_the_release_back_and_none_starts_after_it(tmp_path: Path) -> None:
    folder = tmp_path / "s1"
    folder.mkdir()
    host = object()
    lease = SessionLease("s1", folder, host)
    with writing(host, folder, "a held call's record") as before:
        assert before  # a new session's folder, not leased yet (its first started call takes it): written
    lease.hold()
    with writing(object(), folder, "another host's write") as other:
        assert not other  # a host holding no lease of the folder writes nothing into it
    with writing(host, folder, "a record") as served:
        assert served
        letting_go = threading.Thread(target=lease.release)
        letting_go.start()
        assert wait_for(lambda: not lease.held)  # the release began: it waits for the write under way
        assert not _free(folder)  # the folder still leased while the write lands
    letting_go.join(WAIT_S)
    assert not letting_go.is_alive() and _free(folder)
    with writing(host, folder, "a late record") as late:
        assert not late
    with writing(None, folder, "a write of no host") as unowned:
        assert unowned  # no owner: no lease looked at (a registry used alone)
