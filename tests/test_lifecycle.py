"""The lifecycle of a call (DESIGN §4): its states and moves as data, its ``call``
records in a session's transcript, and what a transcript read back says is still open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rho_actors.agent.model import Reply
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptError, load
from rho_actors.lifecycle import (
    FIRST_STATES,
    STATES,
    TRANSITIONS,
    LifecycleError,
    allowed,
    arguments_sha256,
    call_record,
    fold,
)
from rho_actors.tool import ToolCall, ToolResult

SHA = arguments_sha256({"path": "/tmp/x"})


def test_every_state_has_its_moves_and_settled_is_terminal() -> None:
    assert set(TRANSITIONS) == set(STATES)
    assert TRANSITIONS["settled"] == frozenset()
    assert all(after in STATES for moves in TRANSITIONS.values() for after in moves)
    assert {"pending", "queued", "running", "settled"} == FIRST_STATES
    assert allowed(None, "pending") and not allowed(None, "decided")
    assert allowed("running", "pending")  # a tool that returned Deferred
    assert allowed("retried", "queued") and allowed("backgrounded", "pending")
    assert not allowed("settled", "running") and not allowed("pending", "running")


def test_the_arguments_hash_is_canonical() -> None:
    assert arguments_sha256({"b": 1, "a": [1, 2]}) == arguments_sha256({"a": [1, 2], "b": 1})
    assert arguments_sha256({"a": 1}) != arguments_sha256({"a": 2})
    with pytest.raises(ValueError, match="cannot be hashed"):
        arguments_sha256({"a": float("nan")})


def test_a_record_names_what_is_wrong() -> None:
    with pytest.raises(LifecycleError, match="lacks arguments_sha256"):
        call_record("pending", call_id="c1", name="t", index=0, kind="approval")
    with pytest.raises(LifecycleError, match="has no field colour"):
        call_record("queued", call_id="c1", name="t", index=0, colour="red")
    with pytest.raises(LifecycleError, match="decision cannot be 'maybe'"):
        call_record("decided", call_id="c1", name="t", index=0, decision="maybe", decided_by=None,
                    arguments_sha256=SHA)
    with pytest.raises(LifecycleError, match="not a recorded state"):
        call_record("settled", call_id="c1", name="t", index=0)


def _records(*records: dict[str, object]) -> list[dict[str, object]]:
    return [{"type": "call", "step": 1, **r} for r in records]


def test_fold_follows_each_call_and_refuses_a_wrong_move() -> None:
    pending = call_record("pending", call_id="c1", name="t", index=0, kind="approval", arguments_sha256=SHA)
    decided = call_record("decided", call_id="c1", name="t", index=0, decision="rejected", decided_by="ann",
                          arguments_sha256=SHA, message="no")
    tracks = fold(_records(pending, decided))
    assert tracks["c1"].state == "decided" and tracks["c1"].decision == "rejected" and tracks["c1"].kind == "approval"
    assert tracks["c1"].states["decided"]["at"] == decided["at"]
    running = call_record("running", call_id="c1", name="t", index=0, arguments_sha256=SHA)
    with pytest.raises(LifecycleError, match="a call rejected can only settle"):
        fold(_records(pending, decided, running))
    with pytest.raises(LifecycleError, match="no move from its turn to decided"):
        fold(_records(decided))
    settled = fold([*_records(pending, decided), {"type": "result", "step": 1, "call_id": "c1"}])
    assert settled["c1"].state == "settled"


def _reply(path: Path) -> Transcript:
    transcript = Transcript(path)
    transcript.open()
    transcript.user(1, "clean up")
    transcript.reply(1, Reply(tool_calls=(ToolCall("c1", "rm", '{"path": "/tmp/x"}'),
                                          ToolCall("c2", "rm", '{"path": "/tmp/y"}'),
                                          ToolCall("c3", "ls", "{}"))))
    return transcript


def test_open_calls_are_not_interrupted(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    with _reply(path) as transcript:
        transcript.call(1, 0, "pending", call_id="c1", name="rm", kind="approval", arguments_sha256=SHA,
                        expires_at=None)
        transcript.call(1, 1, "pending", call_id="c2", name="rm", kind="approval", arguments_sha256=SHA)
        transcript.call(1, 1, "decided", call_id="c2", name="rm", decision="approved", decided_by=None,
                        arguments_sha256=SHA)
        transcript.result(1, 2, ToolResult("c3", "ls", True, "a b"))
    history = load(path)
    assert set(history.open_calls) == {"c1", "c2"}
    assert history.open_calls["c2"].decision == "approved"
    assert history.pending == []  # nothing interrupted
    assert [m.role for m in history.messages] == ["user", "assistant", "tool"]  # c3's result only


def test_an_approved_call_that_started_is_interrupted_not_open(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    with _reply(path) as transcript:
        transcript.call(1, 0, "pending", call_id="c1", name="rm", kind="approval", arguments_sha256=SHA)
        transcript.call(1, 0, "decided", call_id="c1", name="rm", decision="approved", decided_by="ann",
                        arguments_sha256=SHA)
        transcript.call(1, 0, "running", call_id="c1", name="rm", arguments_sha256=SHA, attempt=1)
    history = load(path)
    assert "c1" not in history.open_calls
    assert [(step, index, r.error_kind) for step, index, r in history.pending] == [
        (1, 0, "cancelled"), (1, 1, "cancelled"), (1, 2, "cancelled")]  # c2, c3: no record, the usual rule


def test_a_call_record_for_no_call_is_refused(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    with _reply(path) as transcript:
        transcript.call(1, 5, "pending", call_id="c9", name="rm", kind="approval", arguments_sha256=SHA)
    with pytest.raises(TranscriptError, match="call 5 of step 1, which has no such call"):
        load(path)


def test_a_transcript_reader_that_knows_no_call_records_skips_them(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    with _reply(path) as transcript:
        transcript.call(1, 0, "pending", call_id="c1", name="rm", kind="approval", arguments_sha256=SHA)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[-1]["type"] == "call" and records[-1]["v"] == 2 and records[-1]["state"] == "pending"
