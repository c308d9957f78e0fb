"""Durable transcripts: the record schema, reading back, torn lines, pending calls, the lock."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rho_actors.agent import transcript_lock
from rho_actors.agent.model import Message, Reply
from rho_actors.agent.transcript import (
    INTERRUPTED,
    TRANSCRIPT_NAME,
    Transcript,
    TranscriptBusyError,
    TranscriptError,
    checksum,
    load,
    read_records,
)
from rho_actors.loop.decisions import locked_transcript
from rho_actors.tool import ErrorKind, Image, ToolCall, ToolResult
from tests.conftest import WAIT_S, read_line, wait_for

pytestmark = pytest.mark.timeout(30)

CALLS = (ToolCall("c1", "add", '{"a": 1}'), ToolCall("c2", "look", {"where": "here", "n": [1, 2]}))
PNG = b"\x89PNG\r\n\x1a\n\x00\xff"


def _write_step(path: Path, *, with_results: int = 2) -> None:
    with Transcript(path) as t:
        t.user(1, "hello ünïcode \ud800")
        t.reply(1, Reply("let me look", CALLS), model_ms=12.5)
        results = [
            ToolResult("c1", "add", True, "1", duration_ms=0.5),
            ToolResult("c2", "look", False, "boom", ErrorKind.RAISED, details={"host": "only"}, images=(Image(PNG),)),
        ]
        for index, result in enumerate(results[:with_results]):
            t.result(1, index, result)


def test_records_follow_the_schema(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _write_step(path)
    with Transcript(path) as t:
        t.reply(2, Reply("done"))
        t.error(2, "max_steps", "stopped")
    lines = path.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["type"], r["step"]) for r in records] == [
        ("user", 1), ("reply", 1), ("result", 1), ("result", 1), ("reply", 2), ("error", 2)]
    assert all(r["v"] == 2 and isinstance(r["ts"], float) for r in records)
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(r["sum"] == checksum(r) for r in records)
    assert records[1]["tool_calls"] == [
        {"id": "c1", "name": "add", "arguments": '{"a": 1}'},
        {"id": "c2", "name": "look", "arguments": {"where": "here", "n": [1, 2]}},
    ]
    assert records[1]["model_ms"] == 12.5
    digest = hashlib.sha256(PNG).hexdigest()
    assert records[3]["images"] == [{"mime_type": "image/png", "sha256": digest, "bytes": len(PNG)}]
    assert (tmp_path / "images" / digest).read_bytes() == PNG  # by digest, beside the transcript
    assert records[3]["error_kind"] == "raised" and "details" not in records[3]
    assert records[5]["kind"] == "max_steps" and records[5]["message"] == "stopped"


def test_load_gives_the_conversation_back(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _write_step(path)
    history = load(path)
    assert history.messages == [
        Message.user("hello ünïcode \ufffd"),  # a lone surrogate never reaches the file
        Message.assistant("let me look", CALLS),
        Message("tool", "1", (), "c1", "add", False, ()),
        Message("tool", "boom", (), "c2", "look", True, (Image(PNG),)),
    ]
    assert history.next_step == 2 and history.pending == [] and history.awaiting_reply
    assert not history.torn and history.records == 4


def test_missing_results_become_pending_cancelled_results(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _write_step(path, with_results=1)
    history = load(path)
    [(step, index, result)] = history.pending
    assert (step, index, result.call_id, result.error_kind, result.content) == (
        1, 1, "c2", ErrorKind.CANCELLED, INTERRUPTED)
    assert history.messages[-1] == Message.tool_result(result)
    assert history.messages[-2].tool_call_id == "c1"


def test_a_torn_last_line_is_skipped_then_truncated(tmp_path: Path, logs: list[str]) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _write_step(path)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"v": 1, "type": "reply", "st')
    history = load(path)
    assert history.torn and history.records == 4 and len(history.messages) == 4
    assert any("cut short" in m for m in logs)
    assert path.read_bytes().endswith(b'"st')  # load() never changes the file
    with Transcript(path) as t:
        assert t.history.torn
        assert path.read_bytes() == whole  # open() truncates to the last whole line
        t.reply(2, Reply("ok"))
    records, good, torn = read_records(path)
    assert [r["type"] for r in records][-1] == "reply" and not torn and good == path.stat().st_size


def test_an_unparsable_last_line_with_newline_is_torn_too(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _write_step(path)
    path.write_bytes(path.read_bytes() + b"\x00\x00\x00\n")
    assert load(path).torn


def test_a_whole_last_line_changed_into_no_json_is_an_error_not_torn(tmp_path: Path) -> None:
    # A line ending in its newline was written whole: a byte flipped in it (here in the
    # last result's "ok") is damage, never a crash, and must not silently drop the record.
    path = tmp_path / TRANSCRIPT_NAME
    _write_step(path)
    data = path.read_bytes()
    at = data.rindex(b'"ok": false')
    path.write_bytes(data[:at] + b'"ok": fAlse' + data[at + 11:])
    with pytest.raises(TranscriptError, match="line 4 is not a valid record"):
        load(path)
    with pytest.raises(TranscriptError, match="line 4"), Transcript(path):
        pass
    assert path.read_bytes().count(b"\n") == 4  # nothing was truncated


def test_a_bad_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    _write_step(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"not json\n" + b"".join(lines[1:]))
    with pytest.raises(TranscriptError, match="line 2"):
        load(path)
    with pytest.raises(TranscriptError, match="line 2"), Transcript(path):
        pass


def test_a_record_breaking_the_schema_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    path.write_text('{"v": 1, "type": "result", "step": 3, "index": 0}\n', encoding="utf-8")
    with pytest.raises(TranscriptError, match="line 1 is not a valid record"):
        load(path)


def test_unknown_record_types_are_skipped(tmp_path: Path, logs: list[str]) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    path.write_text('{"v": 1, "type": "note", "step": 1}\n{"v": 1, "type": "user", "step": 1, "text": "hi"}\n',
                    encoding="utf-8")
    assert load(path).messages == [Message.user("hi")]
    assert any("unknown record type 'note'" in m for m in logs)


def test_a_model_error_uses_up_its_step(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    with Transcript(path) as t:
        t.user(1, "hi")
        t.error(1, "model", "provider down")
        assert t.history.next_step == 1
    history = load(path)
    assert history.next_step == 2 and history.messages == [Message.user("hi")] and history.awaiting_reply
    with Transcript(path) as t, pytest.raises(ValueError, match="error kind"):
        t.error(2, "oops", "no such kind")


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    with Transcript(path), pytest.raises(TranscriptBusyError, match="in use"):
        Transcript(path).open()
    with Transcript(path) as again:  # released on close
        again.user(1, "hi")
    assert load(path).messages == [Message.user("hi")]


def _open_into(path: Path, opened: list[Transcript | BaseException]) -> None:
    """Open the transcript at ``path`` as a prompt does; append it, or what that raised, to ``opened``."""
    transcript = Transcript(path)
    try:
        transcript.open()
        opened.append(transcript)
    except BaseException as exc:
        opened.append(exc)


def test_a_child_process_forked_during_a_prompt_does_not_keep_its_session(tmp_path: Path) -> None:
    # A host that starts a process (a subprocess, a fork server) while a prompt runs forks
    # a child holding copies of all its descriptors until its exec: the session's next
    # prompt must not be refused "in use by another prompt" once this one has ended.
    path = tmp_path / TRANSCRIPT_NAME
    go_on, hold = os.pipe()
    with Transcript(path) as first:
        first.user(1, "hi")
        child = os.fork()
        if child == 0:  # as before its exec: until told to end
            os.read(go_on, 1)
            os._exit(0)
    opened: list[Transcript | BaseException] = []

    second = threading.Thread(target=_open_into, args=(path, opened))
    try:
        second.start()
        assert wait_for(lambda: transcript_lock.prompt_held_here(path) or bool(opened))  # the child lives
        assert opened == []  # and its copy of the transcript's own lock is waited for, as a record being written
    finally:
        os.write(hold, b"x")  # its exec, which closes its copies
        os.waitpid(child, 0)
        os.close(go_on)
        os.close(hold)
    second.join(WAIT_S)
    [prompting] = opened
    assert isinstance(prompting, Transcript), prompting
    with prompting:
        prompting.user(2, "again")
    assert load(path).messages == [Message.user("hi"), Message.user("again")]


def test_a_prompt_of_another_process_refuses_this_one(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from rho_actors.agent.transcript import Transcript; "
                               "t = Transcript(__import__('pathlib').Path(sys.argv[1])); t.open(); "
                               "print('held', flush=True); sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert read_line(holder.stdout) == "held\n"  # type: ignore[arg-type]
        with pytest.raises(TranscriptBusyError, match="in use by another prompt"):
            Transcript(path).open()
    finally:
        holder.communicate("", timeout=WAIT_S)
    with Transcript(path) as again:  # released with its process
        again.user(1, "hi")


def test_a_file_read_in_the_session_folder_does_not_release_its_prompt(tmp_path: Path) -> None:
    # The prompt lock is the session's folder's, which its tools are given
    # (ctx["data_dir"]): a tool of this process listing or reading the folder opens and
    # closes it and its files, and closing any descriptor of a file would release this
    # process's POSIX record lock on it. Another process must still be refused.
    path = tmp_path / TRANSCRIPT_NAME
    served = Transcript(path)
    served.open(per_record=True)  # as a session served over MCP: the prompt lock alone holds it between records
    try:
        served.user(1, "hi")
        reader = threading.Thread(target=lambda: [f.read_bytes() for f in sorted(tmp_path.iterdir())])
        reader.start()
        reader.join(WAIT_S)
        _refused_in_another_process(path)
    finally:
        served.close()
    assert load(path).messages == [Message.user("hi")]


def _refused_in_another_process(path: Path) -> None:
    """Another process opening the transcript at ``path`` for a prompt is refused."""
    other = subprocess.run(
        [sys.executable, "-c", "import sys; from rho_actors.agent.transcript import Transcript; "
                               "t = Transcript(__import__('pathlib').Path(sys.argv[1])); t.open(); "
                               "t.user(2, 'intruder'); print('opened')", str(path)],
        capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert "in use by another prompt" in other.stderr, other.stdout + other.stderr


def test_a_session_folder_emptied_by_a_tool_does_not_release_its_prompt(tmp_path: Path) -> None:
    # A tool given its session's folder (ctx["data_dir"]) that clears it of its files
    # (a lock file there among them) while a prompt holds the session: another process
    # must still be refused, not lock a new file of the same name and append beside it.
    path = tmp_path / TRANSCRIPT_NAME
    served = Transcript(path)
    served.open(per_record=True)
    try:
        served.user(1, "hi")
        for file in tmp_path.iterdir():
            if file.name != TRANSCRIPT_NAME:
                file.unlink()
        _refused_in_another_process(path)
    finally:
        served.close()
    assert load(path).messages == [Message.user("hi")]


def test_a_writer_waits_for_a_record_being_written_not_for_a_prompt(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    opened: list[Transcript | BaseException] = []

    with locked_transcript(path) as brief:  # a decision or a result being recorded, as another host writes one
        brief.user(1, "hi")
        waiting = threading.Thread(target=_open_into, args=(path, opened))
        waiting.start()
        assert wait_for(lambda: transcript_lock.prompt_held_here(path))
        assert opened == []  # and it waits for the record being written
    waiting.join(WAIT_S)
    [prompting] = opened
    assert isinstance(prompting, Transcript) and prompting.history.messages == [Message.user("hi")]
    prompting.close()


def test_a_record_held_past_its_bound_is_named_in_the_error(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    monkeypatch.setattr(transcript_lock, "RECORD_WAIT_S", 0.05)
    with locked_transcript(path), pytest.raises(TranscriptBusyError, match=r"a decision or a result being "
                                                                          r"recorded .* more than 0.05 s"):
        Transcript(path).open()
    with Transcript(path) as again:  # both locks released on the error
        again.user(1, "hi")


def test_a_missing_transcript_is_empty(tmp_path: Path) -> None:
    history = load(tmp_path / "none" / TRANSCRIPT_NAME)
    assert history.messages == [] and history.next_step == 1 and not history.awaiting_reply
