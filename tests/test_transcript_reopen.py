"""A transcript read once and then only past where it was left
(``Transcript.reopen``, what a host's decisions use): the calls' states follow what any
writer appended, and a file replaced, shortened, torn or tampered with is read as
``open`` reads it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from rho_actors.agent.model import Reply
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptBusyError, TranscriptError, load
from rho_actors.lifecycle import arguments_sha256
from rho_actors.tool import ToolCall, ToolResult
from tests.conftest import WAIT_S

pytestmark = pytest.mark.timeout(30)

SHA = arguments_sha256({"path": "/a"})


def _pending(path: Path) -> None:
    with Transcript(path) as t:
        t.user(1, "clean up")
        t.reply(1, Reply("", (ToolCall("c1", "delete", '{"path": "/a"}'), ToolCall("c2", "delete", '{"path": "/a"}'))))
        for index, call_id in enumerate(("c1", "c2")):
            t.call(1, index, "pending", call_id=call_id, name="delete", kind="approval", arguments_sha256=SHA)


def test_reopen_reads_what_another_writer_appended_since(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    mine = Transcript(path)
    assert mine.reopen().calls["c1"].state == "pending"  # never read: a whole read
    mine.close()
    with Transcript(path) as other:  # another process decides c1 and c2 gets its result
        other.call(1, 0, "decided", call_id="c1", name="delete", decision="approved", decided_by="ann",
                   arguments_sha256=SHA)
        other.result(1, 1, ToolResult("c2", "delete", True, "done"))
    history = mine.reopen()
    assert (history.calls["c1"].state, history.calls["c1"].decision) == ("decided", "approved")
    assert history.calls["c2"].state == "settled" and history.records == 6
    mine.call(1, 0, "running", call_id="c1", name="delete", arguments_sha256=SHA)  # appended after the others
    mine.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in records] == list(range(1, 8))
    assert load(path).calls["c1"].state == "running"


def test_reopen_waits_its_turn_as_open_does(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    mine = Transcript(path)
    mine.open()
    mine.close()
    with Transcript(path), pytest.raises(TranscriptBusyError, match="in use"):
        mine.reopen()
    assert mine.reopen().calls["c2"].state == "pending"  # the failed try left nothing locked or read
    mine.close()


def test_a_replaced_or_shortened_file_is_read_whole_again(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    mine = Transcript(path)
    mine.open()
    mine.close()
    os.replace(path, tmp_path / "old")
    with Transcript(path) as fresh:
        fresh.user(1, "another conversation")
    history = mine.reopen()
    assert history.calls == {} and history.records == 1 and history.messages[0].text == "another conversation"
    mine.close()
    _pending(tmp_path / "two" / TRANSCRIPT_NAME)
    data = (tmp_path / "two" / TRANSCRIPT_NAME).read_bytes()
    path.write_bytes(data[: data.index(b"\n") + 1])  # the same file, shorter than where it was left
    assert mine.reopen().records == 1
    mine.close()


def test_a_torn_tail_is_cut_away_and_a_changed_one_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    mine = Transcript(path)
    mine.open()
    mine.close()
    whole = path.read_bytes()
    with open(path, "ab") as f:  # a writer killed mid-line
        f.write(b'{"v": 2, "seq": 5, "type": "ca')
    assert mine.reopen().torn is False and mine.history.calls["c1"].state == "pending"
    assert path.read_bytes() == whole
    mine.close()
    with Transcript(path) as other:
        other.call(1, 0, "decided", call_id="c1", name="delete", decision="rejected", decided_by=None,
                   arguments_sha256=SHA)
    path.write_bytes(path.read_bytes().replace(b'"rejected"', b'"approved"'))  # changed after it was written
    with pytest.raises(TranscriptError, match="checksum"):
        mine.reopen()


def test_a_session_open_per_record_lets_a_brief_writer_in_between_its_records(tmp_path: Path) -> None:
    """An MCP session's transcript (open(per_record=True)) holds the session (another
    prompt is refused) but its file's lock only while it appends: a decision from another
    process is written at once, and the session's next record follows it, seq and
    tracks caught up."""
    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    session = Transcript(path)
    session.open(per_record=True)
    try:
        with pytest.raises(TranscriptBusyError, match="in use by another prompt"):
            Transcript(path).open()
        other = Transcript(path)
        other.open(brief=True)  # not held: at once
        other.call(1, 0, "decided", call_id="c1", name="delete", decision="rejected", decided_by="ann",
                   arguments_sha256=SHA, message="no")
        other.close()
        session.result(1, 0, ToolResult("c1", "delete", False, "no", error_kind="rejected"))  # type: ignore[arg-type]
        assert session.history.calls["c1"].state == "settled" and "c1" not in session.history.unanswered
        assert session.history.unanswered == {"c2": (1, 1)}
    finally:
        session.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in records] == list(range(1, 7)) and records[-1]["type"] == "result"
    assert load(path).calls["c1"].state == "settled"  # read back whole: valid


def test_a_session_open_per_record_writes_nothing_into_a_file_replaced_or_removed_at_its_path(
    tmp_path: Path,
) -> None:
    """The session keeps its file open between records: a file put at its path meanwhile
    takes none of its records, nor is one made where its file was removed; each record
    is refused saying why."""
    path = tmp_path / TRANSCRIPT_NAME
    session = Transcript(path)
    session.open(per_record=True)
    try:
        session.user(1, "first")
        copy = tmp_path / "copy.jsonl"
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)
        with pytest.raises(TranscriptError, match="replaced or cut short"):
            session.user(2, "second")
        assert [m.text for m in load(path).messages] == ["first"]
        path.unlink()
        with pytest.raises(TranscriptError, match="replaced or cut short"):
            session.user(2, "second")
        assert not path.exists()
    finally:
        session.close()


def test_closing_a_session_open_per_record_never_waits_for_a_record_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``close()`` (an MCP session's, on the serving event loop) returns at once while a
    call's result waits for the file's lock (a decision of another process holding it);
    the result is written once the lock is let go."""
    from rho_actors.agent import transcript_lock
    from rho_actors.loop.decisions import locked_transcript

    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    session = Transcript(path)
    session.open(per_record=True)
    waiting = threading.Event()
    relock = transcript_lock.relock

    def relock_told(*args: Any) -> None:
        waiting.set()
        relock(*args)

    monkeypatch.setattr(transcript_lock, "relock", relock_told)
    with locked_transcript(path):  # another process deciding a call holds the file's lock
        writer = threading.Thread(target=session.result, args=(1, 0, ToolResult("c1", "delete", True, "done")))
        writer.start()
        assert waiting.wait(WAIT_S)
        session.close()
        assert writer.is_alive()  # still waiting for the lock: close() did not wait for it
    writer.join(WAIT_S)
    assert not writer.is_alive()
    assert load(path).calls["c1"].state == "settled"  # written once the lock was let go


def test_a_brief_writer_reads_the_transcript_before_its_lock_and_only_the_tail_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rho_actors.agent import lines
    from rho_actors.agent import transcript as module
    from rho_actors.loop.decisions import locked_transcript

    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    size = os.path.getsize(path)
    with Transcript(path) as t:  # 1 MB more, then the decision's line comes after it
        t.result(1, 1, ToolResult("c2", "delete", True, "x" * 1_000_000))
    read_unlocked: list[int] = []
    read_locked: list[int] = []
    real = lines.read_all

    def counted(into: list[int]) -> Any:
        def read_all(fd: int, offset: int = 0) -> bytes:
            data = real(fd, offset)
            into.append(len(data))
            return data
        return read_all

    mine = Transcript(path)
    mine.read_unlocked()
    assert mine.history.calls["c2"].state == "settled" and os.path.getsize(path) > size + 1_000_000
    with Transcript(path) as other:
        other.call(1, 0, "decided", call_id="c1", name="delete", decision="approved", decided_by="ann",
                   arguments_sha256=SHA)
    monkeypatch.setattr(lines, "read_all", counted(read_unlocked))  # read_past's: before the lock
    monkeypatch.setattr(module, "read_all", counted(read_locked))  # open's and reopen's: under it
    with locked_transcript(path, transcript=mine) as locked:
        assert locked.history.calls["c1"].decision == "approved"
    assert len(read_unlocked) == 1 and read_unlocked[0] < 1000  # the decision's line only, before the lock
    assert read_locked == []  # nothing appended meanwhile: nothing read under the lock


def test_a_reader_without_the_lock_reads_whole_lines_only_and_reads_on_past_them(tmp_path: Path) -> None:
    """``read_unlocked`` reads on from where the reader last left the file, whole lines
    only (a line being written is read at the next look), and reads a file replaced
    meanwhile whole."""
    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    mine = Transcript(path)
    mine.read_unlocked()
    assert mine.history.calls["c1"].state == "pending"
    with Transcript(path) as other:
        other.call(1, 0, "decided", call_id="c1", name="delete", decision="approved", decided_by="ann",
                   arguments_sha256=SHA)
    line = path.read_bytes().splitlines(keepends=True)[-1]
    with open(path, "r+b") as file:  # the decision's line being written: its first half there
        file.truncate(os.path.getsize(path) - len(line))
        file.seek(0, os.SEEK_END)
        file.write(line[:len(line) // 2])
    mine.read_unlocked()
    assert mine.history.calls["c1"].state == "pending"  # the half line is left for later
    with open(path, "ab") as file:
        file.write(line[len(line) // 2:])
    mine.read_unlocked()
    assert mine.history.calls["c1"].decision == "approved"
    replaced = tmp_path / "other.jsonl"
    _pending(replaced)
    os.replace(replaced, path)
    mine.read_unlocked()
    assert mine.history.calls["c1"].state == "pending" and mine.history.messages  # the new file, read whole


def test_closing_a_session_open_per_record_while_a_record_is_written_closes_no_descriptor_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``close()`` while a call's result is being written (the file's lock taken again,
    the record being made) closed the descriptor the record had borrowed: the record
    went on into whatever file was opened next at that number, and its give-back closed
    that file's descriptor. Now the record's own borrow keeps the file open until it is
    written, and no other file is touched."""
    from rho_actors.agent import lines

    path = tmp_path / TRANSCRIPT_NAME
    _pending(path)
    session = Transcript(path)
    session.open(per_record=True)
    writing, go = threading.Event(), threading.Event()
    record_line = lines.record_line

    def record_line_paused(*args: Any) -> Any:
        writing.set()
        assert go.wait(WAIT_S)
        return record_line(*args)

    monkeypatch.setattr(lines, "record_line", record_line_paused)
    writer = threading.Thread(target=session.result, args=(1, 0, ToolResult("c1", "delete", True, "done")))
    writer.start()
    other_fd = -1
    try:
        assert writing.wait(WAIT_S)
        session.close()  # the session ends while its last call's result is being written
        other_fd = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT, 0o600)  # the lowest free number
    finally:
        go.set()
        writer.join(WAIT_S)
    assert not writer.is_alive()
    try:
        assert os.fstat(other_fd).st_size == 0  # still open, and nothing written into it
    finally:
        os.close(other_fd)
    assert load(path).calls["c1"].state == "settled"  # the record went on into its own file
