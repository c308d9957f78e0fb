"""A held background call across a restart of its host (DESIGN §4 "Background calls",
"Approvals"): a call held for approval that waits as a task (``input_required``) keeps
waiting, and so does its task, across ``system.stop()`` (``stop(0)`` too) and ``kill -9``
of its host; the next host on the same data folder takes the task back with the call
(the same task id), and the call's decision there ends that task, once: one outcome per
call id across both hosts, the task's status agreeing with the call's result, the tool
run at most once.

Broke, fixed here: the stop ended the task ``cancelled`` (a crash left it for the next
host to end ``failed``, interrupted) while the call stayed pending in the transcript, so
the next host, once it was approved, ran it as a second task: the first read
``cancelled``, the second ``completed``, for one call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rho_actors import ActorSystem, ApprovalError, ErrorKind, Loop, TaskHostStopped, ToolCall, tool
from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from rho_actors.lifecycle.tasks import OPEN
from rho_actors.loop.decisions import decide
from rho_actors.tasks import records
from tests.conftest import WAIT_S, read_line
from tests.held_task_host import CALL, wipe_later

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parent.parent


@tool(requires_approval=True)
def wipe_now(path: str) -> str:
    """Wipe a path, once approved (not a task)."""
    return f"wiped {path} now"


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(WAIT_S)


def _system(data: Path) -> ActorSystem:
    system = ActorSystem(data_dir=data, shutdown_ms=1_000)
    system.register(wipe_later)
    return system


def _first_host(end: str, data: Path, children: list[subprocess.Popen[str]]) -> str:
    """The first host holds ``c1`` as a task and ends by ``end``; returns the task id."""
    if end == "kill -9":
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.Popen([sys.executable, "-m", "tests.held_task_host", str(data)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        children.append(proc)
        assert proc.stdout is not None
        line = read_line(proc.stdout, WAIT_S * 3).split()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(WAIT_S)
        proc.stdout.close()
        assert line[0] == "TASK", line
        return line[1]
    system = _system(data)
    try:
        loop = system.start_loop("s1")
        [ack] = loop.run_turn([CALL])
        assert ack.ok and [p.call_id for p in loop.pending()] == ["c1"], ack
        task_id: str = ack.details["task_id"]
        assert [(t.task_id, t.status) for t in loop.tasks()] == [(task_id, "input_required")]
    finally:
        system.stop(0.0 if end == "stop(0)" else 60.0)
    return task_id


def _decide(how: str, loop: Loop | None, data: Path) -> None:
    if how == "approved here":
        assert loop is not None
        loop.approve("c1", decided_by="test")
    elif how == "rejected here":
        assert loop is not None
        loop.reject("c1", "keep /a", decided_by="test")
    elif how == "approved while no host ran":
        decide(data, "s1", "c1", "approved", decided_by="test")
    else:
        decide(data, "s1", "c1", "rejected", message="keep /a", decided_by="test")


def _records(data: Path) -> list[tuple[str, str]]:
    return [(r["task_id"], r["status"]) for r in records.read_all(data / "sessions" / "s1")]


@pytest.mark.parametrize("how", ["approved here", "rejected here", "approved while no host ran",
                                 "rejected while no host ran"])
@pytest.mark.parametrize("end", ["stop", "stop(0)", "kill -9"])
def test_a_held_task_survives_its_host_and_ends_once_as_its_call(
        tmp_path: Path, runs: Path, children: list[subprocess.Popen[str]], end: str, how: str) -> None:
    data = tmp_path / "data"
    task_id = _first_host(end, data, children)
    assert _records(data) == [(task_id, "input_required")], "the held call's task still waits, as its call does"
    elsewhere = how.endswith("while no host ran")
    if elsewhere:
        _decide(how, None, data)
    approved = how.startswith("approved")
    with _system(data) as system:
        loop = system.start_loop("s1")
        if not elsewhere:
            assert [p.call_id for p in loop.pending()] == ["c1"]
            assert [(t.task_id, t.status) for t in loop.tasks()] == [(task_id, "input_required")]
            _decide(how, loop, data)
        info = loop.task_result(task_id, WAIT_S)  # the task the first host made: the call's one task
        assert [t.task_id for t in loop.tasks()] == [task_id], "the call ran as a second task"
        assert loop.pending() == []
        assert info.result is not None
        if approved:
            assert (info.status, info.result.content) == ("completed", "wiped /a"), info
        else:
            assert (info.status, info.result.error_kind) == ("failed", ErrorKind.REJECTED), info
    assert runs.read_text().splitlines() == (["wipe /a"] if approved else [])
    history = load(data / "sessions" / "s1" / TRANSCRIPT_NAME)
    track = history.calls["c1"]
    assert (track.state, track.decision) == ("settled", "approved" if approved else "rejected")
    [answer] = [m for m in history.messages if m.role == "tool" and m.tool_call_id == "c1"]
    assert answer.is_error is not approved  # the call's one result: its task's acknowledgement, or the rejection
    if approved:
        assert task_id in answer.text
    # a third host finds the one outcome, unchanged: nothing waits, nothing runs again
    with _system(data) as system:
        loop = system.start_loop("s1")
        assert loop.pending() == []
        assert [(t.task_id, t.status) for t in loop.tasks()] == [(task_id, info.status)]
        assert all(t.status not in OPEN for t in loop.tasks())
    assert runs.read_text().splitlines() == (["wipe /a"] if approved else [])


def test_a_held_task_whose_call_the_transcript_no_longer_holds_ends_not_run(tmp_path: Path, runs: Path) -> None:
    """The next host takes a held task back only with its call: a transcript that no
    longer holds the call waiting (removed here) ends the task ``cancelled``, saying so,
    and nothing waits or runs."""
    data = tmp_path / "data"
    task_id = _first_host("stop", data, [])
    (data / "sessions" / "s1" / TRANSCRIPT_NAME).unlink()
    with _system(data) as system:
        loop = system.start_loop("s1")
        assert loop.pending() == []
        info = loop.task_result(task_id, WAIT_S)
        assert info.status == "cancelled" and info.result is not None, info
        assert "transcript holds it no more" in info.result.content and task_id in info.result.content
        assert system.stats()["tasks"]["taken_back"] == 1
    assert _records(data) == [(task_id, "cancelled")]
    assert runs.read_text() == ""


def test_a_held_task_of_a_system_without_a_data_dir_ends_at_its_stop(runs: Path) -> None:
    """A system without ``data_dir`` removes its sessions' folder at its stop: nothing
    takes a held call back, so its task ends ``cancelled`` there (as its call never runs)."""
    system = ActorSystem(shutdown_ms=1_000)
    system.register(wipe_later)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([CALL])
    system.stop()
    info = loop.task_result(ack.details["task_id"], WAIT_S)  # what the stopped host tells a waiter
    assert info.status == "cancelled", info
    assert runs.read_text() == ""


def test_a_waiter_on_a_held_task_is_told_at_once_when_its_host_stops(tmp_path: Path, runs: Path) -> None:
    """``task_result`` of a held task whose host stops is answered then, as OTP answers
    a caller whose server went down (``TaskHostStopped``, naming the task and that its
    host stopped), not at its timeout; the task and its call stay held for the next
    host, which takes them back. Before: the waiter returned only at its ``timeout_s``."""
    data = tmp_path / "data"
    system = _system(data)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([CALL])
    task_id = ack.details["task_id"]
    answered: list[BaseException] = []
    waiting = threading.Event()

    def waiter() -> None:
        waiting.set()
        try:
            loop.task_result(task_id, WAIT_S * 10)
        except BaseException as exc:
            answered.append(exc)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert waiting.wait(WAIT_S)
    system.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the waiter is answered only at its timeout"
    [told] = answered
    assert isinstance(told, TaskHostStopped), told
    assert told.info.status == "input_required" and task_id in str(told) and "host stopped" in str(told)
    with pytest.raises(TaskHostStopped):  # asked after the stop: at once too
        loop.task_result(task_id, WAIT_S * 10)
    assert _records(data) == [(task_id, "input_required")]
    with _system(data) as system:  # the next host takes it back, and its decision ends it
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c1"]
        loop.approve("c1", decided_by="test")
        assert loop.task_result(task_id, WAIT_S).status == "completed"
    assert runs.read_text().splitlines() == ["wipe /a"]


def test_a_waiter_on_a_held_calls_decision_is_told_at_once_when_its_host_stops(tmp_path: Path, runs: Path) -> None:
    """``when_decided`` of a call held for approval (not a task) whose host stops fails
    then with an ``ApprovalError`` naming the call and that its host stopped; the call
    stays held for the next host. Before: the future was never set (its waiter returned
    only at its own timeout)."""
    data = tmp_path / "data"
    system = _system(data)
    system.register(wipe_now)
    loop = system.start_loop("s1")
    [held] = loop.run_turn([ToolCall("c2", "wipe_now", '{"path": "/b"}')])
    assert held.error_kind is ErrorKind.PENDING_APPROVAL, held
    decided = loop.when_decided("c2")
    system.stop()
    told = decided.exception(WAIT_S)
    assert isinstance(told, ApprovalError) and "'c2'" in str(told) and "host stopped" in str(told), told
    with _system(data) as system:
        system.register(wipe_now)
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c2"]
        assert loop.approve("c2", decided_by="test").content == "wiped /b now"
