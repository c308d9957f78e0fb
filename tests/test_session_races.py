"""A session's life racing itself: a stop racing a crash of a lazy or woken session, a
stop while its supervisor wakes, a turn submitted while its loop restarts, a stop from the
session's own supervisor report, a session given up and started again, crash storms in
many sessions, a lazy loop stopped or killed as it starts, a tool stopping the system."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka

from rho_actors import (
    ActorSystem,
    ErrorKind,
    Loop,
    RestartIntensityExceeded,
    SupervisorEvent,
    ToolCall,
    kill,
    tool,
)
from rho_actors.loop.messages import loop_name
from rho_actors.otp.actor import stop

from .conftest import WAIT_S, slack, supervisors_labelled, wait_for
from .helpers import echo, echoed


def _sessions(system: ActorSystem) -> list[str]:
    node = next(c for c in system.tree()["children"] if c["id"] == "sessions")
    return [s["id"] for s in node["children"]]


def test_a_stop_racing_a_crash_of_a_lazy_loop_ends_the_session(tmp_path: Path) -> None:
    """Before: the kill landed first, the stop met a dead loop and returned, and the
    session's supervisor woke up and restarted the loop: the stopped session ran on
    (50 of 50 tries), and start_loop of its id was refused as already started."""
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(echo)
        for i in range(5):
            loop = system.start_loop(f"s{i}")
            kill(loop.ref)  # told first: the loop ends killed, not stopped
            loop.stop()
            assert not loop.alive
            assert f"s{i}" not in _sessions(system)
            again = system.start_loop(f"s{i}")  # its id is free at once
            assert echoed(again, "x") == "x"
            assert _sessions(system).count(f"s{i}") == 1
            again.stop()


def test_a_stop_racing_a_crash_of_a_woken_session_ends_it(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, max_restarts=10, max_seconds=60) as system:
        system.register(echo)
        loop = system.start_loop("w")
        first = loop.ref
        kill(first)
        assert wait_for(lambda: loop.alive and loop.ref is not first)  # its supervisor runs now
        assert len(supervisors_labelled("session:w")) == 1
        kill(loop.ref)
        loop.stop()
        assert wait_for(lambda: supervisors_labelled("session:w") == [])
        assert not loop.alive and "w" not in _sessions(system)
        assert echoed(system.start_loop("w"), "back") == "back"


def test_a_stop_while_the_sessions_supervisor_is_being_woken_stops_it_once_woken(tmp_path: Path) -> None:
    """The stop comes while ``sessions`` is starting the session's supervisor (from its
    ``crashed`` report, sent by that supervisor's start): once started it is stopped,
    never left running outside the tree."""
    with ActorSystem(data_dir=tmp_path, shutdown_ms=200) as system:
        system.register(echo)
        loop = system.start_loop("r")
        stopped = threading.Event()

        def on_report(event: object) -> None:
            if isinstance(event, SupervisorEvent) and event.supervisor == "session:r" and event.kind == "crashed":
                loop.stop(timeout_s=0.2)  # its supervisor is mid-start: the wait is cut at 0.2 s
                stopped.set()

        system.subscribe(on_report)
        kill(loop.ref)
        assert stopped.wait(WAIT_S)
        assert wait_for(lambda: supervisors_labelled("session:r") == [])
        assert wait_for(lambda: not loop.alive)
        assert "r" not in _sessions(system)
        assert echoed(system.start_loop("r"), "again") == "again"


def test_a_turn_submitted_while_its_loop_restarts_waits_for_the_restart(tmp_path: Path) -> None:
    """Before: a turn submitted between the crash and the restart raised NotRunningError
    ("may be restarting"; 158 of 200 turns right after a kill), so its call ids got no
    result. The restart is held back here (the session supervisor's ``crashed`` report
    is sent before it restarts the loop) for the turn to meet the gap."""
    with ActorSystem(data_dir=tmp_path, max_restarts=10, max_seconds=60) as system:
        system.register(echo)
        loop = system.start_loop("g")
        entered, release = threading.Event(), threading.Event()

        def on_report(event: object) -> None:
            if isinstance(event, SupervisorEvent) and event.supervisor == "session:g" and event.kind == "crashed":
                entered.set()
                release.wait(WAIT_S)  # holds the restart back: the turn below meets the gap

        system.subscribe(on_report)
        kill(loop.ref)
        assert entered.wait(WAIT_S)
        assert not loop.alive
        # the restart goes on 0.3 s later, while the turn below waits for it (a longer hold would eat into the
        # loop's own RESTART_PATIENCE_S, 5 s, which the restart on a loaded machine needs)
        threading.Timer(0.3, release.set).start()
        assert echoed(loop, "after") == "after"  # it waited for the restarted loop
        loop.stop()
        began = time.monotonic()
        try:
            loop.run_turn([ToolCall("x", "echo", '{"text": "x"}')], timeout_s=WAIT_S)
            raise AssertionError("a stopped loop ran a turn")
        except pykka.ActorDeadError as exc:
            assert "it was stopped" in str(exc)
        assert time.monotonic() - began < slack(1.0)  # a stopped loop is not waited for


def _restarted(loop: Loop, before: pykka.ActorRef[Any]) -> bool:
    return loop.alive and loop.ref is not before


def test_names_withheld_by_set_withheld_stay_withheld_after_a_restart(tmp_path: Path) -> None:
    """Before: the restarted loop started with the names given to start_loop, so a tool
    the host had withheld since was offered again, and ran, after a crash."""

    @tool
    def danger() -> str:
        """Something the host stopped offering."""
        return "ran"

    with ActorSystem(data_dir=tmp_path, max_restarts=10, max_seconds=60) as system:
        system.register(echo)
        system.register(danger)
        loop = system.start_loop("w", withheld=["echo"])
        loop.set_withheld(["danger"])
        for _ in range(2):  # the lazy subtree's first crash, then one its supervisor restarts
            first = loop.ref
            kill(first)
            assert wait_for(functools.partial(_restarted, loop, first))
            [result] = loop.run_turn([ToolCall("d", "danger", "{}")], timeout_s=WAIT_S)
            assert result.error_kind is ErrorKind.WITHHELD, result
            assert [info.name for info in loop.offered()] == ["echo"]
        loop.set_withheld([])
        kill(loop.ref)
        loop.set_withheld(["echo"])  # meets the crash: given to the restarted loop
        assert [info.name for info in loop.offered()] == ["danger"]


def test_a_stop_from_the_sessions_own_supervisor_report_returns_at_once(tmp_path: Path) -> None:
    """A subscriber stopping a session on its ``restarted`` report runs in that session's
    supervisor's thread: the stop must not wait for the supervisor it is holding."""
    with ActorSystem(data_dir=tmp_path, max_restarts=10, max_seconds=60, shutdown_ms=2_000) as system:
        system.register(echo)
        loop = system.start_loop("o")
        took: list[float] = []
        done = threading.Event()

        def on_report(event: object) -> None:
            if isinstance(event, SupervisorEvent) and event.supervisor == "session:o" and event.kind == "restarted":
                began = time.monotonic()
                loop.stop()
                took.append(time.monotonic() - began)
                done.set()

        system.subscribe(on_report)
        kill(loop.ref)
        assert done.wait(WAIT_S)
        assert took[0] < slack(1.0)  # its shutdown bound is 3 s
        # the supervisor counts as gone from the start of its stop, its on_stop still stopping the loop
        assert wait_for(lambda: supervisors_labelled("session:o") == [] and not loop.alive)
        assert "o" not in _sessions(system)
        assert echoed(system.start_loop("o"), "again") == "again"


def test_the_tree_shows_a_lazy_session_whose_loop_crashed_as_a_woken_one_restarting(tmp_path: Path) -> None:
    """Between its loop's crash and the wake-up a lazy session read ``alive: False``, as
    if it were gone, where a woken session restarting its loop reads ``alive: True``
    with the loop not alive. ``sessions`` is held in another session's wake-up (its
    ``crashed`` report) while the children are asked for and the loop is killed, so the
    answer is given between the crash and the wake-up."""
    with ActorSystem(data_dir=tmp_path, max_restarts=10, max_seconds=60) as system:
        a, b = system.start_loop("a"), system.start_loop("b")
        entered, release = threading.Event(), threading.Event()

        def on_report(event: object) -> None:
            if isinstance(event, SupervisorEvent) and event.supervisor == "session:b" and event.kind == "crashed":
                entered.set()
                release.wait(WAIT_S)

        system.subscribe(on_report)
        sessions = system.whereis("sessions")
        assert sessions is not None
        kill(b.ref)
        assert entered.wait(WAIT_S)  # sessions waits for b's supervisor to start
        asked = sessions.proxy().which_children()
        kill(a.ref)
        assert wait_for(lambda: a.exit_reason == "killed")
        release.set()
        children = {c.id: c for c in asked.get(timeout=WAIT_S)}
        node = children["a"]
        assert node.alive and node.children is not None
        [inner] = node.children
        assert (inner.id, inner.alive) == ("loop", False)
        assert wait_for(lambda: a.alive and b.alive)
        tree = {s_["id"]: s_ for s_ in next(c for c in system.tree()["children"] if c["id"] == "sessions")["children"]}
        assert tree["a"]["alive"] and tree["a"]["children"][0]["alive"]


def test_a_session_given_up_can_start_again_from_the_gave_up_report(tmp_path: Path) -> None:
    """Before: its id stayed held until the given-up supervisor's end was seen, so a host
    starting the session again on ``gave_up`` got ``already started``."""
    for intensity in (0, 1):
        with ActorSystem(data_dir=tmp_path / str(intensity), max_restarts=intensity, max_seconds=60) as system:
            system.register(echo)
            started: list[object] = []
            done = threading.Event()

            def on_report(event: object, system: ActorSystem = system, started: list[object] = started,
                          done: threading.Event = done) -> None:
                if isinstance(event, SupervisorEvent) and event.supervisor == "session:v" and event.kind == "gave_up":
                    try:
                        started.append(system.start_loop("v"))
                    except Exception as exc:
                        started.append(exc)
                    done.set()

            system.subscribe(on_report)
            loop = system.start_loop("v")
            healthy = system.start_loop("ok")
            while not done.is_set():
                try:
                    kill(loop.ref)
                except pykka.ActorDeadError:  # being restarted
                    pass
                done.wait(0.01)
            [again] = started
            assert isinstance(again, Loop), again
            assert echoed(again, "new") == "new"
            assert echoed(healthy, "still") == "still"
            assert wait_for(lambda: sorted(_sessions(system)) == ["ok", "v"])


class _Reports:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str]] = []

    def __call__(self, event: object) -> None:
        if isinstance(event, SupervisorEvent):
            with self.lock:
                self.seen.append((event.supervisor, event.kind))

    def kinds(self, label: str) -> list[str]:
        with self.lock:
            return [kind for supervisor, kind in self.seen if supervisor == label]


def test_crash_storms_in_many_sessions_give_each_up_alone(tmp_path: Path) -> None:
    release = threading.Event()

    @tool(timeout_ms=int(WAIT_S * 1000))
    def held(i: int) -> int:
        """Wait for the test."""
        release.wait(WAIT_S)
        return i

    reports = _Reports()
    with ActorSystem(data_dir=tmp_path, max_restarts=2, max_seconds=60, shutdown_ms=300) as system:
        system.subscribe(reports)
        system.register(held)
        system.register(echo)
        loops = [system.start_loop(f"c{i}") for i in range(12)]
        healthy = system.start_loop("healthy")
        turns = [loop.submit_turn([ToolCall(f"h{i}", "held", f'{{"i": {i}}}')]) for i, loop in enumerate(loops)]
        trees: list[list[str]] = []
        stop_tree = threading.Event()

        def read_trees() -> None:
            while not stop_tree.is_set():
                trees.append(_sessions(system))

        def storm(loop: Loop) -> None:
            until = time.monotonic() + WAIT_S
            while not isinstance(loop.exit_reason, RestartIntensityExceeded) and time.monotonic() < until:
                try:
                    kill(loop.ref)
                except pykka.ActorDeadError:
                    time.sleep(0.001)  # being restarted

        reader = threading.Thread(target=read_trees)
        reader.start()
        stormers = [threading.Thread(target=storm, args=(loop,)) for loop in loops]
        for thread in stormers:
            thread.start()
        for thread in stormers:
            thread.join(WAIT_S)
        stop_tree.set()
        reader.join(WAIT_S)
        assert all(isinstance(loop.exit_reason, RestartIntensityExceeded) for loop in loops)
        for i, turn in enumerate(turns):
            [result] = turn.result(WAIT_S)
            assert result.call_id == f"h{i}" and result.error_kind is ErrorKind.CRASHED  # loop_crashed
        assert echoed(healthy, "fine") == "fine"
        assert wait_for(lambda: _sessions(system) == ["healthy"])
        assert all("healthy" in seen for seen in trees)
        for i in range(12):
            assert reports.kinds(f"session:c{i}").count("gave_up") == 1
            assert reports.kinds(f"session:c{i}").count("restarted") == 2
        assert reports.kinds("session:healthy") == ["started"]
        release.set()


def test_a_tool_stopping_the_system_is_not_waited_for_by_that_stop(tmp_path: Path) -> None:
    """Before: the stop waited the whole ``shutdown_ms`` for the call thread it was
    running on, which could only return once that stop had."""
    systems: list[ActorSystem] = []
    took: list[float] = []

    @tool(timeout_ms=int(WAIT_S * 1000))
    def quit_all() -> str:
        """Stop the whole system."""
        began = time.monotonic()
        systems[0].stop()
        took.append(time.monotonic() - began)
        return "stopped"

    system = ActorSystem(data_dir=tmp_path, shutdown_ms=5_000)
    systems.append(system)
    try:
        system.register(quit_all)
        [result] = system.start_loop("q").run_turn([ToolCall("q", "quit_all", "{}")], timeout_s=WAIT_S)
        assert result.error_kind is ErrorKind.CANCELLED  # session_stopped: the system stopped under it
        assert wait_for(lambda: bool(took))
        assert took[0] < slack(2.5) and system.stopped
    finally:
        system.stop()


def _ended_as_registered(system: ActorSystem, session_id: str, end: Callable[[pykka.ActorRef[Any]], object]) -> None:
    """Make the system's next registration of ``session_id``'s loop name run ``end`` on
    the new loop at once (another thread that found it by name, before its start was
    over)."""
    names = system._names
    register = names.register

    def ending(name: str, ref: pykka.ActorRef[Any]) -> None:
        register(name, ref)
        if name == loop_name(session_id):
            names.register = register  # type: ignore[method-assign]
            end(ref)

    names.register = ending  # type: ignore[method-assign]


def _settled(system: ActorSystem) -> None:
    system.tree()  # the sessions supervisor has handled what it was told before (a wake-up)


def test_a_lazy_loop_stopped_as_it_starts_stays_stopped(tmp_path: Path) -> None:
    """Before: the stop came before the loop was watched, its monitor said ``noproc``,
    taken for a crash: the session's supervisor woke up and brought the stopped session
    back."""
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(echo)
        _ended_as_registered(system, "x", lambda ref: stop(ref, WAIT_S))
        loop = system.start_loop("x")
        _settled(system)
        assert supervisors_labelled("session:x") == []
        assert not loop.alive and loop.exit_reason == "normal"
        assert "x" not in _sessions(system)
        assert echoed(system.start_loop("x"), "again") == "again"  # its id is free


def test_a_lazy_loop_killed_as_it_starts_is_restarted(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(echo)
        _ended_as_registered(system, "k", kill)
        loop = system.start_loop("k")
        assert wait_for(lambda: len(supervisors_labelled("session:k")) == 1)
        assert echoed(loop, "back") == "back"  # a crash is a crash, whenever it comes
        loop.stop()
        assert not loop.alive and "k" not in _sessions(system)
