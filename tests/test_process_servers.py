"""Stateful servers in an isolation of their own (rho_actors.isolation.servers): state kept
across calls, a real process killed at a call's deadline and restarted fresh within its
supervisor's intensity, an untrusted one confined, and the tree listing them."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import ActorSystem, ChildSpec, ErrorKind, SupervisorEvent, ToolCall, tool
from rho_actors.isolation.servers import (
    ProcessActor,
    ServerCall,
    ServerDown,
    ServerError,
    ServerRestarted,
    ThreadActor,
    call_server,
)
from rho_actors.otp.actor import kill
from rho_actors.results import text
from rho_actors.sandbox.confine.uids import DEFAULT_UID_RANGE
from tests.conftest import WAIT_S, wait_for
from tests.server_classes import Broken, Store


@tool(timeout_ms=20_000, concurrency="exclusive")
def store(op: str, key: str, ctx: Mapping[str, Any], value: str = "", timeout_ms: int = 10_000) -> Any:
    """Talk to the server named by the session id."""
    server = ctx["session_id"].split("@")[0]
    if op == "put":
        return call_server(ctx, server, "put", key, value, timeout_ms=timeout_ms)
    if op == "stall":
        return call_server(ctx, server, "stall", 30, timeout_ms=timeout_ms)
    return call_server(ctx, server, "get", key, timeout_ms=timeout_ms)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActorSystem]:
    """One system for the module (its fork servers start once); each test has its own server."""
    with ActorSystem(data_dir=tmp_path_factory.mktemp("servers")) as system:
        system.register(store)
        yield system


@pytest.fixture
def system(shared: ActorSystem, request: pytest.FixtureRequest) -> Iterator[ActorSystem]:
    yield shared
    shared.stop_child(_name(request))


def ask(ref: pykka.ActorRef[Any], call: ServerCall) -> Any:
    """``ref.ask(call)``, typed."""
    return ref.ask(call)


def _name(request: pytest.FixtureRequest) -> str:
    return str(request.node.name)[5:40]


def _restarted(system: ActorSystem, name: str, kind: str = "restarted") -> threading.Event:
    seen = threading.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, SupervisorEvent) and event.kind == kind and event.child == name:
            seen.set()

    system.subscribe(on_event)
    return seen


def _call(system: ActorSystem, name: str, arguments: str) -> Any:
    loop = system.start_loop(session_id=f"{name}@{os.urandom(4).hex()}")
    [result] = loop.run_turn([ToolCall("c", "store", arguments)])
    loop.stop()
    return result


def _server_node(system: ActorSystem, name: str) -> dict[str, Any]:
    servers = next(c for c in system.tree()["children"] if c["id"] == "servers")
    [subtree] = [c for c in servers["children"] if c["id"] == name]
    [node] = subtree["children"]
    return node  # type: ignore[no-any-return]


def test_a_process_server_keeps_its_state_across_calls_and_is_listed_in_the_tree(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    system.start_child(ChildSpec(name, ProcessActor(Store), name=name))
    loop = system.start_loop(f"{name}@s")
    put, get = loop.run_turn([ToolCall("p", "store", '{"op": "put", "key": "city", "value": "Lisbon"}'),
                              ToolCall("g", "store", '{"op": "get", "key": "city"}')])
    assert (put.ok, put.content, get.ok, get.content) == (True, "stored", True, "Lisbon")
    ref = system.whereis(name)
    assert ref is not None
    where = ask(ref, ServerCall("where"))
    assert where["pid"] != os.getpid() and where["uid"] == os.getuid()
    node = _server_node(system, name)
    assert node["server"] == {"isolation": "process", "class": "Store", "pid": where["pid"], "trusted": True,
                              "calls": 3, "memory_bound": node["server"]["memory_bound"]}
    with pytest.raises(ServerError, match="LookupError: no such thing") as raised:
        ask(ref, ServerCall("fail"))
    assert raised.value.type_name == "LookupError"
    assert ask(ref, ServerCall("get", ("city",))) == "Lisbon"  # a raise keeps the server and its state
    with pytest.raises(AttributeError, match="no public method '_secret'"):
        ask(ref, ServerCall("_secret"))
    system.stop_child(name)
    assert not Path(f"/proc/{where['pid']}").exists()


def test_a_stopped_servers_watcher_thread_has_ended_when_its_stop_returns(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    """The thread watching a server's process for an end between calls is woken and
    waited for as the server stops, before the descriptors it watches are closed (a
    descriptor closed under it could be reused and watched for ever)."""
    name = _name(request)
    system.start_child(ChildSpec(name, ProcessActor(Store), name=name))
    ref = system.whereis(name)
    assert ref is not None
    pid = ask(ref, ServerCall("where"))["pid"]
    [watcher] = [t for t in threading.enumerate() if t.name == f"rho-server-watch-{pid}"]
    system.stop_child(name)
    assert not watcher.is_alive()


def test_a_call_past_its_deadline_kills_the_process_and_the_server_restarts_fresh(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    system.start_child(ChildSpec(name, ProcessActor(Store), name=name), max_restarts=3, max_seconds=60)
    restarted = _restarted(system, name)
    assert _call(system, name, '{"op": "put", "key": "city", "value": "Lisbon"}').content == "stored"
    before = system.whereis(name)
    assert before is not None
    pid = ask(before, ServerCall("where"))["pid"]
    result = _call(system, name, '{"op": "stall", "key": "-", "timeout_ms": 300}')
    assert result.error_kind is ErrorKind.TIMEOUT
    assert result.content == text("server_killed", server=name, method="stall", timeout_ms=300)
    assert "everything it held is lost" in result.content
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped before the answer
    assert restarted.wait(WAIT_S)
    after = system.whereis(name)
    assert after is not None and after is not before
    assert ask(after, ServerCall("where"))["pid"] != pid
    assert _call(system, name, '{"op": "get", "key": "city"}').content == "null"  # fresh state
    assert _server_node(system, name)["restarts"] == 1


def test_past_its_intensity_the_server_is_given_up_and_tools_are_told(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    system.start_child(ChildSpec(name, ProcessActor(Store), name=name), max_restarts=0, max_seconds=60)
    gave_up = _restarted(system, name, "gave_up")
    ref = system.whereis(name)
    assert ref is not None
    os.kill(ask(ref, ServerCall("where"))["pid"], signal.SIGKILL)  # between calls: its watcher notices
    assert gave_up.wait(WAIT_S)
    result = _call(system, name, '{"op": "get", "key": "city"}')
    assert result.error_kind is ErrorKind.UNAVAILABLE
    assert result.content == text("server_not_running", server=name, method="get")


def test_a_server_killed_from_outside_between_calls_restarts(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    system.start_child(ChildSpec(name, ProcessActor(Store, "kept"), name=name))
    restarted = _restarted(system, name)
    ref = system.whereis(name)
    assert ref is not None
    ask(ref, ServerCall("put", ("k", "v")))
    pid = ask(ref, ServerCall("where"))["pid"]
    os.kill(pid, signal.SIGKILL)
    assert restarted.wait(WAIT_S)
    fresh = system.whereis(name)
    assert fresh is not None
    with pytest.raises(ServerRestarted) as told:  # its next caller is told, and the call did not run
        ask(fresh, ServerCall("get", ("k",)))
    assert told.value.key == "server_restarted" and "everything it held is lost" in str(told.value)
    assert "get() did not run" in str(told.value) and "died of SIGKILL" in str(told.value)
    assert ask(fresh, ServerCall("get", ("k",))) is None  # told once: then fresh state
    assert ask(fresh, ServerCall("get", ("first",))) == "kept"  # built again from its arguments


@pytest.mark.parametrize("how", ["killed_idle", "actor_killed"])
def test_a_server_restarted_while_idle_tells_its_next_caller_from_a_tool(
    system: ActorSystem, request: pytest.FixtureRequest, how: str
) -> None:
    """The idle paths say what the timeout and crash paths say: everything the server
    held is lost, in the model's text; the call after that runs on the fresh state."""
    name = _name(request)[:30] + how[:4]
    system.start_child(ChildSpec(name, ProcessActor(Store), name=name), max_restarts=3, max_seconds=60)
    restarted = _restarted(system, name)
    assert _call(system, name, '{"op": "put", "key": "city", "value": "Lisbon"}').content == "stored"
    ref = system.whereis(name)
    assert ref is not None
    if how == "killed_idle":
        os.kill(ask(ref, ServerCall("where"))["pid"], signal.SIGKILL)  # between calls: its watcher notices
    else:
        kill(ref, "a reason of the host's")  # the actor, not its process: its supervisor restarts it
    assert restarted.wait(WAIT_S)
    assert wait_for(lambda: system.whereis(name) not in (None, ref), WAIT_S)
    told = _call(system, name, '{"op": "get", "key": "city"}')
    assert told.error_kind is ErrorKind.UNAVAILABLE
    assert "everything it held is lost" in told.content and "get() did not run" in told.content
    assert _call(system, name, '{"op": "get", "key": "city"}').content == "null"
    system.stop_child(name)


def test_a_start_that_raises_is_the_childs_start_error(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    with pytest.raises(RuntimeError, match="could not start: ValueError: cannot open the store"):
        system.start_child(ChildSpec(name, ProcessActor(Broken), name=name))
    assert system.whereis(name) is None


def test_an_untrusted_server_is_confined_and_answers_plain_data_only(
    system: ActorSystem, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    folder = tmp_path / "open"
    folder.mkdir()
    secret = folder / "secret.txt"
    secret.write_text("the host's secret")
    for path in (tmp_path, folder):
        path.chmod(0o755)
    secret.chmod(0o644)  # readable by any uid: only Landlock keeps it from the server
    os.environ["RHO_TEST_SERVER_SECRET"] = "x"
    try:
        system.start_child(ChildSpec(name, ProcessActor(Store, trusted=False), name=name))
    finally:
        del os.environ["RHO_TEST_SERVER_SECRET"]
    ref = system.whereis(name)
    assert ref is not None
    where = ask(ref, ServerCall("where"))
    assert where["uid"] in DEFAULT_UID_RANGE
    assert "RHO_TEST_SERVER_SECRET" not in where["env"]
    with pytest.raises(ServerError) as denied:
        ask(ref, ServerCall("read", (str(secret),)))
    assert denied.value.type_name == "PermissionError"
    with pytest.raises(ServerError, match="an untrusted server returns plain JSON data only"):
        ask(ref, ServerCall("opaque"))
    assert ask(ref, ServerCall("put", ("k", [1, "two"]))) == "stored"
    assert ask(ref, ServerCall("get", ("k",))) == [1, "two"]
    assert _server_node(system, name)["server"]["trusted"] is False


def test_a_forged_answer_from_an_untrusted_server_gets_it_killed_as_crashed(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    system.start_child(ChildSpec(name, ProcessActor(Store, trusted=False), name=name))
    ref = system.whereis(name)
    assert ref is not None
    ask(ref, ServerCall("where"))
    pid = _server_node(system, name)["server"]["pid"]  # the host's view: inside, it is pid 1 of its namespace
    with pytest.raises(ServerDown) as down:
        ask(ref, ServerCall("forge", timeout_ms=20_000))
    assert down.value.key == "server_crashed" and "more than the limit" in str(down.value)
    assert not Path(f"/proc/{pid}").exists()


def test_an_untrusted_server_killed_at_its_deadline_is_gone(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    system.start_child(ChildSpec(name, ProcessActor(Store, trusted=False), name=name))
    restarted = _restarted(system, name)
    ref = system.whereis(name)
    assert ref is not None
    assert ask(ref, ServerCall("where"))["pid"] == 1  # PID 1 of a PID namespace of its own
    pid = _server_node(system, name)["server"]["pid"]
    result = _call(system, name, '{"op": "stall", "key": "-", "timeout_ms": 300}')
    assert result.content == text("server_killed", server=name, method="stall", timeout_ms=300)
    assert not Path(f"/proc/{pid}").exists()
    assert restarted.wait(WAIT_S)


def test_a_thread_server_keeps_state_in_the_host(
    system: ActorSystem, request: pytest.FixtureRequest
) -> None:
    name = _name(request)
    system.start_child(ChildSpec(name, ThreadActor(Store), name=name))
    assert _call(system, name, '{"op": "put", "key": "k", "value": "v"}').content == "stored"
    ref = system.whereis(name)
    assert ref is not None and ask(ref, ServerCall("where"))["pid"] == os.getpid()
    assert _call(system, name, '{"op": "get", "key": "k"}').content == "v"
    assert _server_node(system, name)["server"] == {"isolation": "thread", "class": "Store", "calls": 3}


def test_a_servers_arguments_are_plain_data_as_start_childs_are(system: ActorSystem,
                                                                  request: pytest.FixtureRequest) -> None:
    name = _name(request)
    bound_ms = int(WAIT_S * 1000)  # a call's: only a hang reaches it
    spec = ProcessActor(Store, args=["kept"], kwargs={}, call_timeout_ms=bound_ms)
    assert (spec.args, spec.kwargs, spec.call_timeout_ms) == (("kept",), {}, bound_ms)
    assert (ProcessActor(Store, "kept").args, ThreadActor(Store, kwargs={"first": "kept"}).kwargs) == (
        ("kept",), {"first": "kept"})  # the inline form too
    system.start_child(ChildSpec(name, spec, name=name))
    ref = system.whereis(name)
    assert ref is not None and ask(ref, ServerCall("get", ("first",))) == "kept"
    with pytest.raises(TypeError, match=r"either as args=/kwargs= \(as StartChild takes them\) or inline, not both"):
        ProcessActor(Store, "inline", args=["kept"])
    with pytest.raises(TypeError, match="args must be a list or tuple, got str"):
        ThreadActor(Store, args="kept")
    with pytest.raises(TypeError, match="kwargs must be a mapping of str keys, got list"):
        ProcessActor(Store, kwargs=["first"])  # type: ignore[arg-type]


def test_bad_server_specs_are_refused() -> None:
    with pytest.raises(TypeError, match="needs a class"):
        ProcessActor(Store())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="call_timeout_ms must be milliseconds > 0"):
        ProcessActor(Store, call_timeout_ms=0)
    with pytest.raises(ValueError, match="heap_bytes"):
        ProcessActor(Store, heap_bytes=-1)


def test_a_malformed_answer_from_an_untrusted_server_is_refused_without_running_code() -> None:
    import msgpack

    from rho_actors.sandbox import wire

    assert wire.decode_served("plain", wire.encode_served("plain", True, {"k": ["\x1b[2Jv", 1]})) == (
        True, {"k": ["\ufffd[2Jv", 1]}, "", "")  # a terminal escape reaches no host screen
    for body, problem in [
        (msgpack.packb({"ok": True}), "exactly"),
        (msgpack.packb({"ok": 1, "value": None, "type": None, "message": None}), "not a bool"),
        (msgpack.packb({"ok": True, "value": b"raw", "type": None, "message": None}), "not JSON data"),
        (msgpack.packb({"ok": True, "value": [0] * (wire.MAX_SERVED_ITEMS + 1), "type": None, "message": None}),
         "msgpack"),
        (b"\x80" * (wire.MAX_SERVED_BYTES + 1), "more than the limit"),
        (__import__("pickle").dumps((True, 1, None, None)), "msgpack"),  # a pickle is never loaded
    ]:
        with pytest.raises(wire.WireError, match=problem):
            wire.decode_served("plain", body)


class _SlowStart(Store):
    """A server whose construction takes ``seconds``, as a Ray actor's fresh worker can
    on a loaded machine."""

    def __init__(self, seconds: float) -> None:
        threading.Event().wait(seconds)  # the slow start itself, not a synchronisation
        super().__init__()


@pytest.mark.slow
def test_a_server_start_longer_than_30_s_is_waited_for_within_its_own_bound(system: ActorSystem) -> None:
    """The subtree ``start_child`` makes for a server waits as long as the server's own
    start bound (here 60 s), not a fixed 30 s: a server taking 32 s to start is running
    afterwards, with its name."""
    spec = ChildSpec("slow", ProcessActor(_SlowStart, 32.0, start_timeout_ms=60_000), name="slow")
    ref = system.start_child(spec)
    assert system.whereis("slow") is ref
    assert ref.ask(ServerCall("put", ("k", 1)), timeout=WAIT_S) == "stored"
