"""An interrupt in the host's thread while it starts a turn (the ``KeyboardInterrupt`` a
signal handler raises between any two bytecodes): the turn, admitted already, is ended at
once (each call without a result answered ``turn_interrupted``, a running one cancelled)
and the interrupt goes on to the host. Before, such a turn stayed open, its calls
unanswered, until the session stopped (``session_stopped`` then, long after)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, ToolCall, tool
from rho_actors.loop.turns import Turns
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(120)

STARTED = threading.Event()


@tool(timeout_ms=int(WAIT_S * 1000))
def hold(ctx: Mapping[str, Any]) -> str:
    """Wait until cancelled."""
    STARTED.set()
    return "cancelled" if ctx["cancel"].wait(WAIT_S) else "never cancelled"


@tool
def echo(text: str) -> str:
    """Say ``text``."""
    return text


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    STARTED.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        system.register(hold)
        system.register(echo)
        yield system
    finally:
        system.stop()


def _finished(system: ActorSystem) -> tuple[list[CallEvent], threading.Event]:
    """The ``finished`` call events the system emits from now on, and an event set at each."""
    seen: list[CallEvent] = []
    came = threading.Event()

    def take(event: object) -> None:
        if isinstance(event, CallEvent) and event.kind == "finished":
            seen.append(event)
            came.set()

    system.subscribe(take)
    return seen, came


@pytest.mark.parametrize("calls", [1, 3], ids=["one call", "three calls"])
def test_an_interrupt_before_a_call_starts_answers_the_turn_at_once(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch, calls: int
) -> None:
    """The interrupt comes as the turn's first call is dispatched: the host gets it, every
    call of the turn is answered ``turn_interrupted`` at once (not when the session
    stops), none of them runs, and the next turn runs as usual."""
    loop = system.start_loop("s")
    loop.run_turn([ToolCall("warm", "echo", '{"text": "warm"}')])  # the folder made: the one-call path too
    seen, came = _finished(system)
    real = Turns._dispatch

    futures: list[Any] = []

    def interrupted(self: Turns, turn: Any, index: int, *admit: bool) -> bool:  # (a one-call turn: admitted in it)
        futures.append(turn.future)  # the turn's results, which the interrupted host never got
        raise KeyboardInterrupt

    monkeypatch.setattr(Turns, "_dispatch", interrupted)
    batch = [ToolCall(f"c{i}", "echo", f'{{"text": "{i}"}}') for i in range(calls)]
    with pytest.raises(KeyboardInterrupt):
        loop.submit_turn(batch)
    monkeypatch.setattr(Turns, "_dispatch", real)
    assert came.wait(WAIT_S)
    assert sorted(e.call_id for e in seen) == [c.id for c in batch], seen
    assert {e.outcome for e in seen} == {"cancelled"}
    results = futures[0].result(WAIT_S)
    assert [r.call_id for r in results] == [c.id for c in batch]
    for result in results:
        assert result.error_kind is ErrorKind.CANCELLED
        assert "interrupted as it started this turn (KeyboardInterrupt" in result.content, result.content
    assert loop.running() == []
    assert loop.run_turn([ToolCall("next", "echo", '{"text": "next"}')])[0].content == "next"
    loop.stop()
    assert sorted(e.call_id for e in seen) == [c.id for c in batch] + ["next"]  # none answered again at the stop


def test_an_interrupt_after_a_call_started_cancels_it(system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interrupt comes right after the turn's one call was started (its dispatch
    returned): the running call is cancelled (its ``ctx["cancel"]`` set) and answered
    ``turn_interrupted``, once."""
    loop = system.start_loop("s")
    loop.run_turn([ToolCall("warm", "echo", '{"text": "warm"}')])
    seen, came = _finished(system)
    real = Turns._dispatch

    futures: list[Any] = []

    def then_interrupted(self: Turns, turn: Any, index: int, *admit: bool) -> bool:
        futures.append(turn.future)
        assert real(self, turn, index, *admit)
        assert STARTED.wait(WAIT_S)
        raise KeyboardInterrupt

    monkeypatch.setattr(Turns, "_dispatch", then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        loop.submit_turn([ToolCall("h", "hold", "{}")])
    monkeypatch.setattr(Turns, "_dispatch", real)
    assert came.wait(WAIT_S)
    assert [(e.call_id, e.outcome) for e in seen] == [("h", "cancelled")]
    (result,) = futures[0].result(WAIT_S)
    assert "interrupted as it started this turn" in result.content, result.content
    assert loop.running() == []
    loop.stop()
    assert [e.call_id for e in seen] == ["h"]  # the cancelled call's own return is late, not a second result
