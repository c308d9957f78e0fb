"""``Loop.stop`` of a session whose LoopActor never took a thread (its turns need no
message) ends it in the stopping thread, through the session's lazy subtree: no pooled
thread is woken to run its stop, every hook still runs, the subtree is forgotten. A loop
that got a message is stopped by its own thread as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.loop.actor import LoopActor
from rho_actors.loop.messages import Running
from rho_actors.otp.actor import NORMAL
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(60)

release = threading.Event()


@tool(name="waits", timeout_ms=30_000)
def waits(ctx: Any) -> str:
    """Returns once released or cancelled."""
    while not release.wait(0.01):
        if ctx["cancel"].cancelled:
            return "cancelled"
    return "released"


@pytest.fixture
def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ActorSystem, list[int]]]:
    stopped_in: list[int] = []
    original = LoopActor.on_stop

    def on_stop(self: LoopActor) -> None:
        stopped_in.append(threading.get_ident())
        original(self)

    monkeypatch.setattr(LoopActor, "on_stop", on_stop)
    release.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        system.register(waits)
        yield system, stopped_in
    finally:
        release.set()
        system.stop()


def sessions_of(system: ActorSystem) -> list[str]:
    sessions = next(c for c in system.tree()["children"] if c["id"] == "sessions")
    return [c["id"] for c in sessions["children"]]


def test_a_loop_without_messages_is_stopped_in_the_stopping_thread(system: tuple[ActorSystem, list[int]]) -> None:
    sys_, stopped_in = system
    loop = sys_.start_loop("quiet")
    assert sessions_of(sys_) == ["quiet"]
    loop.stop()
    assert stopped_in == [threading.get_ident()]
    assert loop.exit_reason == NORMAL and not loop.alive
    assert sessions_of(sys_) == []
    again = sys_.start_loop("quiet")  # its name and id are free again
    again.stop()
    assert len(stopped_in) == 2


def test_a_call_running_at_the_stop_is_answered_and_the_stop_runs_here(system: tuple[ActorSystem, list[int]]) -> None:
    sys_, stopped_in = system
    loop = sys_.start_loop("busy")
    future = loop.submit_turn([ToolCall("c1", "waits", "{}")])
    done: list[int] = []

    def stop_from_a_thread() -> None:
        loop.stop()
        done.append(threading.get_ident())

    stopper = threading.Thread(target=stop_from_a_thread)
    stopper.start()
    stopper.join(WAIT_S)
    [result] = future.result(WAIT_S)
    assert not stopper.is_alive() and stopped_in == done  # ended in the (non-main) stopping thread
    assert result.error_kind == ErrorKind.CANCELLED and "the session stopped" in result.content
    assert loop.exit_reason == NORMAL and sessions_of(sys_) == []


def test_a_loop_that_got_a_message_is_stopped_by_its_own_thread(system: tuple[ActorSystem, list[int]]) -> None:
    sys_, stopped_in = system
    loop = sys_.start_loop("told")
    assert loop.ref.ask(Running(), timeout=WAIT_S) == []  # its first message: it takes a thread
    loop.stop()
    assert len(stopped_in) == 1 and stopped_in[0] != threading.get_ident()
    assert loop.exit_reason == NORMAL and not loop.alive
    assert sessions_of(sys_) == []
