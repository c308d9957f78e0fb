"""A call that waits for a decision is announced only once its ``pending`` record is in
the session's transcript (DESIGN §4 "Approvals"): the turn's result (``arun_turn``, and
``run_turn`` for a tool's ``Deferred``), its ``pending`` event, and what an MCP session
tells a person or client (``test_held_mcp_calls``) all come after the record, so a
decision made at once (``rho-actors approve`` from another process reads the
transcript) finds the call.

Broke, fixed here: a turn awaited on an event loop (an MCP session's) records its held
calls on a pool thread, but gave its results at once; a ``Deferred`` result of a turn run
directly was recorded on a pool thread too, after ``run_turn`` returned; and the
``pending`` event was emitted as the call was held, before either record. A decision
made right after any of them could be refused "no call waits for a decision".

Every order is forced, never raced: the record waits (briefly) for the announcement, so
before the fix the announcement came first every time; after it, the record goes first
whatever the wait."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, Deferred, ToolCall, tool
from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from rho_actors.loop import approval_journal, decisions
from rho_actors.loop.decisions import decide
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(120)

_HELD_BACK_S = 1.0  # how long a record waits for an announcement that must not come first (not an outcome's bound)


@tool(requires_approval=True)
def delete(path: str) -> str:
    """Delete a file, once approved."""
    return f"deleted {path}"


@tool
def ask_records(question: str) -> Deferred:
    """Ask the records office; its answer comes later."""
    return Deferred(f"asked: {question}")


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        system.register(delete)
        system.register(ask_records)
        yield system
    finally:
        system.stop()


class _Order:
    """What happened, in order: the transcript's ``recorded`` pending record (held back
    until an announcement or :data:`_HELD_BACK_S`), ``event`` (the ``pending`` event) and
    ``returned`` (the turn's result)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, transcript: Path) -> None:
        self.seen: list[str] = []
        self.announced = threading.Event()
        self.transcript = transcript
        self._lock = threading.Lock()
        real = decisions.record_held

        def record_held(*args: Any) -> None:
            self.announced.wait(_HELD_BACK_S)
            real(*args)
            self.note("recorded")

        monkeypatch.setattr(approval_journal, "record_held", record_held)

    def note(self, what: str) -> None:
        with self._lock:
            self.seen.append(what)
        if what != "recorded":
            self.announced.set()

    def pending_recorded(self, call_id: str) -> bool:
        track = load(self.transcript).calls.get(call_id) if self.transcript.exists() else None
        return track is not None and track.state == "pending"


def _order(system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> _Order:
    order = _Order(monkeypatch, system.data_dir / "sessions" / "s" / TRANSCRIPT_NAME)
    system.subscribe(lambda e: order.note("event") if isinstance(e, CallEvent) and e.kind == "pending" else None)
    return order


def test_an_awaited_turn_gives_a_held_calls_result_once_it_is_recorded(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``returned`` and ``event`` came first, the record after them; a decision
    from another process right then was refused "no call waits"."""
    loop = system.start_loop("s")
    order = _order(system, monkeypatch)

    async def main() -> Any:
        [result] = await loop.arun_turn([ToolCall("c1", "delete", '{"path": "/a"}')])
        order.note("returned")
        return result

    result = asyncio.run(main())
    assert result.error_kind is ErrorKind.PENDING_APPROVAL
    assert order.seen == ["recorded", "event", "returned"]
    assert order.pending_recorded("c1")
    said = decide(system.data_dir, "s", "c1", "approved", decided_by="ann")  # at once, as from another process
    assert said.startswith("call c1 of session s approved by ann")
    assert loop.when_decided("c1").result(WAIT_S).content == "deleted /a"


def test_a_deferred_result_of_a_turn_run_directly_is_given_once_it_is_recorded(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``run_turn`` returned the ``deferred`` result (and the event came) before
    the call's pending record was written."""
    loop = system.start_loop("s")
    order = _order(system, monkeypatch)
    [result] = loop.run_turn([ToolCall("c1", "ask_records", '{"question": "colour?"}')])
    order.note("returned")
    assert result.error_kind is ErrorKind.DEFERRED
    assert order.seen == ["recorded", "event", "returned"]
    assert order.pending_recorded("c1")
    assert loop.resolve("c1", "blue").content == "blue"


def test_a_held_call_of_a_turn_run_directly_is_recorded_before_anything_says_it_waits(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_turn`` records its held calls in its own thread (held already): the event
    too comes after the record now (before: as the call was held)."""
    loop = system.start_loop("s")
    order = _order(system, monkeypatch)
    [result] = loop.run_turn([ToolCall("c1", "delete", '{"path": "/a"}')])
    order.note("returned")
    assert result.error_kind is ErrorKind.PENDING_APPROVAL
    assert order.seen == ["recorded", "event", "returned"]


# --- attacks on the order -----------------------------------------------------------------------

RAN: list[str] = []


@tool(requires_approval=True)
def wipe(path: str) -> str:
    """Wipe a path, once approved."""
    RAN.append(path)
    return f"wiped {path}"


@tool(background=True, requires_approval=True)
def wipe_later(path: str) -> str:
    """Wipe a path as a task, once approved."""
    RAN.append(path)
    return f"wiped {path} later"


@pytest.mark.parametrize("name", ["wipe", "wipe_later"])
def test_decisions_racing_right_after_a_held_call_is_announced_run_it_once(system: ActorSystem, name: str) -> None:
    """As soon as ``arun_turn`` answers, two decisions from "other processes" and one in
    the host race: each finds the call (none is refused "no call waits"), exactly one
    wins (the others are told it was decided already), and the call runs once (as its
    task, for a background tool)."""
    from rho_actors import ApprovalError

    RAN.clear()
    system.register(wipe)
    system.register(wipe_later)
    loop = system.start_loop("s")
    [held] = asyncio.run(loop.arun_turn([ToolCall("c1", name, '{"path": "/a"}')]))
    assert held.error_kind is ErrorKind.PENDING_APPROVAL or "pending" in (held.details or {}), held
    start = threading.Barrier(3)
    outcomes: list[str] = []

    def race(decision: Any) -> None:
        start.wait(WAIT_S)
        try:
            decision()
        except ApprovalError as exc:
            outcomes.append("refused: " + str(exc))
        else:
            outcomes.append("won")

    racers = [threading.Thread(target=race, args=(lambda: decide(system.data_dir, "s", "c1", "approved"),)),
              threading.Thread(target=race, args=(lambda: decide(system.data_dir, "s", "c1", "approved"),)),
              threading.Thread(target=race, args=(lambda: loop.approve("c1", decided_by="host"),))]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(WAIT_S)
    assert outcomes.count("won") == 1, outcomes
    assert all("decided already" in o or "being decided" in o for o in outcomes if o != "won"), outcomes
    if name == "wipe":
        assert loop.when_decided("c1").result(WAIT_S).content == "wiped /a"
    else:
        [task] = loop.tasks()
        assert system.task_registry.wait("s", system.data_dir / "sessions" / "s", task.task_id, WAIT_S).status \
            == "completed"
    assert RAN == ["/a"] and loop.pending() == []


def test_a_stop_while_a_held_call_is_being_recorded_gives_the_turn_its_result_and_keeps_the_call(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's loop stops while an awaited turn's held call is being recorded: the
    turn still gets its result once the record is written (nothing held back for good),
    and the call waits on, recorded, decidable when the session runs again."""
    RAN.clear()
    system.register(wipe)
    entered, go = threading.Event(), threading.Event()
    real = decisions.record_held

    def record_held(*args: Any) -> None:
        entered.set()
        go.wait(WAIT_S)
        real(*args)

    monkeypatch.setattr(approval_journal, "record_held", record_held)
    loop = system.start_loop("s")
    results: list[Any] = []
    turn = threading.Thread(target=lambda: results.extend(
        asyncio.run(loop.arun_turn([ToolCall("c1", "wipe", '{"path": "/a"}')]))))
    turn.start()
    assert entered.wait(WAIT_S)
    loop.stop()
    go.set()
    turn.join(WAIT_S)
    [held] = results
    assert held.error_kind is ErrorKind.PENDING_APPROVAL
    monkeypatch.undo()
    again = system.start_loop("s")
    assert [p.call_id for p in again.pending()] == ["c1"]
    assert again.approve("c1").content == "wiped /a" and RAN == ["/a"]


@pytest.mark.parametrize("name", ["wipe", "wipe_later"])
def test_an_approval_in_the_host_that_finds_one_from_another_process_acts_on_that_one(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """``rho-actors approve`` wins (its record first) and ``loop.approve`` in the host
    comes before the host's own look at the transcript found it (forced: no look is
    made): the host's approval is refused naming the first decision, and the call runs
    once, as that decision says (before: the refusal also dropped the call from the
    host's pending ones, so no look ever acted on the decision: it never ran, its waiter
    and, for a background tool, its task ``input_required`` for good)."""
    from rho_actors import ApprovalError
    from rho_actors.loop.approvals import SessionApprovals

    RAN.clear()
    system.register(wipe)
    system.register(wipe_later)
    monkeypatch.setattr(SessionApprovals, "_watch", lambda self: None)  # the host never looks by itself
    loop = system.start_loop("s")
    [held] = loop.run_turn([ToolCall("c1", name, '{"path": "/a"}')])
    decide(system.data_dir, "s", "c1", "approved", decided_by="ann")
    with pytest.raises(ApprovalError, match="decided already: it was approved by ann"):
        loop.approve("c1", decided_by="host")
    if name == "wipe":
        assert loop.when_decided("c1").result(WAIT_S).content == "wiped /a"
    else:
        registry, folder = system.task_registry, system.data_dir / "sessions" / "s"
        assert registry.wait("s", folder, held.details["task_id"], WAIT_S).status == "completed"
    assert RAN == ["/a"] and loop.pending() == []
