"""The group commit (:mod:`rho_actors.agent.group_commit`): transcripts' records written
unsynced are synced by one thread, each transcript once for the records of one delay,
no sooner than the delay and never lost at close; counted with the real ``fdatasync``."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rho_actors.agent.group_commit import GroupCommit
from rho_actors.agent.model import Reply
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, load
from rho_actors.tool import ToolCall, ToolResult
from tests.conftest import WAIT_S, slack, wait_for


class _Syncs:
    """Each transcript ``os.fdatasync``: (path, size made durable, thread name, when)."""

    def __init__(self) -> None:
        self.made: list[tuple[str, int, str, float]] = []
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        self._real(fd)
        if path.endswith(TRANSCRIPT_NAME):
            self.made.append((path, os.fstat(fd).st_size, threading.current_thread().name, time.monotonic()))


def _transcript(folder: Path) -> Transcript:
    transcript = Transcript(folder / TRANSCRIPT_NAME)
    transcript.open(per_record=True)  # as mcp serve opens its sessions'
    return transcript


def _results(transcript: Transcript, first_step: int, count: int, commits: GroupCommit) -> None:
    for step in range(first_step, first_step + count):
        call = ToolCall(f"c{step}", "noop", {})
        transcript.reply(step, Reply(tool_calls=(call,)), sync=False)
        transcript.result(step, 0, ToolResult(call.id, call.name, True, "ok"), sync=False)
        commits.written(transcript)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> _Syncs:
    counted = _Syncs()
    monkeypatch.setattr(os, "fdatasync", counted)
    return counted


def test_records_written_within_the_delay_share_one_sync_made_by_the_group_commits_thread_after_it(
        tmp_path: Path, syncs: _Syncs) -> None:
    # every record is written within the delay: when a loaded machine took longer than 0.2 s to write them (a
    # sync may then come between them), again with a longer delay
    for delay_s in (0.2, 0.8, 3.2):
        commits = GroupCommit(delay_s=delay_s)
        one, two = _transcript(tmp_path / f"one-{delay_s}"), _transcript(tmp_path / f"two-{delay_s}")
        began = time.monotonic()
        _results(one, 1, 5, commits)
        _results(two, 1, 3, commits)
        written = time.monotonic()
        if written - began < delay_s or delay_s == 3.2:
            break
        commits.close()
        one.close()
        two.close()
        syncs.made.clear()
    try:
        sizes = {str(t.path): t.path.stat().st_size for t in (one, two)}
        assert wait_for(lambda: len(syncs.made) >= 2)
        assert sorted((path, size) for path, size, _, _ in syncs.made) == sorted(sizes.items())  # one each
        assert {name for _, _, name, _ in syncs.made} == {"rho-group-commit"}
        # not before the delay, and within it (and the machine's slack) after the first write
        assert all(began + delay_s <= when <= written + delay_s + slack(0.5) for _, _, _, when in syncs.made)
        _results(one, 6, 1, commits)  # a later record: a sync of its own
        assert wait_for(lambda: len(syncs.made) == 3)
        assert syncs.made[-1][:2] == (str(one.path), one.path.stat().st_size)
        assert commits.syncs == 3
    finally:
        commits.close()
        one.close()
        two.close()
    history = load(one.path)  # whole: six calls, each answered
    assert history.records == 12 and not history.torn and not history.unanswered and not history.pending


def test_close_and_flush_sync_what_waits_at_once_and_a_record_written_after_close_is_synced_by_its_writer(
        tmp_path: Path, syncs: _Syncs) -> None:
    commits = GroupCommit(delay_s=3600.0)  # never by the delay in this test
    one, two = _transcript(tmp_path / "one"), _transcript(tmp_path / "two")
    three = _transcript(tmp_path / "three")
    try:
        _results(one, 1, 4, commits)
        _results(two, 1, 2, commits)
        assert syncs.made == []
        commits.flush(one)  # a session closing: its transcript now, by the thread (the group waiting with it)
        assert (str(one.path), "rho-group-commit") in [(path, name) for path, _, name, _ in syncs.made]
        assert wait_for(lambda: len(syncs.made) == 2)
        assert sorted((path, name) for path, _, name, _ in syncs.made) == [
            (str(one.path), "rho-group-commit"), (str(two.path), "rho-group-commit")]
        commits.flush(one)  # nothing left: no sync
        _results(three, 1, 1, commits)
        commits.close()  # what waits, now
        assert [path for path, _, _, _ in syncs.made][2:] == [str(three.path)]
        _results(two, 3, 1, commits)  # after close: synced before written() returns
        assert syncs.made[-1][:3] == (str(two.path), two.path.stat().st_size, "MainThread")
    finally:
        commits.close()
        for transcript in (one, two, three):
            transcript.close()


def test_a_negative_delay_or_wait_is_refused() -> None:
    with pytest.raises(ValueError, match="delay_s must be a number of seconds >= 0, got -1"):
        GroupCommit(delay_s=-1)
    with pytest.raises(ValueError, match=r"wait_s must be a number of seconds >= 0, got -0\.5"):
        GroupCommit(wait_s=-0.5)


def test_flush_waits_for_a_sync_the_thread_has_begun_so_a_session_closed_next_keeps_its_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session closing flushes its transcript, then closes it: when the group commit's
    thread had already taken the transcript for its sync, flush found nothing pending and
    returned at once, and the close could come before the sync (its records then never
    synced, or the thread's sync reading a descriptor being closed)."""
    entered, release = threading.Event(), threading.Event()
    made: list[str] = []
    real = os.fdatasync

    def gated(fd: int) -> None:
        if threading.current_thread().name == "rho-group-commit":
            entered.set()
            release.wait(WAIT_S)
        real(fd)
        made.append(threading.current_thread().name)

    monkeypatch.setattr(os, "fdatasync", gated)
    commits = GroupCommit(delay_s=0, wait_s=WAIT_S)  # its bound on the wait only a hang reaches
    transcript = _transcript(tmp_path)
    try:
        _results(transcript, 1, 1, commits)
        assert entered.wait(WAIT_S)  # the thread holds the transcript, its sync begun
        seen: list[list[str]] = []

        def flush() -> None:
            commits.flush(transcript)
            seen.append(list(made))

        flusher = threading.Thread(target=flush)
        flusher.start()
        wait_for(lambda: not flusher.is_alive(), slack(0.5))  # a flush not waiting returns now
        release.set()
        flusher.join(WAIT_S)
        assert seen == [["rho-group-commit"]], seen  # flush returned once the thread's sync was made
    finally:
        release.set()
        commits.close()
        transcript.close()


def test_a_sync_that_fails_in_any_way_is_logged_and_the_thread_goes_on(tmp_path: Path, syncs: _Syncs,
                                                                      logs: list[str]) -> None:
    class Broken:
        path = tmp_path / "broken" / TRANSCRIPT_NAME

        def sync(self) -> None:
            raise TypeError("not an OSError")

    commits = GroupCommit(delay_s=0.01)
    later = _transcript(tmp_path / "later")
    try:
        commits.written(Broken())
        assert wait_for(lambda: any("not an OSError" in line for line in logs))
        _results(later, 1, 1, commits)
        assert wait_for(lambda: any(path.startswith(str(tmp_path / "later")) for path, *_ in syncs.made))
    finally:
        commits.close()
        later.close()



class _StallingDisk:
    """A real file system whose writes to its disk stall on demand: an ext4 image, loop
    mounted at :attr:`path`, kept in a file of another loop-mounted ext4 (``outer``);
    :meth:`stalled` freezes the outer one (``fsfreeze``), so the inner one's page cache
    takes writes at once while an ``fdatasync`` waits in the kernel until it is thawed, as
    on a disk that stopped answering (a failing device, a lost network volume)."""

    def __init__(self, folder: Path) -> None:
        self.outer, self.path = folder / "outer", folder / "disk"
        self.mounted: list[Path] = []

    def mount(self) -> None:
        for image, at in ((self.outer.with_suffix(".img"), self.outer), (self.outer / "inner.img", self.path)):
            at.mkdir(exist_ok=True)
            with open(image, "wb") as f:
                f.truncate(64 << 20)
            subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
            subprocess.run(["mount", "-o", "loop", str(image), str(at)], check=True, capture_output=True)
            self.mounted.append(at)

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        subprocess.run(["fsfreeze", "-f", str(self.outer)], check=True)
        try:
            yield
        finally:
            subprocess.run(["fsfreeze", "-u", str(self.outer)], check=True)

    def unmount(self) -> None:
        subprocess.run(["fsfreeze", "-u", str(self.outer)], check=False, capture_output=True)  # not frozen: harmless
        for at in reversed(self.mounted):  # lazily if a file of it is still open (a failed test's)
            if subprocess.run(["umount", str(at)], check=False, capture_output=True, timeout=WAIT_S).returncode:
                subprocess.run(["umount", "-l", str(at)], check=True, capture_output=True, timeout=WAIT_S)


@pytest.fixture
def stalling_disk(tmp_path: Path) -> Iterator[_StallingDisk]:
    if os.geteuid() != 0 or not all(shutil.which(c) for c in ("mkfs.ext4", "mount", "fsfreeze")):
        pytest.skip("a stalling disk needs root, mkfs.ext4, mount and fsfreeze")
    disk = _StallingDisk(tmp_path)
    try:
        try:
            disk.mount()
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"no loop-mounted file system here: {exc.stderr.decode(errors='replace').strip()}")
        yield disk
    finally:
        disk.unmount()


def _in_disk_wait(thread_name: str) -> bool:
    """Whether a thread of this name waits in the kernel (state D: an I/O not ending)."""
    for thread in threading.enumerate():
        if thread.name == thread_name and thread.native_id is not None:
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] == "D":
                    return True
    return False


def test_a_stalled_disk_holds_flush_and_close_no_longer_than_their_wait(stalling_disk: _StallingDisk,
                                                                       logs: list[str]) -> None:
    """A sync that does not end (a disk that stopped answering) holds a session's close
    (``flush``) and the server's stop (``close``) at most their ``wait_s``, then they go on
    (the records written to the OS: a crash of rho loses nothing); they waited for ever,
    so ``mcp serve --synchronous-commit off`` on a stalled disk never stopped, while ``on``
    did. The sync still ends, made once the disk answers."""
    commits = GroupCommit(delay_s=0, wait_s=0.5)
    one, two = _transcript(stalling_disk.path / "one"), _transcript(stalling_disk.path / "two")
    try:
        with stalling_disk.stalled():
            _results(one, 1, 1, commits)
            assert wait_for(lambda: _in_disk_wait("rho-group-commit"))  # its sync of one, in the kernel
            _results(two, 1, 1, commits)  # written meanwhile: to the OS at once, its sync due
            for wait in (functools.partial(commits.flush, one), functools.partial(commits.flush, two), commits.close):
                began = time.monotonic()
                wait()
                assert time.monotonic() - began < 0.5 + slack(0.5), wait
            assert sum("not synced within 0.5 s" in line for line in logs) == 3, logs
            assert commits.syncs == 0
        assert wait_for(lambda: commits.syncs == 2)  # both made once the disk answers, by the thread
    finally:
        commits.close()
        one.close()
        two.close()
    assert load(one.path).records == 2 and load(two.path).records == 2


_PIDS = Path("/sys/fs/cgroup/pids")
_AT_THE_LIMIT = """
import sys
from pathlib import Path
from rho_actors.agent.group_commit import GroupCommit
from tests.test_group_commit import _results, _transcript
cgroup, folder = Path(sys.argv[1]), Path(sys.argv[2])
commits, transcript = GroupCommit(delay_s=0), _transcript(folder)
limit = (cgroup / "pids.max").read_text()
(cgroup / "pids.max").write_text((cgroup / "pids.current").read_text())
try:
    _results(transcript, 1, 1, commits)  # the group commit's thread cannot be started
    print("synced", commits.syncs)
finally:
    (cgroup / "pids.max").write_text(limit)
_results(transcript, 2, 1, commits)  # a thread can be started again: the group commit's
commits.close()
print("synced", commits.syncs)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not (_PIDS / "cgroup.procs").exists(),
                    reason="a real thread limit needs root and the cgroup v1 pids controller")
def test_a_record_written_when_no_thread_can_be_started_is_synced_by_its_writer(tmp_path: Path) -> None:
    """The group commit's thread starts at the first record: at the host's thread limit
    that start raised out of ``written`` into the call settling its result, and left a
    thread never started in place, so no record of the server was ever synced. The writer
    then syncs its record itself (as after ``close``) and a later record starts the thread."""
    cgroup = _PIDS / f"rho-test-{os.getpid()}-commit"
    cgroup.mkdir()
    try:
        def enter() -> None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        root = str(Path(__file__).parent.parent)
        ran = subprocess.run([sys.executable, "-c", _AT_THE_LIMIT, str(cgroup), str(tmp_path)], check=False,
                             preexec_fn=enter, capture_output=True, text=True, timeout=WAIT_S, cwd=root,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                                 root, os.environ.get("PYTHONPATH")]))})
        assert ran.stdout.splitlines() == ["synced 1", "synced 2"], (ran.stdout, ran.stderr[-3000:])
    finally:
        assert wait_for(lambda: _removed(cgroup))


def _removed(cgroup: Path) -> bool:
    try:
        cgroup.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
