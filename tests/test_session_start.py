"""What a session's start reads of its folder: the task records and the approvals'
transcript a host that died left are found there (test_task_reruns,
test_approvals_durable); a folder that has neither is found so by two look-ups at the
start (one ``lstat`` each, no listing) and nothing more is looked up, and a restart of its loop looks again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ToolCall, kill
from rho_actors.agent.transcript import TRANSCRIPT_NAME
from rho_actors.loop.approvals import SessionApprovals
from rho_actors.tasks import records

from .conftest import WAIT_S, wait_for
from .helpers import echo, make_tool


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


class _Name(str):
    """A str subclass: a withheld name is kept as a plain str."""


def test_sessions_withholding_the_same_names_share_their_sorted_list_and_each_gets_it_right(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rho_actors.loop.turn as turn_module

    system.register(make_tool("withheld_seen", lambda args, ctx: ",".join(ctx["withheld"])))
    sorts: list[int] = []

    def counted_sorted(items: Any) -> list[Any]:
        sorts.append(len(items))
        return sorted(items)

    monkeypatch.setattr(turn_module, "sorted", counted_sorted, raising=False)
    names = [f"tool_{i:03d}" for i in range(50, 0, -1)]

    def seen(session_id: str, withheld: Any) -> str:
        loop = system.start_loop(session_id, withheld=withheld)
        try:
            [result] = loop.run_turn([ToolCall("c", "withheld_seen", "{}")], timeout_s=WAIT_S)
            assert result.ok, result.content
            return str(result.content)
        finally:
            loop.stop()

    listed = ",".join(sorted(names))
    assert seen("a", names) == listed and sorts == [50]
    assert seen("b", list(names)) == listed and sorts == [50]  # the same names: sorted once
    assert seen("c", tuple(_Name(n) for n in names)) == listed and sorts == [50]
    assert seen("d", [*names, "tool_000"]) == ",".join(["tool_000", *sorted(names)]) and sorts == [50, 51]
    loop = system.start_loop("e", withheld=names)
    loop.set_withheld(["tool_999"])
    [result] = loop.run_turn([ToolCall("c", "withheld_seen", "{}")], timeout_s=WAIT_S)
    assert result.content == "tool_999"
    loop.stop()
    with pytest.raises(TypeError, match="must be a str"):
        system.start_loop("f", withheld=[*names[:3], 7])  # type: ignore[list-item]


def test_a_folder_with_many_entries_is_not_listed_only_its_two_names_looked_up(
    system: ActorSystem, looks: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    first = system.start_loop("s1")
    folder = first.data_dir
    first.stop()
    for i in range(300):
        (folder / f"note_{i:04d}.txt").write_text("")
    listed: list[Any] = []
    scandir = os.scandir

    def counted_scandir(*args: Any) -> Any:
        listed.append(args)
        return scandir(*args)

    monkeypatch.setattr(os, "scandir", counted_scandir)
    again = system.start_loop("s1")  # neither name among 300 others: nothing read, nothing listed
    again.stop()
    assert looks == {"tasks": [], "transcript": []} and listed == []
    (folder / "tasks").mkdir()
    (folder / TRANSCRIPT_NAME).write_text("")
    third = system.start_loop("s1")  # both found by their look-ups: the records read, the transcript not looked for
    third.stop()
    assert looks == {"tasks": ["s1"], "transcript": []} and listed == []
