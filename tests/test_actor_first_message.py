"""An actor with ``starts_on_first_message`` takes its thread at its first message, and
``otp.actor.stop`` of one that has had none ends it in the stopping thread, every hook
run in order; a session's LoopActor is one (its turns need no message)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.otp.actor import NORMAL, Actor, kill, monitor, stop
from rho_actors.otp.threads import ThreadPool
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(60)


class Lazy(Actor):
    starts_on_first_message = True

    def __init__(self, log: list[tuple[str, int]], pool: ThreadPool | None = None,
                 exited: threading.Event | None = None) -> None:
        super().__init__()
        self.log = log
        self.thread_pool = pool
        self.exited = exited

    def on_start(self) -> None:
        self.log.append(("start", threading.get_ident()))

    def on_receive(self, message: Any) -> Any:
        self.log.append((f"got {message}", threading.get_ident()))
        return message

    def on_stop(self) -> None:
        self.log.append(("stop", threading.get_ident()))

    def on_exit(self, reason: object) -> None:
        self.log.append((f"exit {reason}", threading.get_ident()))
        if self.exited is not None:
            self.exited.set()


def test_no_thread_is_taken_before_the_first_message() -> None:
    pool = ThreadPool()
    log: list[tuple[str, int]] = []
    ref = Lazy.start(log, pool)
    try:
        assert ref.is_alive() and log == [] and pool.threads_started == 0
        assert ref.ask("hello", timeout=WAIT_S) == "hello"
        assert [entry for entry, _ in log] == ["start", "got hello"]
        assert pool.threads_started == 1 and log[0][1] != threading.get_ident()  # on a thread of its own
        assert stop(ref, WAIT_S) is True  # it has a thread now: stopped there, as ref.stop() does
        assert [entry for entry, _ in log][2:] == ["stop", "exit normal"] and log[2][1] == log[0][1]
    finally:
        pool.shutdown()


def test_stop_before_any_message_runs_every_hook_in_the_stopping_thread() -> None:
    log: list[tuple[str, int]] = []
    ref = Lazy.start(log)
    downs: list[object] = []
    monitor(ref, lambda _ref, reason: downs.append(reason))
    assert stop(ref, WAIT_S) is True
    here = threading.get_ident()
    assert log == [("start", here), ("stop", here), (f"exit {NORMAL}", here)]
    assert downs == [NORMAL] and not ref.is_alive()
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("late")
    assert stop(ref, WAIT_S) is False  # already stopped: left as it is


class InterruptedOnStop(Lazy):
    def on_stop(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the stop runs in the host's thread
        super().on_stop()


def test_ctrl_c_during_a_stop_in_the_main_thread_reaches_the_host_after_a_normal_end() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Python runs signal handlers in the main thread only")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not raise KeyboardInterrupt in this process")
    log: list[tuple[str, int]] = []
    ref = InterruptedOnStop.start(log)
    downs: list[object] = []
    monitor(ref, lambda _ref, reason: downs.append(reason))
    with pytest.raises(KeyboardInterrupt):
        stop(ref, WAIT_S)
    assert downs == [NORMAL]  # not taken for a crash of the actor (which a supervisor would restart)
    assert [entry for entry, _ in log] == ["start", "stop", "exit normal"]


def test_a_kill_as_first_message_ends_it_with_that_reason() -> None:
    log: list[tuple[str, int]] = []
    exited = threading.Event()
    ref = Lazy.start(log, exited=exited)
    ended = concurrent.futures.Future[object]()
    monitor(ref, lambda _ref, reason: ended.set_result(reason))
    kill(ref, "boom")
    assert ended.result(WAIT_S) == "boom" and exited.wait(WAIT_S)
    assert [entry for entry, _ in log] == ["start", "stop", "exit boom"]
    assert log[0][1] != threading.get_ident()  # the kill took a thread: the stopping thread ran nothing


def _ask_when_told(ref: pykka.ActorRef[Any], go: threading.Barrier, outcomes: list[str]) -> None:
    go.wait(WAIT_S)
    try:
        outcomes.append(str(ref.ask("q", timeout=WAIT_S)))
    except pykka.ActorDeadError:
        outcomes.append("dead")


def test_messages_racing_a_stop_are_each_answered_or_refused() -> None:
    for _ in range(50):
        log: list[tuple[str, int]] = []
        ref = Lazy.start(log)
        go = threading.Barrier(2)
        outcomes: list[str] = []
        asker = threading.Thread(target=_ask_when_told, args=(ref, go, outcomes))
        asker.start()
        go.wait(WAIT_S)
        stop(ref, WAIT_S)
        asker.join(WAIT_S)
        assert not asker.is_alive() and outcomes in (["q"], ["dead"])  # never lost, never hung
        assert [e for e, _ in log][-2:] == ["stop", "exit normal"]


@tool(timeout_ms=int(WAIT_S * 1000))
def held(ctx: Mapping[str, Any]) -> str:
    """Wait until cancelled."""
    ctx["cancel"].wait(WAIT_S)
    return "cancelled"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        system.register(held)
        yield system
    finally:
        system.stop()


def test_a_loop_stopped_with_a_call_running_answers_it_and_ends_normally(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    future = loop.submit_turn([ToolCall("c1", "held", "{}")])
    loop.stop()
    [result] = future.result(WAIT_S)
    assert result.error_kind == ErrorKind.CANCELLED and "the session stopped" in result.content
    assert loop.exit_reason == NORMAL and not loop.alive
    sessions = next(c for c in system.tree()["children"] if c["id"] == "sessions")
    assert [c["id"] for c in sessions["children"]] == []  # its subtree ended with it
    with pytest.raises(pykka.ActorDeadError):
        loop.run_turn([ToolCall("c2", "held", "{}")])


def test_an_actor_is_in_pykkas_registry_while_it_lives_and_its_start_and_stop_format_no_text_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pykka's own start and unregister format the actor's text for debug lines on every
    start and stop, logged or not; an Actor's keep the registry without them."""
    formatted: list[str] = []
    plain_str = pykka.ActorRef.__str__

    def ref_text(ref: pykka.ActorRef[Any]) -> str:
        formatted.append("ref")
        return plain_str(ref)

    def actor_text(actor: Lazy) -> str:
        formatted.append("actor")
        return "Lazy"

    monkeypatch.setattr(pykka.ActorRef, "__str__", ref_text)
    monkeypatch.setattr(Lazy, "__str__", actor_text)
    log: list[tuple[str, int]] = []
    ref = Lazy.start(log)
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is ref
    assert stop(ref, WAIT_S) is True
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None
    threaded = Lazy.start(log)
    assert threaded.ask("hello", timeout=WAIT_S) == "hello"
    assert pykka.ActorRegistry.get_by_urn(threaded.actor_urn) is threaded
    assert stop(threaded, WAIT_S) is True
    assert pykka.ActorRegistry.get_by_urn(threaded.actor_urn) is None
    assert formatted == []


def test_only_a_rho_actor_can_be_monitored() -> None:
    class Plain(pykka.ThreadingActor):
        pass

    ref = Plain.start()
    try:
        with pytest.raises(TypeError, match="it cannot be monitored"):
            monitor(ref, lambda r, reason: None)
    finally:
        ref.stop()
