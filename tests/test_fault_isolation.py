"""Fault isolation in the system's tree (DESIGN §6): a crash-looping session or server is
given up alone, the host is told (events, exit reasons, clear errors), and a root that
gives up stops the system visibly."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from rho_actors import (
    Actor,
    ActorSystem,
    ChildSpec,
    NotRunningError,
    PluginFolder,
    RestartIntensityExceeded,
    StartChild,
    SupervisorEvent,
    ToolCall,
    kill,
    tool,
)
from rho_actors.loop.messages import loop_name

from .conftest import WAIT_S, wait_for
from .helpers import echo


class Reports:
    """The SupervisorEvents a system publishes."""

    def __init__(self) -> None:
        self.events: list[SupervisorEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        if isinstance(event, SupervisorEvent):
            with self.lock:
                self.events.append(event)

    def of(self, supervisor: str) -> list[str]:
        with self.lock:
            return [e.kind for e in self.events if e.supervisor == supervisor]


def crash_loop(system: ActorSystem, name: str, times: int) -> None:
    """Kill the actor named ``name`` ``times`` times, each after it was restarted."""
    for _ in range(times):
        ref = system.whereis(name)
        assert ref is not None
        kill(ref)
        assert wait_for(lambda: system.whereis(name) not in (None, ref))  # noqa: B023


def turn(loop: Any, text: str) -> str:
    [result] = loop.run_turn([ToolCall("c", "echo", f'{{"text": "{text}"}}')], timeout_s=WAIT_S)
    assert result.ok, result.content
    return str(result.content)


def test_a_crash_looping_session_is_given_up_alone(tmp_path: Path) -> None:
    reports = Reports()
    with ActorSystem(data_dir=tmp_path, max_restarts=2, max_seconds=60) as system:
        system.subscribe(reports)
        system.register(echo)
        healthy = [system.start_loop(f"ok{i}") for i in range(3)]
        victim = system.start_loop("victim")
        crash_loop(system, loop_name("victim"), 2)  # restarted twice: at the intensity
        last = system.whereis(loop_name("victim"))
        assert last is not None
        kill(last)  # one restart too many
        assert wait_for(lambda: "gave_up" in reports.of("session:victim"))
        for i, loop in enumerate(healthy):
            assert turn(loop, f"still {i}") == f"still {i}"
        assert not victim.alive and isinstance(victim.exit_reason, RestartIntensityExceeded)
        assert "session:victim: more than 2 restarts in 60 s" in str(victim.exit_reason)
        with pytest.raises(NotRunningError, match="session 'victim' is not running: its supervisor gave up"):
            victim.run_turn([ToolCall("c", "echo", '{"text": "x"}')])
        assert reports.of("session:victim") == [
            "started", "crashed", "restarted", "crashed", "restarted", "crashed", "gave_up",
        ]
        gave_up = [e for e in reports.events if e.kind == "gave_up"]
        assert [e.child for e in gave_up] == ["loop"] and "killed" in (gave_up[0].reason or "")
        assert reports.of("sessions") == [] and reports.of("root") == []  # nothing escalated
        assert not system.stopped and system.exit_reason is None
        again = system.start_loop("victim")  # the session can be started afresh
        assert turn(again, "back") == "back" and again.exit_reason is None
        again.stop()
        assert not again.alive and again.exit_reason == "normal"
        tree = {c["id"]: c for c in system.tree()["children"]}
        assert [s["id"] for s in tree["sessions"]["children"]] == ["ok0", "ok1", "ok2"]  # a stop ends its subtree


class Store(Actor):
    """A stable server: answers with what it was told to keep."""

    def __init__(self) -> None:
        super().__init__()
        self.value = "kept"

    def on_receive(self, message: Any) -> Any:
        return self.value


class Crashy(Actor):
    def on_receive(self, message: Any) -> Any:
        return "up"


def plugin(name: str) -> str:
    return textwrap.dedent(f"""
        def name():
            return {name!r}

        def description():
            return "test tool {name}"

        def parameter_schema():
            return {{"type": "object", "properties": {{}}}}

        def run(args, ctx):
            return {name!r}
    """)


def test_a_crash_looping_server_is_given_up_alone(tmp_path: Path) -> None:
    reports = Reports()
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "first.py").write_text(plugin("first"))
    with ActorSystem(data_dir=tmp_path / "data", max_restarts=3, max_seconds=60) as system:
        system.subscribe(reports)
        stable = system.start_child(ChildSpec("store", StartChild(Store), name="store"))
        system.start_child(ChildSpec("crashy", StartChild(Crashy), name="crashy"), max_restarts=1, max_seconds=60)
        handle = system.add_source(PluginFolder(folder), trusted=True, poll_s=None)
        crash_loop(system, "crashy", 1)
        last = system.whereis("crashy")
        assert last is not None
        kill(last)
        assert wait_for(lambda: "gave_up" in reports.of("server:crashy"))
        assert reports.of("server:crashy") == ["started", "crashed", "restarted", "crashed", "gave_up"]
        assert system.whereis("crashy") is None
        with pytest.raises(NotRunningError, match=r"'crashy' is not running: its supervisor gave up .*more than 1"):
            system.lookup("crashy")
        assert system.whereis("store") is stable and stable.ask("get", timeout=WAIT_S) == "kept"
        (folder / "second.py").write_text(plugin("second"))
        status = handle.refresh(WAIT_S)  # the source still runs and picks up new files
        assert status["alive"] and status["tools"][str(folder / "second.py")]["offered"]
        assert turn_named(system, "second") == "second"
        assert reports.of("servers") == [] and reports.of("sources") == ["started"] and reports.of("root") == []
        tree = {c["id"]: c for c in system.tree()["children"]}
        assert [s["id"] for s in tree["servers"]["children"]] == ["store"]
        assert [s["id"] for s in tree["sources"]["children"]] == ["source:" + handle.name]
        assert not system.stopped


def turn_named(system: ActorSystem, name: str) -> str:
    loop = system.start_loop()
    [result] = loop.run_turn([ToolCall("c", name, "{}")], timeout_s=WAIT_S)
    assert result.ok, result.content
    return str(result.content)


def test_a_server_whose_start_fails_says_why(system: ActorSystem) -> None:
    class Refuses(Actor):
        def on_start(self) -> None:
            raise ConnectionRefusedError("no database")

    with pytest.raises(RuntimeError, match="ConnectionRefusedError: no database"):
        system.start_child(ChildSpec("refuses", StartChild(Refuses), name="refuses"))
    system.start_child(ChildSpec("store", StartChild(Store), name="store"))
    with pytest.raises(ValueError, match="'store' is held"):
        system.start_child(ChildSpec("store2", StartChild(Store), name="store"))


def test_the_host_reaches_restarted_system_actors(system: ActorSystem) -> None:
    @tool
    def first() -> str:
        """One."""
        return "1"

    @tool
    def second() -> str:
        """Two."""
        return "2"

    system.register(first)
    system.start_loop("before")
    crash_loop(system, "registry", 1)
    crash_loop(system, "sessions", 1)
    system.register(second)  # through the restarted registry, not the dead one
    assert [r.info.name for r in system.registrations() if r.info is not None] == ["first", "second"]
    loop = system.start_loop("after")  # through the restarted sessions supervisor
    [result] = loop.run_turn([ToolCall("c", "second", "{}")], timeout_s=WAIT_S)
    assert result.ok and result.content == "2"


def test_a_call_meeting_a_system_actor_that_died_before_taking_it_is_asked_again(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``register`` found the registry's ref an instant before it was killed: the ask meets
    a dead actor (the message never handled), and is asked again of the restarted one."""

    @tool
    def third() -> str:
        """Three."""
        return "3"

    old = system.whereis("registry")
    assert old is not None
    kill(old)
    assert wait_for(lambda: system.whereis("registry") not in (None, old))
    names = system._names  # the instant of the race, made certain
    real, stale = names.whereis, [old]
    monkeypatch.setattr(names, "whereis", lambda name: stale.pop() if name == "registry" and stale else real(name))
    registration = system.register(third)
    assert not stale and registration.info is not None and registration.info.name == "third"


def test_a_root_that_gives_up_stops_the_system_visibly(tmp_path: Path) -> None:
    reports = Reports()
    system = ActorSystem(data_dir=tmp_path, max_restarts=1, max_seconds=60)
    try:
        system.subscribe(reports)
        loop = system.start_loop("s")
        crash_loop(system, "registry", 1)
        last = system.whereis("registry")
        assert last is not None
        kill(last)
        assert wait_for(lambda: system.stopped)
        assert isinstance(system.exit_reason, RestartIntensityExceeded)
        assert "root: more than 1 restarts in 60 s (last: child 'registry', killed)" in str(system.exit_reason)
        assert reports.of("root")[-3:] == ["restarted", "crashed", "gave_up"]
        assert not loop.alive
        with pytest.raises(NotRunningError):
            loop.run_turn([])
    finally:
        system.stop()


def test_a_slow_server_start_holds_up_no_other_server(system: ActorSystem) -> None:
    """A server whose start blocks does not hold up another server's start (each starts
    in its caller's thread, then joins ``servers``)."""
    release, entered, returned = threading.Event(), threading.Event(), threading.Event()

    class SlowStart(Actor):
        def on_start(self) -> None:
            entered.set()
            release.wait(WAIT_S)
            returned.set()

    class Quick(Actor):
        def on_receive(self, message: Any) -> Any:
            return "pong"

    slow = threading.Thread(target=system.start_child, args=(ChildSpec("slow", StartChild(SlowStart)),))
    slow.start()
    try:
        assert entered.wait(WAIT_S)
        quick = system.start_child(ChildSpec("quick", StartChild(Quick)))  # while "slow" is still starting
        assert quick.ask("ping", timeout=WAIT_S) == "pong"
        assert not returned.is_set()  # "quick" did not wait for "slow"
    finally:
        release.set()
        slow.join(WAIT_S)
    servers = next(c for c in system.tree()["children"] if c["id"] == "servers")
    assert {c["id"] for c in servers["children"]} >= {"slow", "quick"}
