"""Lazy session subtrees (rho_actors.otp.lazy, DESIGN §6): a session's supervisor starts
only at its loop's first crash, and the tree, the reports and fault isolation read as
if it had been there from the start."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import (
    ActorSystem,
    ChildSpec,
    RestartIntensityExceeded,
    StartChild,
    Supervisor,
    SupervisorEvent,
    ToolCall,
    kill,
    tool,
)
from rho_actors.loop.actor import LoopActor
from rho_actors.loop.messages import loop_name
from rho_actors.otp.lazy import LazySubtree

from .conftest import WAIT_S, supervisors_labelled, wait_for
from .helpers import echo


def session_node(system: ActorSystem, session_id: str) -> dict[str, Any]:
    sessions = next(c for c in system.tree()["children"] if c["id"] == "sessions")
    [node] = [s for s in sessions["children"] if s["id"] == session_id]
    assert isinstance(node, dict)
    return node


def echoed(loop: Any, text: str) -> str:
    [result] = loop.run_turn([ToolCall("c", "echo", f'{{"text": "{text}"}}')], timeout_s=WAIT_S)
    assert result.ok, result.content
    return str(result.content)


class Reports:
    def __init__(self) -> None:
        self.events: list[SupervisorEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        if isinstance(event, SupervisorEvent):
            with self.lock:
                self.events.append(event)

    def of(self, label: str) -> list[tuple[str, str, int]]:
        with self.lock:
            return [(e.kind, e.child, e.restarts) for e in self.events if e.supervisor == label]


def test_a_session_starts_no_supervisor_until_its_loop_crashes(system: ActorSystem) -> None:
    reports = Reports()
    system.subscribe(reports)
    system.register(echo)
    loop = system.start_loop("s1")
    assert supervisors_labelled("session:s1") == []  # only the LoopActor was started
    assert reports.of("session:s1") == [("started", "loop", 0)]
    before = session_node(system, "s1")
    assert (before["kind"], before["restart"], before["strategy"], before["alive"]) == (
        "supervisor", "temporary", "one_for_one", True)
    [loop_node] = before["children"]
    assert (loop_node["id"], loop_node["kind"], loop_node["restart"], loop_node["restarts"]) == (
        "loop", "worker", "transient", 0)
    assert loop_node["running"] == []
    assert echoed(loop, "a") == "a"

    first = loop.ref
    kill(first)
    assert wait_for(lambda: loop.alive and loop.ref is not first)
    assert len(supervisors_labelled("session:s1")) == 1  # woken up by the crash
    # reported once the restarted loop is up (it is named first): awaited, not read at once
    assert wait_for(lambda: reports.of("session:s1") == [("started", "loop", 0), ("crashed", "loop", 0),
                                                         ("restarted", "loop", 1)]), reports.of("session:s1")
    after = session_node(system, "s1")
    assert (after["kind"], after["strategy"], after["alive"]) == ("supervisor", "one_for_one", True)
    [loop_node] = after["children"]
    assert (loop_node["id"], loop_node["restarts"], loop_node["alive"]) == ("loop", 1, True)
    assert echoed(loop, "b") == "b"
    with pytest.raises(ValueError, match="running"):
        system.start_loop("s1")
    loop.stop()
    assert wait_for(lambda: supervisors_labelled("session:s1") == [])  # a normal stop ends the woken subtree
    assert all(s["id"] != "s1" for s in next(c for c in system.tree()["children"] if c["id"] == "sessions")
               ["children"])


def test_a_lazy_session_stopped_normally_is_forgotten_and_can_start_again(system: ActorSystem) -> None:
    system.register(echo)
    loop = system.start_loop("s2")
    loop.stop()
    assert not loop.alive and loop.exit_reason == "normal"
    sessions = next(c for c in system.tree()["children"] if c["id"] == "sessions")
    assert sessions["children"] == []
    again = system.start_loop("s2")
    assert echoed(again, "x") == "x"
    assert supervisors_labelled("session:s2") == []


def test_a_first_crash_past_an_intensity_of_zero_gives_the_session_up_alone(tmp_path: Path) -> None:
    reports = Reports()
    with ActorSystem(data_dir=tmp_path, max_restarts=0, max_seconds=60) as system:
        system.subscribe(reports)
        system.register(echo)
        healthy = system.start_loop("ok")
        victim = system.start_loop("victim")
        kill(victim.ref)
        assert wait_for(lambda: isinstance(victim.exit_reason, RestartIntensityExceeded))
        assert [k for k, _, _ in reports.of("session:victim")] == ["started", "crashed", "gave_up"]
        assert "session:victim: more than 0 restarts in 60 s" in str(victim.exit_reason)
        assert echoed(healthy, "still") == "still"
        sessions = next(c for c in system.tree()["children"] if c["id"] == "sessions")
        assert wait_for(lambda: [s["id"] for s in next(
            c for c in system.tree()["children"] if c["id"] == "sessions")["children"]] == ["ok"])
        assert sessions["alive"] and not system.stopped
        assert echoed(system.start_loop("victim"), "back") == "back"


def test_a_system_stop_stops_lazy_sessions_with_their_calls_answered(tmp_path: Path) -> None:
    release = threading.Event()

    @tool
    def blocked() -> str:
        """Wait to be released."""
        release.wait(WAIT_S)
        return "released"

    system = ActorSystem(data_dir=tmp_path, shutdown_ms=200)
    try:
        system.register(blocked)
        loop = system.start_loop("s3")
        future = loop.submit_turn([ToolCall("b", "blocked", "{}")])
        system.stop()
        [result] = future.result(WAIT_S)
        assert not result.ok and result.error_kind is not None
        # stopped: at once, or (its thread late on a loaded machine) after stop() gave up waiting its 200 ms
        assert wait_for(lambda: not pykka.ActorRegistry.get_by_class(LoopActor))
    finally:
        release.set()
        system.stop()


def test_a_lazy_subtree_refuses_a_shape_it_cannot_stand_for() -> None:
    child = ChildSpec("loop", StartChild(LoopActor), restart="transient", significant=True, name=loop_name("x"))
    sup = StartChild(Supervisor, kwargs={"children": [child], "auto_shutdown": "any_significant"})
    LazySubtree(ChildSpec("x", sup, restart="temporary", type="supervisor"), child)  # the session shape
    with pytest.raises(ValueError, match="temporary supervisor child"):
        LazySubtree(ChildSpec("x", sup, type="supervisor"), child)
    with pytest.raises(ValueError, match="alone, with auto_shutdown"):
        LazySubtree(ChildSpec("x", StartChild(Supervisor, kwargs={"children": [child]}), restart="temporary",
                              type="supervisor"), child)
    with pytest.raises(ValueError, match="StartChild of a Supervisor"):
        LazySubtree(ChildSpec("x", StartChild(LoopActor), restart="temporary", type="supervisor"), child)
    unnamed = ChildSpec("loop", StartChild(LoopActor), restart="transient", significant=True)
    with pytest.raises(ValueError, match="named, transient and significant"):
        LazySubtree(ChildSpec("x", StartChild(Supervisor, kwargs={"children": [unnamed],
                                                                   "auto_shutdown": "any_significant"}),
                              restart="temporary", type="supervisor"), unnamed)


def test_a_sessions_subtree_made_through_its_slots_is_the_checked_one() -> None:
    """SessionSubtrees.make (each field set through its slot, no checks) makes what the
    checked constructors make, and that passes LazySubtree's own checks."""
    from rho_actors.otp.lazy import SessionSubtrees

    subtrees = SessionSubtrees({"label": "", "max_restarts": 3, "max_seconds": 5}, 6_000)

    def start() -> pykka.ActorRef[Any]:
        raise AssertionError("not started here")

    for session_id in ("a", "s.1@x:y-z", "x" * 128):
        made = subtrees.make(session_id, start, loop_name(session_id))
        checked = subtrees.checked(session_id, start, loop_name(session_id))
        assert made == checked
        assert LazySubtree(made.spec, made.child) == made  # its checks pass
        assert made.label == f"session:{session_id}" and made.spec.shutdown == 6_000
        assert made.child.start is start and made.spec.start.kwargs["children"] == [made.child]  # type: ignore[attr-defined]
