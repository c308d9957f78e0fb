"""Hostile round 15: attacks on what changed since e6ea43d (held results behind their
pending records, held background tasks across hosts, worker start failures and re-sends,
owned processes killed at a stop, a thread call's governor places). Each test asserts
what a user relies on: every call one result, never held back for good, never run twice,
never a process that is not ours killed.

Broke, fixed here:

- a ``Deferred`` result of a turn with a transcript took the turn's :class:`Gate` hold
  before registering the call; when registering raised (the host's timers stopped, a
  bug), the turn was answered ``loop_failed`` behind a hold no one released: ``run_turn``
  and ``arun_turn`` never returned (their results held back for good).
- two task records ``held`` for one call (one forged or left over) in a session's folder:
  the next host took both back, but only the later one was the call's; the other stayed
  ``input_required`` for good once the call was decided (an open task counted against
  the session's bound). The earliest is kept; the other ends ``cancelled``
  (``held_task_duplicate``).
- a process owned by an actor (a server's, a confined MCP server's, a worker's: their
  :class:`Enclosure`) that ended and was reaped before the system's stop killed it: the
  kill went by pid, so whatever process had that pid since was SIGKILLed (made here with
  ``ns_last_pid``). The enclosure keeps a pidfd of its child and kills by pid only while
  that pidfd finds it (a start time, psutil's, was not enough: a pid reused within the
  same clock tick passed for the child).

Found, left then (a strict ``xfail``), fixed since by a session lease
(:mod:`rho_actors.agent.session_lease`): two hosts serving one session on one data
folder at once; the call ran once, but the host that did not run it kept its task
``input_required`` for good. The second host is now refused the session by name.

Held: a record held for a call the transcript does not hold ends ``cancelled``, never
run; one naming another session in this session's folder is skipped. A crash storm of
six sessions whose process calls kill their own worker before their effect, after it or
not at all: one result each, none run twice, a call killed before its effect never noted
(12 runs, 3 at once). Exclusive thread calls whose answers meet their deadlines, in six
sessions at once, half stopped mid-turn and started again: every call one result, the
system's thread places never below none held and back to none, each session's next
exclusive calls run (12 runs, 3 at once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, Deferred, ToolCall, tool
from rho_actors.loop.approvals import SessionApprovals
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, reuse_pid

pytestmark = pytest.mark.timeout(180)


@tool
def ask_later(question: str) -> Deferred:
    """Ask the records office; its answer comes later."""
    return Deferred(f"asked: {question}")


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        system.register(ask_later)
        yield system
    finally:
        system.stop(5)


# --- 1. a turn's results held behind its held calls' records ---------------------------------------


@pytest.mark.parametrize("awaited", [False, True])
def test_a_deferred_result_whose_registration_raises_never_holds_the_turn_back(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, awaited: bool) -> None:
    """Registering a ``Deferred`` call looks at the transcript on the host's timers, which
    raise ``RuntimeError`` once stopped: the turn is still answered (each call once), at
    once, never held back behind a record that will not come."""
    loop = system.start_loop("s")

    def stopped(self: Any) -> None:
        raise RuntimeError("timers are stopped")

    monkeypatch.setattr(SessionApprovals, "_watch", stopped)
    calls = [ToolCall("d1", "ask_later", '{"question": "colour?"}')]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        turn = pool.submit(lambda: asyncio.run(loop.arun_turn(calls)) if awaited else loop.run_turn(calls))
        try:
            [result] = turn.result(WAIT_S)
        except concurrent.futures.TimeoutError:
            monkeypatch.undo()
            loop.stop()
            pytest.fail("the turn's results were held back for good")
    assert result.call_id == "d1"
    assert not result.ok and result.error_kind is not ErrorKind.DEFERRED, result  # it waits for nothing
    assert not loop.pending(), "a call answered failed must not wait too"


# --- 2. held background tasks across hosts ----------------------------------------------------------


def _held_host(data: Path) -> str:
    """A host holds ``c1`` as a task and stops; the task id."""
    from tests.held_task_host import CALL, wipe_later

    system = ActorSystem(data_dir=data, shutdown_ms=1_000)
    try:
        system.register(wipe_later)
        loop = system.start_loop("s1")
        [ack] = loop.run_turn([CALL])
        assert ack.ok, ack
        task_id: str = ack.details["task_id"]
        return task_id
    finally:
        system.stop(60)


def _forge(data: Path, task_id: str, forged_id: str, **fields: Any) -> None:
    import json

    folder = data / "sessions" / "s1" / "tasks"
    record = json.loads((folder / f"{task_id}.json").read_text())
    record.update(task_id=forged_id, **fields)
    (folder / f"{forged_id}.json").write_text(json.dumps(record))


@pytest.mark.parametrize("decision", ["approved", "rejected"])
def test_two_held_task_records_for_one_call_end_as_its_one_outcome(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decision: str) -> None:
    """A forged (or left-over) second record ``held`` for the same call: the next host
    takes the call back once, runs it at most once, and no task is left waiting for a
    decision that was made (before: one of them stayed ``input_required`` for good,
    counted open against the session's bound)."""
    from rho_actors.lifecycle.tasks import OPEN
    from tests.held_task_host import wipe_later

    runs = tmp_path / "runs.log"
    runs.touch()
    monkeypatch.setenv("RHO_TEST_RUNS", str(runs))
    data = tmp_path / "data"
    task_id = _held_host(data)
    _forge(data, task_id, "t_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
    with ActorSystem(data_dir=data, shutdown_ms=1_000) as system:
        system.register(wipe_later)
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c1"]
        if decision == "approved":
            loop.approve("c1", decided_by="test")
        else:
            loop.reject("c1", "keep /a", decided_by="test")
        for task in loop.tasks():
            info = loop.task_result(task.task_id, WAIT_S)
            assert info.status not in OPEN, info
        assert loop.pending() == []
    assert runs.read_text().splitlines() == (["wipe /a"] if decision == "approved" else [])


def test_a_held_task_record_of_another_session_or_call_is_never_taken_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged record ``held`` for a call not in the transcript ends (``cancelled``,
    never run); one naming another session in this session's folder is skipped."""
    from rho_actors.lifecycle.tasks import OPEN
    from tests.held_task_host import wipe_later

    runs = tmp_path / "runs.log"
    runs.touch()
    monkeypatch.setenv("RHO_TEST_RUNS", str(runs))
    data = tmp_path / "data"
    task_id = _held_host(data)
    _forge(data, task_id, "t_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", call_id="c-never")
    _forge(data, task_id, "t_cccccccccccccccccccccccccccccccc", session_id="s2", call_id="c-other")
    with ActorSystem(data_dir=data, shutdown_ms=1_000) as system:
        system.register(wipe_later)
        loop = system.start_loop("s1")
        assert [p.call_id for p in loop.pending()] == ["c1"]
        info = loop.task_result("t_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", WAIT_S)
        assert info.status not in OPEN and info.result is not None and not info.result.ok, info
        loop.approve("c1", decided_by="test")
        assert loop.task_result(task_id, WAIT_S).status == "completed"
        assert "t_cccccccccccccccccccccccccccccccc" not in [t.task_id for t in loop.tasks()]
        other = system.start_loop("s2")
        assert other.pending() == [] and other.tasks() == []
    assert runs.read_text().splitlines() == ["wipe /a"]


# --- 4. processes owned, killed at a stop past its timeout ------------------------------------------


def test_a_process_reaped_before_its_kill_never_has_its_pid_killed_again() -> None:
    """A server's process (its :class:`Enclosure`) that ended and was reaped before the
    system's stop killed it: its pid, now another process's, is never signalled (before:
    the kill at a stop past its timeout SIGKILLed whatever process had the pid now)."""
    import subprocess

    from rho_actors.sandbox.confine.enclosure import TREE_ONLY, Enclosure

    first = subprocess.Popen(["sleep", "120"])
    enclosure = Enclosure(TREE_ONLY, None)
    enclosure.started(first.pid)
    first.kill()
    first.wait(WAIT_S)  # ended and reaped
    other = reuse_pid(first.pid)
    try:
        enclosure.kill()
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(0.5)  # not killed (a kill would have ended it at once)
    finally:
        other.kill()
        other.wait(WAIT_S)
        enclosure.remove()


# --- 3. worker start failures and re-sends under a crash storm --------------------------------------


def _mark_and_die(args: Any, ctx: Any) -> str:
    """Note the call's id (a non-idempotent effect), then kill its own worker; one call in
    three kills it before the effect instead (never begun: may go to a fresh worker)."""
    import signal

    if args["how"] == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    with open(args["marks"], "a") as marks:
        marks.write(args["id"] + "\n")
        marks.flush()
        os.fsync(marks.fileno())
    if args["how"] == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    return "ran " + str(args["id"])


def test_a_crash_storm_of_many_sessions_never_runs_a_call_twice(tmp_path: Path) -> None:
    """Six sessions at once, each a turn of calls that kill their own worker after their
    effect, before it, or not at all: every call gets one result, none is run twice
    (its effect noted at most once), and a call answered ``ok`` ran exactly once."""
    import json
    import threading

    from .helpers import make_tool

    marks = tmp_path / "marks.log"
    marks.touch()
    with ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000) as system:
        system.register(make_tool("mark", _mark_and_die, timeout_ms=20_000), isolation="process")
        hows = ["after", "before", "none"]
        turns: dict[str, list[ToolCall]] = {
            f"s{n}": [ToolCall(f"s{n}c{i}", "mark", json.dumps({"id": f"s{n}c{i}", "how": hows[(n + i) % 3],
                                                                "marks": str(marks)})) for i in range(4)]
            for n in range(6)}
        results: dict[str, list[Any]] = {}
        loops = {sid: system.start_loop(sid) for sid in turns}

        def run(sid: str) -> None:
            results[sid] = loops[sid].run_turn(turns[sid])

        threads = [threading.Thread(target=run, args=(sid,)) for sid in turns]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(4 * WAIT_S)
        assert all(not t.is_alive() for t in threads), "a turn was not answered"
    ran = marks.read_text().split()
    assert len(ran) == len(set(ran)), f"a call ran twice: {sorted(ran)}"
    for sid, calls in turns.items():
        got = results[sid]
        assert [r.call_id for r in got] == [c.id for c in calls], got  # one result each, in order
        for call, result in zip(calls, got, strict=True):
            how = json.loads(str(call.arguments))["how"]
            if result.ok:
                assert how == "none" and ran.count(call.id) == 1, (call, result)
            else:
                assert how != "none" or result.error_kind is ErrorKind.UNAVAILABLE, (call, result)
                if how == "before":
                    assert call.id not in ran, (call, result)


# --- 5. a thread call's governor places ---------------------------------------------------------------


@tool(concurrency="exclusive", timeout_ms=25)
def at_the_edge(ms: int) -> str:
    """Work ``ms`` ms: about its deadline, so its answer and its deadline meet."""
    import time

    time.sleep(ms / 1000)
    return "done"


@tool(concurrency="exclusive")
def next_step(i: int) -> int:
    """Return ``i``."""
    return i


def test_answers_racing_their_deadlines_never_leak_or_double_return_a_place(tmp_path: Path) -> None:
    """Exclusive thread calls whose answers come at their deadlines, in sessions at once,
    some stopped mid-turn and started again: every call one result, the system's thread
    places back to none held (never negative: a place given back twice), and each
    session's next exclusive calls run."""
    import threading

    with ActorSystem(tmp_path, abandoned_threads_per_tool=64, shutdown_ms=1_000) as system:
        system.register(at_the_edge)
        system.register(next_step)
        seen: list[int] = []
        stop_seeing = threading.Event()

        def watch() -> None:
            while not stop_seeing.is_set():
                seen.append(int(system.stats()["governor"]["thread_calls_running"]))
                stop_seeing.wait(0.002)

        watcher = threading.Thread(target=watch)
        watcher.start()
        results: dict[str, list[Any]] = {}

        errors: list[BaseException] = []

        def run(sid: str) -> None:
            try:
                turns(sid)
            except BaseException as exc:
                errors.append(exc)

        def turns(sid: str) -> None:
            loop = system.start_loop(sid)
            calls = [ToolCall(f"{sid}-{i}", "at_the_edge", f'{{"ms": {20 + i % 3 * 5}}}') for i in range(12)]
            if sid.endswith("stopped"):
                future = loop.submit_turn(calls)
                loop.stop()
                results[sid] = future.result(WAIT_S)
                loop = system.start_loop(sid)
            else:
                results[sid] = loop.run_turn(calls, timeout_s=WAIT_S)
            results[sid + "/next"] = loop.run_turn([ToolCall(f"{sid}-n{i}", "next_step", f'{{"i": {i}}}')
                                                    for i in range(3)], timeout_s=WAIT_S)

        threads = [threading.Thread(target=run, args=(f"s{n}{'stopped' if n % 2 else ''}",)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(4 * WAIT_S)
        assert all(not t.is_alive() for t in threads), "a turn was not answered"
        assert not errors, errors
        assert len(results) == 12, sorted(results)
        stop_seeing.set()
        watcher.join(WAIT_S)
        for sid, got in results.items():
            if sid.endswith("/next"):
                assert [r.content for r in got] == ["0", "1", "2"], (sid, got)
            else:
                assert len(got) == 12 and all(r.ok or r.error_kind in (ErrorKind.TIMEOUT, ErrorKind.CANCELLED)
                                              for r in got), (sid, got)
        assert min(seen, default=0) >= 0, "a place was given back twice"
        assert _eventually(lambda: int(system.stats()["governor"]["thread_calls_running"]) == 0)


def _eventually(check: Any) -> bool:
    from .conftest import wait_for

    return bool(wait_for(check))


@pytest.mark.parametrize("decision", ["approved", "rejected"])
def test_a_decision_racing_the_next_hosts_start_ends_the_held_task_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decision: str) -> None:
    """A held task's call decided from another process while the next host starts its
    session: acted on once, whichever comes first (the task ends as the call's one
    outcome, the tool run at most once, nothing left waiting)."""
    import threading

    from rho_actors.loop.decisions import decide
    from tests.held_task_host import wipe_later

    runs = tmp_path / "runs.log"
    runs.touch()
    monkeypatch.setenv("RHO_TEST_RUNS", str(runs))
    data = tmp_path / "data"
    task_id = _held_host(data)
    with ActorSystem(data_dir=data, shutdown_ms=1_000) as system:
        system.register(wipe_later)
        start = threading.Barrier(2)
        loops: list[Any] = []
        said: list[str] = []

        def host() -> None:
            start.wait(WAIT_S)
            loops.append(system.start_loop("s1"))

        def person() -> None:
            start.wait(WAIT_S)
            said.append(decide(data, "s1", "c1", decision, message="keep /a", decided_by="ann"))

        threads = [threading.Thread(target=host), threading.Thread(target=person)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        assert len(loops) == 1 and len(said) == 1, (loops, said)
        loop = loops[0]
        info = loop.task_result(task_id, WAIT_S)
        assert [t.task_id for t in loop.tasks()] == [task_id], "the call ran as a second task"
        assert info.status == ("completed" if decision == "approved" else "failed"), info
        assert _eventually(lambda: loop.pending() == [])
    assert runs.read_text().splitlines() == (["wipe /a"] if decision == "approved" else [])


def test_two_hosts_on_one_data_dir_run_a_held_call_at_most_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts start the same session on one data folder at once (a deployment's
    mistake) and a person approves its held call: the second host is refused the session
    by name (its folder's lease is the first's), and the first acts on the decision once
    (broke: both served it; the one that did not run the call kept its task
    ``input_required`` for good: the look that finds the call acted on elsewhere drops it
    from the pending calls without a ``decided`` event, the one a held task ends on)."""
    from rho_actors import SessionLeaseError
    from rho_actors.loop.decisions import decide
    from tests.held_task_host import wipe_later

    runs = tmp_path / "runs.log"
    runs.touch()
    monkeypatch.setenv("RHO_TEST_RUNS", str(runs))
    data = tmp_path / "data"
    task_id = _held_host(data)
    with ActorSystem(data_dir=data, shutdown_ms=1_000) as one, ActorSystem(data_dir=data, shutdown_ms=1_000) as two:
        one.register(wipe_later)
        two.register(wipe_later)
        loop = one.start_loop("s1")
        with pytest.raises(SessionLeaseError) as refused:
            two.start_loop("s1")
        folder = data / "sessions" / "s1"
        assert (refused.value.session_id, refused.value.folder, refused.value.pid) == ("s1", folder, os.getpid())
        assert f"session 's1' is served by another ActorSystem of this process: the lease of its folder {folder} " \
               f"is held by process {os.getpid()}" in str(refused.value), refused.value
        assert [p.call_id for p in loop.pending()] == ["c1"]
        decide(data, "s1", "c1", "approved", decided_by="ann")
        info = loop.task_result(task_id, WAIT_S)
        assert info.status == "completed", info
        assert _eventually(lambda: loop.pending() == [])
        assert [t.task_id for t in loop.tasks()] == [task_id]
    assert runs.read_text().splitlines() == ["wipe /a"]
