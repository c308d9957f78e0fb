"""Isolations (DESIGN §5): looked up by name, each the one owner of its calls' deadlines;
the sandbox's channel frames messages the same way on both ends."""

from __future__ import annotations

import contextvars
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ISOLATIONS, ActorSystem, ErrorKind, Isolation, ToolCall
from rho_actors.sandbox.channel import Channel, DeadlineReached, Malformed

from .conftest import WAIT_S, Recorder, wait_for
from .helpers import make_tool


def test_the_isolations_are_looked_up_by_name() -> None:
    assert dict(ISOLATIONS).keys() == {"thread", "process", "ray"}
    assert all(issubclass(cls, Isolation) and cls.name == name for name, cls in ISOLATIONS.items())


def test_an_unknown_isolation_is_refused_naming_the_known_ones(system: ActorSystem) -> None:
    with pytest.raises(ValueError, match="isolation must be one of thread, process, ray, got 'gpu'"):
        system.register(make_tool("t"), isolation="gpu")


@pytest.mark.parametrize(("isolation", "consequence"), [("thread", "it was cancelled"),
                                                        ("process", "its worker process was killed")])
def test_a_deadline_gives_one_timeout_result_with_one_wording(
    tmp_path: Path, isolation: str, consequence: str
) -> None:
    release = threading.Event()
    hang = (lambda args, ctx: release.wait(WAIT_S)) if isolation == "thread" else (lambda args, ctx: time.sleep(60))
    with ActorSystem(data_dir=tmp_path, warm_workers=0, shutdown_ms=500) as system:
        recorder = Recorder()
        system.subscribe(recorder)
        loop = system.start_loop("s")
        if isolation == "process":  # the pool started (a first worker can take seconds under load): the kill is timed
            system.register(make_tool("ready", timeout_ms=int(WAIT_S * 1000)), isolation="process")
            assert loop.run_turn([ToolCall("r", "ready", "{}")])[0].ok
        # a process call may not have reached its worker by a 200 ms deadline on a loaded machine ("it did not
        # start", no worker killed): then again with a longer one
        for timeout_ms in (200, 800, 3_200):
            system.register(make_tool("hangs", hang, timeout_ms=timeout_ms), isolation=isolation)
            call_id = f"h{timeout_ms}"
            [result] = loop.run_turn([ToolCall(call_id, "hangs", "{}")])
            assert result.error_kind is ErrorKind.TIMEOUT
            said = f"tool 'hangs' did not finish within its timeout of {timeout_ms} ms;"
            if not result.content.startswith(f"{said} it did not start"):
                break
            system.unregister("hangs")
        assert result.content == f"{said} {consequence}"
        if isolation == "process":  # the pool kept the deadline: no second, discarded result
            assert wait_for(lambda: system.stats()["workers_killed"] == 1)
            assert recorder.kinds(call_id) == ["started", "timed_out"]
        else:  # the abandoned thread returns later: its result is reported late
            release.set()
            assert wait_for(lambda: recorder.kinds(call_id) == ["started", "timed_out", "late"])


def _pair() -> tuple[Channel, Channel, list[socket.socket]]:
    a, b = socket.socketpair()
    return Channel(a), Channel(b), [a, b]


def test_the_channel_frames_tags_and_bodies_both_ways() -> None:
    left, right, sockets = _pair()
    try:
        big = bytes(range(256)) * 4096  # more than one pipe buffer
        sender = threading.Thread(target=lambda: left.send(b"C", big, time.monotonic() + WAIT_S))
        sender.start()
        assert right.recv(time.monotonic() + WAIT_S) == (b"C", big)
        sender.join(WAIT_S)
        right.send(b"R", b"", time.monotonic() + WAIT_S)
        assert left.recv(time.monotonic() + WAIT_S) == (b"R", b"")
    finally:
        for s in sockets:
            s.close()


def test_the_channel_refuses_a_frame_over_its_limit_and_keeps_its_deadline() -> None:
    left, right, sockets = _pair()
    try:
        with pytest.raises(DeadlineReached):
            right.recv(time.monotonic() + 0.05)
        left.send(b"A", b"x" * 100, time.monotonic() + WAIT_S)
        with pytest.raises(Malformed, match="a message of 100 bytes, more than the limit of 10"):
            right.recv(time.monotonic() + WAIT_S, max_bytes=10)
        sockets[0].close()
        with pytest.raises(EOFError):
            Channel(sockets[1]).recv(time.monotonic() + WAIT_S)
    finally:
        for s in sockets:
            s.close()


def test_a_custom_isolation_only_needs_start() -> None:
    class Inline(Isolation):
        name = "inline"

        def start(self, call: Any) -> Any:
            call.reply(None)
            return self

    assert Inline.__abstractmethods__ == frozenset()
    with pytest.raises(TypeError):
        Isolation(None)  # type: ignore[abstract, arg-type]


class CtxReport:
    """A tool that answers what its ctx holds (keys, and the values the table of DESIGN
    §2 speaks of)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name

    def description(self) -> str:
        return "Says what its ctx holds."

    def parameter_schema(self) -> dict[str, Any]:
        return {"type": "object"}

    def run(self, args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"keys": sorted(ctx), "data_dir": str(ctx["data_dir"]), "deps": ctx.get("deps"),
                "withheld": list(ctx["withheld"]), "ids": [ctx["session_id"], ctx["call_id"]],
                "cancelled": ctx["cancel"].cancelled, "deadline": isinstance(ctx["deadline"], float)}


def test_each_isolation_gives_the_ctx_of_design_2s_table(tmp_path: Path) -> None:
    """The host's ctx is built once, by the loop; a worker gets the part that
    ``call_request`` cuts from it, as ``serve_request`` rebuilds it: an untrusted tool its
    registered deps and its worker's own folder, never the session's."""
    import json

    from rho_actors import untrusted

    portable = ["call_id", "cancel", "data_dir", "deadline", "deps", "session_id", "withheld"]
    # no traceparent: a tracer provider another test set in this process would add one (test_telemetry's)
    with ActorSystem(data_dir=tmp_path, warm_workers=0, shutdown_ms=2_000, tracing=False) as system:
        system.register(CtxReport("in_thread"))
        system.register(CtxReport("in_process"), isolation="process")
        system.register(untrusted(CtxReport("untrusted")), deps={"plain": [1, 2]})
        loop = system.start_loop("s1", deps={"session": "secret"}, withheld=["other"])
        results = loop.run_turn([ToolCall("c1", "in_thread", "{}"), ToolCall("c2", "in_process", "{}"),
                                 ToolCall("c3", "untrusted", "{}")])
        assert [r.ok for r in results] == [True, True, True], [r.content for r in results]
        thread, process, confined = (json.loads(r.content) for r in results)
        session_dir = str(loop.data_dir)
    assert thread["keys"] == sorted([*portable, "loop", "progress", "whereis"])
    assert process["keys"] == confined["keys"] == portable
    assert thread["data_dir"] == process["data_dir"] == session_dir and confined["data_dir"] == "."
    assert thread["deps"] == process["deps"] == {"session": "secret"} and confined["deps"] == {"plain": [1, 2]}
    assert [thread["ids"], process["ids"], confined["ids"]] == [["s1", "c1"], ["s1", "c2"], ["s1", "c3"]]
    assert all(r["withheld"] == ["other"] and r["cancelled"] is False and r["deadline"]
               for r in (thread, process, confined))


def test_an_untrusted_call_without_deps_sends_an_empty_mapping_never_the_sessions() -> None:
    """An untrusted tool registered without ``deps`` (or with an empty mapping) is sent
    ``{}`` (bytes made once), one with deps its own copy, a trusted call the session's."""
    import pickle
    from types import MappingProxyType

    from rho_actors.sandbox import wire

    ctx = {"session_id": "s1", "call_id": "c1", "deps": {"session": "secret"}}
    registered: list[Mapping[str, Any] | None] = [{}, MappingProxyType({}), MappingProxyType({"plain": [1]}), None]
    sent = [wire.call_request(b"d" * 32, wire.WorkerCall("c1", "t", object(), {}, ctx, 0.0, 1e9, 1000, 100,
                                                         deps=deps)).deps_bytes
            for deps in registered]
    assert [pickle.loads(b) for b in sent if b is not None] == [{}, {}, {"plain": [1]}, {"session": "secret"}]


_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("rho_test_request_id")


def test_call_request_is_the_one_cut_of_a_calls_ctx() -> None:
    """What crosses to another process: the portable keys, deps when picklable, the
    submitter's plain contextvars; an untrusted call its registered deps instead of the
    session's, its worker's folder, and no contextvars."""
    import dataclasses
    import pickle

    from rho_actors.sandbox import WorkerCall, call_request

    _REQUEST_ID.set("r1")
    ctx = {"session_id": "s", "call_id": "c", "data_dir": Path("/x"), "withheld": ["w"], "loop": object(),
           "deps": {"session": 1}, "whereis": print, "traceparent": "00-ab-cd-01"}
    trusted = WorkerCall("c", "t", object(), {"a": 1}, ctx, 0.0, 5.0, 5_000, 100, context=contextvars.copy_context())
    request = call_request(b"digest", trusted)
    assert request.fields == {"session_id": "s", "call_id": "c", "data_dir": Path("/x"), "withheld": ("w",),
                              "traceparent": "00-ab-cd-01", "context_values": {"rho_test_request_id": "r1"}}
    assert request.deps_bytes is not None and pickle.loads(request.deps_bytes) == {"session": 1}
    assert (request.call_id, request.name, request.timeout_ms, request.max_chars) == ("c", "t", 5_000, 100)
    confined = call_request(b"digest", dataclasses.replace(trusted, deps={"own": 2}))
    assert confined.fields["data_dir"] == Path(".") and "context_values" not in confined.fields
    assert confined.deps_bytes is not None and pickle.loads(confined.deps_bytes) == {"own": 2}


def _ctx_shape(args: Any, ctx: Any) -> str:
    """The ctx a worker built for the call: each key with its value's type (``deps``'s too)."""
    return repr(sorted((key, type(value).__name__) for key, value in ctx.items()))


def test_a_workers_warm_up_call_has_the_shape_of_a_real_first_call(tmp_path: Path) -> None:
    """The no-op call a worker runs before it says ``READY`` (``warm_up_request``) builds
    the ctx a real trusted call of a session builds (each key, each value's type: a
    session folder's ``pathlib`` path, text ids, the session's ``deps``), so that a real
    first call runs no code of its own for the first time in the worker."""
    from collections import OrderedDict

    from rho_actors.sandbox import wire
    from rho_actors.sandbox.worker import WorkerConfig, serve_request, warm_up_request

    shape = make_tool("shape", _ctx_shape)
    with ActorSystem(tmp_path, warm_workers=1) as system:
        system.register(shape, isolation="process")
        [real] = system.start_loop("s").run_turn([ToolCall("c", "shape", "{}")])
    assert real.ok, real.content
    request = warm_up_request()
    codec = wire.CODECS["pickle"]
    tag, body = serve_request(request, OrderedDict({request.digest: shape}), WorkerConfig("pickle", None), codec)
    assert tag == wire.RESULT
    assert codec.decode(body).content == real.content


def _wait_in_worker(args: Any, ctx: Any) -> str:
    Path(args["started"]).touch()
    time.sleep(600)  # killed with its worker at the system's stop
    return "never"


def test_a_process_call_runs_on_a_call_thread_counted_running_and_answered_at_the_stop(tmp_path: Path) -> None:
    """A ``process`` call is one job on a call thread, as a ``thread`` call is: no CallActor
    is started for it (DESIGN §4 step 3), ``tree()`` counts it running, and the system's
    stop kills its worker and waits for its thread to give the call its one result."""
    import pykka

    from rho_actors.isolation.call import CallActor

    waiting = make_tool("waiting", _wait_in_worker, timeout_ms=600_000)
    started = tmp_path / "started"
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=5_000)
    try:
        system.register(waiting, isolation="process")
        future = system.start_loop("s").submit_turn([ToolCall("w", "waiting", f'{{"started": "{started}"}}')])
        assert wait_for(lambda: started.exists() or future.done())
        assert not future.done(), future.result()
        assert pykka.ActorRegistry.get_by_class(CallActor) == []
        calls = {c["id"]: c for c in system.tree()["children"]}["calls"]
        assert calls["running"] == 1
    finally:
        system.stop()
    [result] = future.result(WAIT_S)
    assert result.call_id == "w" and result.error_kind in (ErrorKind.CANCELLED, ErrorKind.CRASHED)


def test_a_call_body_carries_the_deadline_and_tool_given_and_deps_travel_whole() -> None:
    """``encode_call`` writes the request as sent (its deadline once its worker has it, the
    tool's bytes to a worker that lacks them) without a copy of the request; deps arrive
    whole, plain or not."""
    import dataclasses
    import pickle

    from rho_actors.sandbox import WorkerCall, call_request, decode_call, encode_call

    deps = {"a": [1, 2.5, {"b": None, "c": (True, "x")}]}
    call = WorkerCall("c", "t", object(), {"k": "v"}, {"session_id": "s", "deps": deps}, 0.0, 5.0, 5_000, 100)
    request = call_request(b"digest", call)
    assert decode_call(encode_call(request)) == request
    back = decode_call(encode_call(request, deadline=7.5, tool_bytes=b"tool"))
    assert back == dataclasses.replace(request, deadline=7.5, tool_bytes=b"tool")
    assert back.deps_bytes is not None and pickle.loads(back.deps_bytes) == deps
    odd = call_request(b"digest", dataclasses.replace(call, ctx={"deps": {"f": lambda: 42, 1: "int key"}}))
    assert odd.deps_bytes is not None and pickle.loads(odd.deps_bytes)["f"]() == 42
