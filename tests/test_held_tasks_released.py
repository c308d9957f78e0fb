"""Held calls that wait as tasks (DESIGN §4 "Background calls", "Approvals"), let go
without a decision: every task reaches exactly one terminal state, the one of its
call's one result, and nothing of the call waits on.

Broke, fixed here: a turn interrupted while it was prepared (a signal handler's
``KeyboardInterrupt`` in the host's thread) or not admitted (its loop stopped
meanwhile) answered each call ``turn_interrupted`` (``turn_not_started``), but a held
call that had become a task kept its task ``input_required`` for good (now it ends
``cancelled`` with its call's result), and, once the
turn's holding was done, the call itself stayed registered as pending (its task's
acknowledgement was not taken for a held call when the turn let go of what it held):
approved, it ran for a turn the host had been answered ``cancelled``.

Checked alike (held already): a held task's session ends (its MCP session's end rejects
it: ``test_held_mcp_calls``), its task cancelled (the call rejected), a rejection, and
the loop stopped and started again (the call still waits, its task too, and runs as
that task once approved)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ApprovalError, ToolCall, tool
from rho_actors.lifecycle import tasks as lifecycle_tasks
from rho_actors.lifecycle.tasks import OPEN
from rho_actors.loop import turn_holds
from rho_actors.loop.turns import Turns
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(120)

RAN: list[str] = []


@tool(background=True, requires_approval=True)
def wipe_later(path: str) -> str:
    """Wipe a path as a task, once approved."""
    RAN.append(path)
    return f"wiped {path}"


@tool
def look(path: str) -> str:
    """Look at a path."""
    return f"looked at {path}"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    RAN.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        system.register(wipe_later)
        system.register(look)
        yield system
    finally:
        system.stop()


BATCH = [ToolCall("c1", "wipe_later", '{"path": "/a"}'), ToolCall("c2", "look", '{"path": "/a"}'),
         ToolCall("c3", "wipe_later", '{"path": "/b"}')]


def _grab_futures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The futures of the turns submitted from now on (the interrupted host never gets one)."""
    futures: list[Any] = []
    real = Turns.submit

    def submit(self: Turns, calls: Any, future: Any, **kwargs: Any) -> Any:
        futures.append(future)
        return real(self, calls, future, **kwargs)

    monkeypatch.setattr(Turns, "submit", submit)
    return futures


def _interrupt_as_the_second_task_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    real = lifecycle_tasks.runs_as_task
    seen = [0]

    def runs_as_task(*args: Any) -> bool:
        seen[0] += 1
        if seen[0] == 2:  # c1 waits as a task already
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(turn_holds, "runs_as_task", runs_as_task)


def _interrupt_once_prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Turns._prepare_turn

    def prepare_turn(self: Turns, *args: Any) -> Any:
        real(self, *args)  # c1 and c3 wait as tasks
        raise KeyboardInterrupt

    monkeypatch.setattr(Turns, "_prepare_turn", prepare_turn)


def _stop_once_prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Turns._prepare_turn

    def prepare_turn(self: Turns, *args: Any) -> Any:
        held = real(self, *args)
        self.close("session_stopped")  # the loop stops while the turn is being prepared
        return held

    monkeypatch.setattr(Turns, "_prepare_turn", prepare_turn)


@pytest.mark.parametrize(("where", "raised", "kind"), [
    (_interrupt_as_the_second_task_is_made, True, ErrorKind.CANCELLED),
    (_interrupt_once_prepared, True, ErrorKind.CANCELLED),
    (_stop_once_prepared, False, ErrorKind.CANCELLED),
], ids=["interrupted making the held tasks", "interrupted once prepared", "the loop stopped once prepared"])
def test_a_held_task_of_a_turn_let_go_ends_as_its_call_and_waits_no_more(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, where: Callable[[pytest.MonkeyPatch], None],
        raised: bool, kind: ErrorKind) -> None:
    """Before: the turn answered every call, but each held call's task stayed
    ``input_required`` (``loop.tasks()``, and an MCP client's ``tasks/get``) and, but
    for the first case, the call stayed pending: approved, it ran."""
    loop = system.start_loop("s")
    loop.run_turn([ToolCall("warm", "look", '{"path": "/w"}')])
    futures = _grab_futures(monkeypatch)
    where(monkeypatch)
    if raised:
        with pytest.raises(KeyboardInterrupt):
            loop.submit_turn(BATCH)
    else:
        futures.append(loop.submit_turn(BATCH))
    monkeypatch.undo()
    results = futures[0].result(WAIT_S)
    assert [r.call_id for r in results] == ["c1", "c2", "c3"]
    assert {r.error_kind for r in results} == {kind}, results
    by_call = {r.call_id: r for r in results}
    tasks = loop.tasks()
    assert tasks, "a held call was made a task before the turn was let go"
    for task in tasks:
        assert task.status not in OPEN, task
        assert task.status == "cancelled" and task.result is not None, task
        call = by_call[task.call_id]  # the task's end is its call's one result
        assert (task.result.error_kind, task.result.content) == (call.error_kind, call.content), (task, call)
    assert loop.pending() == []
    if not raised:
        return
    with pytest.raises(ApprovalError, match="no call 'c1' waits"):
        loop.approve("c1")
    assert RAN == []
    again = loop.run_turn(BATCH)  # the same ids: none of them is taken as pending still
    assert [r.error_kind for r in again] == [None, None, None]
    assert [(r.details or {}).get("task_id", "")[:2] for r in again] == ["t_", "", "t_"]
    assert [p.call_id for p in loop.pending()] == ["c1", "c3"]


def test_a_held_task_waits_on_across_a_stop_of_its_loop_and_runs_as_that_task(system: ActorSystem) -> None:
    """``loop.stop()`` leaves a held call waiting (recorded: decidable when the session's
    loop runs again) and its task with it, ``input_required``; approved in the loop
    started again, the call runs as that very task."""
    loop = system.start_loop("s")
    [ack] = loop.run_turn([ToolCall("c1", "wipe_later", '{"path": "/a"}')])
    task_id = ack.details["task_id"]
    loop.stop()
    again = system.start_loop("s")
    assert [p.call_id for p in again.pending()] == ["c1"]
    assert [(t.task_id, t.status) for t in again.tasks()] == [(task_id, "input_required")]
    again.approve("c1")
    assert wait_for(lambda: again.tasks()[0].status == "completed"), again.tasks()
    [task] = again.tasks()
    assert (task.task_id, task.result and task.result.content, RAN) == (task_id, "wiped /a", ["/a"])


@pytest.mark.parametrize("how", ["reject", "cancel_task"])
def test_a_held_task_decided_without_running_ends_once(system: ActorSystem, how: str) -> None:
    """Rejected, or its task cancelled (which rejects the call), a held task ends once,
    the call never runs and waits no more."""
    loop = system.start_loop("s")
    [ack] = loop.run_turn([ToolCall("c1", "wipe_later", '{"path": "/a"}')])
    if how == "reject":
        loop.reject("c1", "no")
    else:
        loop.cancel_task(ack.details["task_id"])
    assert wait_for(lambda: loop.tasks()[0].status not in OPEN), loop.tasks()
    [task] = loop.tasks()
    assert task.status == ("failed" if how == "reject" else "cancelled"), task
    assert loop.pending() == [] and RAN == []
    with pytest.raises(ApprovalError):
        loop.approve("c1")
