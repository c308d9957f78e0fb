"""The group commit (:mod:`rho_actors.agent.group_commit`): transcripts' records written
unsynced are synced by one thread, each transcript once for the records of one delay,
no sooner than the delay and never lost at close; counted with the real ``fdatasync``."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rho_actors.agent.group_commit import GroupCommit
from rho_actors.agent.model import Reply
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, load
from rho_actors.tool import ToolCall, ToolResult
from tests.conftest import slack, wait_for


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
    commits = GroupCommit(delay_s=0.2)
    one, two = _transcript(tmp_path / "one"), _transcript(tmp_path / "two")
    try:
        began = time.monotonic()
        _results(one, 1, 5, commits)
        _results(two, 1, 3, commits)
        written = time.monotonic()
        sizes = {str(t.path): t.path.stat().st_size for t in (one, two)}
        assert wait_for(lambda: len(syncs.made) >= 2)
        assert sorted((path, size) for path, size, _, _ in syncs.made) == sorted(sizes.items())  # one each
        assert {name for _, _, name, _ in syncs.made} == {"rho-group-commit"}
        # not before the delay, and within it (and the machine's slack) after the first write
        assert all(began + 0.2 <= when <= written + 0.2 + slack(0.5) for _, _, _, when in syncs.made)
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
    commits = GroupCommit(delay_s=3600.0)  # never by the thread in this test
    one, two = _transcript(tmp_path / "one"), _transcript(tmp_path / "two")
    try:
        _results(one, 1, 4, commits)
        _results(two, 1, 2, commits)
        assert syncs.made == []
        commits.flush(one)  # a session closing: its transcript now
        assert [(path, name) for path, _, name, _ in syncs.made] == [(str(one.path), "MainThread")]
        commits.flush(one)  # nothing left: no sync
        commits.close()
        assert [path for path, _, _, _ in syncs.made] == [str(one.path), str(two.path)]
        _results(two, 3, 1, commits)  # after close: synced before written() returns
        assert syncs.made[-1][:3] == (str(two.path), two.path.stat().st_size, "MainThread")
    finally:
        one.close()
        two.close()


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay_s must be a number of seconds >= 0, got -1"):
        GroupCommit(delay_s=-1)


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
            release.wait(30)
        real(fd)
        made.append(threading.current_thread().name)

    monkeypatch.setattr(os, "fdatasync", gated)
    commits = GroupCommit(delay_s=0)
    transcript = _transcript(tmp_path)
    try:
        _results(transcript, 1, 1, commits)
        assert entered.wait(30)  # the thread holds the transcript, its sync begun
        seen: list[list[str]] = []

        def flush() -> None:
            commits.flush(transcript)
            seen.append(list(made))

        flusher = threading.Thread(target=flush)
        flusher.start()
        wait_for(lambda: not flusher.is_alive(), slack(0.5))  # a flush not waiting returns now
        release.set()
        flusher.join(30)
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

