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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, Deferred, ToolCall, tool
from rho_actors.loop.approvals import SessionApprovals
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S

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
