"""The system's own supervision tree (DESIGN §6): its actors restart without losing state
or calls, loops restart after a crash, the host's tool servers, escalation to the root,
and the live tree."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pykka
import pytest

from rho_actors import (
    Actor,
    ActorSystem,
    ChildSpec,
    DuplicateToolError,
    ErrorKind,
    RestartIntensityExceeded,
    StartChild,
    ToolCall,
    kill,
    tool,
)

from .conftest import WAIT_S, wait_for

RELEASE = threading.Event()
ENTERED = threading.Event()
NAME_READS: list[int] = []


@tool
def wait_for_release() -> str:
    """Block until the test releases it."""
    ENTERED.set()
    RELEASE.wait(WAIT_S)
    return "released"


class Counted:
    """A tool that counts how often its declaration is read."""

    @staticmethod
    def name() -> str:
        NAME_READS.append(1)
        return "counted"

    @staticmethod
    def description() -> str:
        return "Counts reads of its name."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object"}

    @staticmethod
    def run(args: Any, ctx: Any) -> str:
        return "ok"


@pytest.fixture(autouse=True)
def _reset() -> None:
    RELEASE.clear()
    ENTERED.clear()
    NAME_READS.clear()


def restarted(system: ActorSystem, name: str) -> Any:
    old = system.whereis(name)
    assert old is not None
    kill(old)
    assert wait_for(lambda: system.whereis(name) not in (None, old))
    return system.whereis(name)


@pytest.mark.parametrize("victim", ["declarations", "registry"])
def test_killing_a_system_actor_loses_no_tool_and_no_call(system: ActorSystem, victim: str) -> None:
    system.register(wait_for_release)
    system.register(Counted)
    reads = len(NAME_READS)
    loop = system.start_loop()
    future = loop.submit_turn([ToolCall("w", "wait_for_release", "{}")])
    assert ENTERED.wait(WAIT_S)
    restarted(system, victim)
    RELEASE.set()
    [result] = future.result(WAIT_S)
    assert result.ok and result.content == "released"
    assert [i.name for i in system.tools()] == ["wait_for_release", "counted"]
    assert [r.info.name for r in system.registrations() if r.info] == ["wait_for_release", "counted"]
    with pytest.raises(DuplicateToolError):
        system.register(tool(name="counted", description="Another.")(lambda: None))
    assert len(NAME_READS) == reads  # nothing was read again
    assert loop.run_turn([ToolCall("c", "counted", "{}")])[0].content == "ok"


def test_a_crashed_loop_answers_its_calls_and_is_restarted(system: ActorSystem) -> None:
    system.register(wait_for_release)
    loop = system.start_loop("s1")
    first = loop.ref
    future = loop.submit_turn([ToolCall("w", "wait_for_release", "{}")])
    assert ENTERED.wait(WAIT_S)
    kill(first)
    [result] = future.result(WAIT_S)
    assert result.error_kind is ErrorKind.CRASHED and "loop crashed" in result.content
    assert wait_for(lambda: loop.alive and loop.ref is not first)
    RELEASE.set()
    system.register(Counted)
    assert loop.run_turn([ToolCall("c", "counted", "{}")])[0].content == "ok"
    loop.stop()
    assert not loop.alive  # a normal stop: a transient child is not restarted


class KvServer(Actor):
    """A stateful tool server: a dict; "crash" raises in a tell handler."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, Any] = {}

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError("the server broke")
        op, key, *value = message
        if op == "put":
            self.data[key] = value[0]
            return None
        if op == "slow_get":
            RELEASE.wait(WAIT_S)
        return self.data.get(key)


@tool
def kv(op: str, key: str, ctx: Mapping[str, Any], value: str | None = None) -> Any:
    """Put or get a value in the kv server."""
    server = ctx["whereis"]("kv")
    if server is None:
        raise RuntimeError("the kv server is not running")
    if op == "slow_get":
        ENTERED.set()
    return server.ask((op, key, value), timeout=WAIT_S)


def test_a_tool_server_survives_a_crash_and_its_waiting_calls_get_errors(system: ActorSystem) -> None:
    system.start_child(ChildSpec("kv", StartChild(KvServer), name="kv"))
    system.register(kv)
    loop = system.start_loop()
    assert loop.run_turn([ToolCall("p", "kv", '{"op": "put", "key": "a", "value": "1"}')])[0].ok
    assert loop.run_turn([ToolCall("g", "kv", '{"op": "get", "key": "a"}')])[0].content == "1"
    server = system.whereis("kv")
    assert server is not None
    future = loop.submit_turn([ToolCall("s", "kv", '{"op": "slow_get", "key": "a"}')])
    assert ENTERED.wait(WAIT_S)
    server.tell("crash")  # queued behind the slow get
    waiting = loop.submit_turn([ToolCall("w", "kv", '{"op": "get", "key": "a"}')])
    RELEASE.set()
    assert future.result(WAIT_S)[0].content == "1"
    [lost] = waiting.result(WAIT_S)  # its message reached a dead server, or a fresh one
    assert lost.error_kind is ErrorKind.RAISED or lost.content == "null"  # an error or fresh state, never a hang
    assert wait_for(lambda: system.whereis("kv") not in (None, server))
    assert loop.run_turn([ToolCall("g", "kv", '{"op": "get", "key": "a"}')])[0].content == "null"  # fresh state


def test_the_tree_is_plain_data_with_running_calls(system: ActorSystem) -> None:
    system.register(wait_for_release)
    system.start_child(ChildSpec("kv", StartChild(KvServer), name="kv"))
    loop = system.start_loop("s1")
    future = loop.submit_turn([ToolCall("w", "wait_for_release", "{}")])
    assert ENTERED.wait(WAIT_S)
    tree = system.tree()
    assert (tree["id"], tree["kind"], tree["strategy"], tree["alive"]) == ("root", "supervisor", "one_for_one", True)
    children = {c["id"]: c for c in tree["children"]}
    assert list(children) == ["declarations", "registry", "calls", "workers", "sources", "sessions", "servers",
                              "tasks"]
    assert children["declarations"]["restart"] == "permanent" and children["declarations"]["kind"] == "worker"
    assert children["calls"]["running"] >= 1 and "spares" not in children["calls"]
    [session] = children["sessions"]["children"]
    assert (session["id"], session["kind"], session["restart"]) == ("s1", "supervisor", "temporary")
    [loop_node] = session["children"]
    assert loop_node["id"] == "loop" and loop_node["restart"] == "transient"
    [running] = loop_node["running"]
    assert running["call_id"] == "w" and running["tool"] == "wait_for_release"
    assert 0 < running["ms_left"] <= 30_000
    [server] = children["servers"]["children"]
    assert server["id"] == "kv" and server["kind"] == "supervisor" and server["children"][0]["id"] == "kv"
    RELEASE.set()
    assert future.result(WAIT_S)[0].ok
    restarted(system, "registry")
    assert {c["id"]: c for c in system.tree()["children"]}["registry"]["restarts"] == 1


def test_failures_past_the_roots_intensity_stop_the_system(tmp_path: Any) -> None:
    system = ActorSystem(data_dir=tmp_path, max_restarts=2, max_seconds=60)
    try:
        for _ in range(2):
            restarted(system, "registry")
        last = system.whereis("registry")
        assert last is not None
        kill(last)
        assert wait_for(lambda: system.stopped)
        assert isinstance(system.exit_reason, RestartIntensityExceeded)
        with pytest.raises(RuntimeError, match="stopped"):
            system.start_loop()
        with pytest.raises(RuntimeError, match="not running"):
            system.register(Counted)
    finally:
        system.stop()
    assert not pykka.ActorRegistry.get_by_class(Actor)
