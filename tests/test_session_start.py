"""What a session's start reads of its folder: the task records and the approvals'
transcript a host that died left are found there (test_task_reruns,
test_approvals_durable); a folder that has neither is listed once at the start and
nothing more is looked up, and a restart of its loop looks again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ToolCall, kill
from rho_actors.agent.transcript import TRANSCRIPT_NAME
from rho_actors.loop.approvals import SessionApprovals
from rho_actors.tasks import records

from .conftest import WAIT_S, wait_for
from .helpers import echo


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Each read of a session's task records and each look for its transcript."""
    seen: dict[str, list[Any]] = {"tasks": [], "transcript": []}
    read_all, exists = records.read_all, SessionApprovals.transcript_exists

    def counted_read_all(session_dir: Path) -> list[dict[str, Any]]:
        seen["tasks"].append(session_dir.name)
        return read_all(session_dir)

    def counted_exists(self: SessionApprovals) -> bool:
        seen["transcript"].append(self.session_id)
        return exists(self)

    monkeypatch.setattr(records, "read_all", counted_read_all)
    monkeypatch.setattr(SessionApprovals, "transcript_exists", counted_exists)
    return seen


def test_a_folder_without_task_records_or_transcript_is_not_looked_into_again(
    system: ActorSystem, looks: dict[str, list[Any]]
) -> None:
    first = system.start_loop("s1")
    folder = first.data_dir  # made now: empty
    first.stop()
    again = system.start_loop("s1")
    again.stop()
    fresh = system.start_loop("s2")  # no folder at all
    fresh.stop()
    assert looks == {"tasks": [], "transcript": []}
    (folder / "tasks").mkdir()
    (folder / TRANSCRIPT_NAME).write_text("")
    third = system.start_loop("s1")  # both are there now: each read as before
    third.stop()
    assert looks == {"tasks": ["s1"], "transcript": []}  # the transcript's name was in the listing


def test_a_restarted_loop_reads_task_records_made_after_its_session_started(
    system: ActorSystem, looks: dict[str, list[Any]]
) -> None:
    loop = system.start_loop("s1")
    folder = loop.data_dir
    assert looks["tasks"] == []
    (folder / "tasks").mkdir()  # made after the start's listing: a restart must not trust that listing
    before = loop.ref
    kill(before)
    assert wait_for(lambda: loop.alive and loop.ref is not before, WAIT_S)
    assert looks["tasks"] == ["s1"]
    loop.stop()


def test_the_first_turn_finds_its_loop_without_a_look_up_by_name_and_after_a_crash_finds_the_restart(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    system.register(echo)
    names = system._runtime.names
    looked: list[str] = []
    whereis = names.whereis

    def counted(name: str) -> Any:
        looked.append(name)
        return whereis(name)

    monkeypatch.setattr(names, "whereis", counted)
    loop = system.start_loop("s1")
    looked.clear()
    [first] = loop.run_turn([ToolCall("c1", "echo", '{"text": "a"}')], timeout_s=WAIT_S)
    assert first.ok and looked == []
    crashed = system.start_loop("s2")
    before = crashed.ref
    kill(before)  # before its first turn: that turn waits for the restart and runs there
    assert wait_for(lambda: not before.is_alive(), WAIT_S)
    [second] = crashed.run_turn([ToolCall("c2", "echo", '{"text": "b"}')], timeout_s=WAIT_S)
    assert second.ok and second.content == "b" and crashed.ref is not before
    loop.stop()
    crashed.stop()
