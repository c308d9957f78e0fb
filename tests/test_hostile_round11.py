"""Hostile round 11: interrupts (a signal handler's ``KeyboardInterrupt`` in the host's
thread) while a turn is prepared and while a held call is approved.

Broke, fixed here:

- An interrupt while ``Turns.submit`` made or prepared a turn (before its admission:
  looking up, validating, holding calls for approval, a policy's own code) left the turn
  unanswered for good (it was in no table the stop answers), and the calls its
  preparing had held waited for a person: approved, they ran for a turn the host never
  got. Now the turn is answered ``turn_interrupted``, every call once, and what it held
  is let go (``SessionApprovals.hold`` lets go of what it registered when interrupted
  inside).
- An interrupt while ``approve`` waited for the approved call's result: the call ran on,
  but its result was never recorded: it stayed in flight for good, ``when_decided``
  never answered, the transcript never got it. Now the turn's result is recorded when
  it comes, whoever waits (the approval's ``_Once``).

Broke elsewhere this round, fixed with its own tests: a tool's progress to an MCP
client that stopped reading its SSE stream (a task and a message per report on the
server's loop: ``test_progress_coalesced``); a stopping HTTP server held by a client
taking a little at a time (``test_mcp_slow_readers``, ``STOPPING_DRAIN_S``).

Held (no change): against ``mcp serve --http`` on loopback with 1 s bounds, a complete
request pipelined with part of a second (the header bound runs from the first
response's end), a chunked body dribbled a chunk at a time and endless trailers (the
body bound, whole), a kept-alive connection's second request dribbled after a first
answered (the header bound from its first byte), 800 repeated ``Last-Event-ID`` headers
(``400`` in 7 ms; h11's 16 KiB head bound caps the count), a client past its connection
share (``503`` before anything is read, its count back at each close); ``kill -9`` of
every worker again and again while calls of 8 sessions run and while ``system.stop()``
runs (every call answered once, the stop within its bound, no process left). A spare
killed right after it was ready takes its next call with it (answered ``crashed``,
naming the signal from outside; the call is not sent to another worker, as the pool
cannot tell whether the worker read it): left as is."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ApprovalError, CallEvent, ToolCall, tool
from rho_actors.loop import turn_holds
from rho_actors.loop.approvals import SessionApprovals
from rho_actors.loop.turns import Turns
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(120)

STARTED = threading.Event()
RELEASE = threading.Event()
RAN: list[str] = []


@tool(requires_approval=True)
def delete(path: str) -> str:
    """Delete a file."""
    RAN.append(path)
    return f"deleted {path}"


@tool(requires_approval=True)
def slow_delete(path: str) -> str:
    """Delete a file, slowly."""
    STARTED.set()
    RELEASE.wait(WAIT_S)
    RAN.append(path)
    return f"deleted {path}"


@tool
def look(path: str) -> str:
    """Look at a file."""
    return f"looked at {path}"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    STARTED.clear()
    RELEASE.clear()
    RAN.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        for one in (delete, slow_delete, look):
            system.register(one)
        yield system
    finally:
        RELEASE.set()
        system.stop()


def _finished(system: ActorSystem) -> list[CallEvent]:
    seen: list[CallEvent] = []
    system.subscribe(lambda e: seen.append(e) if isinstance(e, CallEvent) and e.kind == "finished" else None)
    return seen


def _grab_futures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The futures of the turns submitted from now on (the interrupted host never gets one)."""
    futures: list[Any] = []
    real = Turns.submit

    def submit(self: Turns, calls: Any, future: Any, **kwargs: Any) -> Any:
        futures.append(future)
        return real(self, calls, future, **kwargs)

    monkeypatch.setattr(Turns, "submit", submit)
    return futures


BATCH = [ToolCall("c1", "delete", '{"path": "/a"}'), ToolCall("c2", "look", '{"path": "/a"}'),
         ToolCall("c3", "delete", '{"path": "/b"}')]


def _interrupt_in_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Turns._prepare

    def prepare(self: Turns, slot: Any, *args: Any) -> Any:
        if slot.call.id == "c3":
            raise KeyboardInterrupt
        return real(self, slot, *args)

    monkeypatch.setattr(Turns, "_prepare", prepare)


def _interrupt_as_hold_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    real = SessionApprovals._watch
    calls = [0]

    def watch(self: SessionApprovals) -> None:
        real(self)
        calls[0] += 1
        if calls[0] == 2:  # the second call held (c3): c1 is registered already
            raise KeyboardInterrupt

    monkeypatch.setattr(SessionApprovals, "_watch", watch)


def _interrupt_as_turns_takes_the_held(monkeypatch: pytest.MonkeyPatch) -> None:
    def runs_as_task(*args: Any) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(turn_holds, "runs_as_task", runs_as_task)


@pytest.mark.parametrize("where", [_interrupt_in_prepare, _interrupt_as_hold_registers,
                                   _interrupt_as_turns_takes_the_held],
                         ids=["preparing a call", "holding calls", "taking the held calls"])
def test_an_interrupt_while_a_turn_is_prepared_answers_it_and_holds_nothing(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, where: Any) -> None:
    """Before: the turn's future was never set (not even by the session's stop) and, held
    before the interrupt, ``c1`` waited for a person; approved, it ran."""
    loop = system.start_loop("s")
    loop.run_turn([ToolCall("warm", "look", '{"path": "/w"}')])
    seen = _finished(system)
    futures = _grab_futures(monkeypatch)
    where(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        loop.submit_turn(BATCH)
    monkeypatch.undo()
    results = futures[0].result(WAIT_S)
    assert [r.call_id for r in results] == ["c1", "c2", "c3"]
    for result in results:
        assert result.error_kind is ErrorKind.CANCELLED and "KeyboardInterrupt" in result.content, result
    assert sorted(e.call_id for e in seen) == ["c1", "c2", "c3"]
    assert loop.pending() == []
    with pytest.raises(ApprovalError, match="no call 'c1' waits"):
        loop.approve("c1")
    assert RAN == []
    again = loop.run_turn(BATCH)  # the same ids: none of them is taken as pending still
    assert [r.error_kind for r in again] == [ErrorKind.PENDING_APPROVAL, None, ErrorKind.PENDING_APPROVAL]
    assert loop.approve("c1").content == "deleted /a" and RAN == ["/a"]


def test_an_interrupt_while_approve_waits_still_records_the_calls_one_result(system: ActorSystem) -> None:
    """A signal (SIGINT) reaches the host's thread once the approved call started, while
    ``approve`` waits for it (the call runs on) or still starts its turn (answered
    ``turn_interrupted`` at once). Before, either way: its result was never recorded, the
    call stayed in flight for good and ``when_decided`` was never answered."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers interrupt the main thread only: the test runs there")
    loop = system.start_loop("s")
    [held] = loop.run_turn([ToolCall("c1", "slow_delete", '{"path": "/a"}')])
    assert held.error_kind is ErrorKind.PENDING_APPROVAL
    decided = loop.when_decided("c1")
    main = threading.main_thread().ident
    assert main is not None

    stop_sending = threading.Event()

    def interrupt() -> None:  # again each second: a KeyboardInterrupt raised in a gc callback is dropped
        if STARTED.wait(WAIT_S):
            while not stop_sending.is_set():
                signal.pthread_kill(main, signal.SIGINT)
                stop_sending.wait(1.0)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.approve("c1")
    finally:
        stop_sending.set()
        signal.signal(signal.SIGINT, lambda signum, frame: None)  # one sent meanwhile: taken, not raised
        sender.join(WAIT_S)
        signal.signal(signal.SIGINT, previous)
    RELEASE.set()
    result = decided.result(WAIT_S)
    if result.ok:  # the signal came as approve waited: the call ran on, its result recorded when it came
        assert result.content == "deleted /a" and RAN == ["/a"]
    else:  # it came while approve was still starting the call's turn: that turn was answered at once
        assert result.error_kind is ErrorKind.CANCELLED and "interrupted" in result.content, result
    assert wait_for(lambda: loop._approvals().in_flight() == [])
    with pytest.raises(ApprovalError, match="decided already"):
        loop.approve("c1")
