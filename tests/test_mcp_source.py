"""rho consuming MCP servers built with the SDK's MCPServer (FastMCP), over stdio and
streamable HTTP, as a supervised source; and rho consuming itself through MCP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from rho_actors import ActorSystem, ErrorKind, Reply, ScriptedModel, SupervisorEvent, ToolCall
from rho_actors.mcp import MCPServer
from tests.conftest import WAIT_S, slack, wait_for
from tests.helpers import free_port, listening
from tests.mcp_fixtures import served_tools

FIXTURE = str(Path(__file__).parent / "mcp_fixtures" / "fixture_server.py")


def _offered(system: ActorSystem) -> set[str]:
    return {info.name for info in system.tools()}


LISTED = {"echo", "fail", "hang", "crash", "grow", "env"}
"""The fixture server's tools a test calls: a test waits for every tool it will call, not
for one of them (whatever order the offer changes in)."""


def _stdio(marks: Path, **kwargs: object) -> MCPServer:
    kwargs.setdefault("connect_timeout_s", WAIT_S)  # a server importing the SDK on a busy machine
    return MCPServer(command=[sys.executable, FIXTURE, str(marks)], env={"FIXTURE_TOKEN": "given"},
                     **kwargs)  # type: ignore[arg-type]


def test_stdio_server_tools_deadline_crash_restart_list_changed(system: ActorSystem, tmp_path: Path) -> None:
    deadline_s = slack(0.8)  # each call's: a quiet machine's 0.8 s, as this machine keeps up now
    source = _stdio(tmp_path, timeout_ms=int(deadline_s * 1000))
    handle = system.add_source(source, poll_s=None)
    assert wait_for(lambda: _offered(system) >= LISTED)
    # the broken declaration is left out, with its reason
    assert "bad name!" not in _offered(system)
    status = handle.status()["tools"]["bad name!"]
    assert not status["offered"] and "name" in status["reason"]

    # the connection is a subtree of the system's sources, with the source's own intensity
    [sources] = [n for n in system.tree()["children"] if n["id"] == "sources"]
    [subtree] = [n for n in sources["children"] if n["id"] == source.child_id]
    assert subtree["kind"] == "supervisor" and subtree["restart"] == "temporary"
    assert [c["id"] for c in subtree["children"]] == [source.child_id]
    assert system.whereis(source.child_id) is not None

    loop = system.start_loop("s1")
    [ok] = loop.run_turn([ToolCall("c1", "echo", {"text": "hi"})])
    assert ok.ok and ok.content == "hi"
    [bad] = loop.run_turn([ToolCall("c2", "echo", {"text": 3})])
    assert bad.error_kind is ErrorKind.INVALID_ARGUMENTS
    [failed] = loop.run_turn([ToolCall("c2b", "fail", {})])  # the server's isError: the tool's own error
    assert failed.error_kind is ErrorKind.TOOL_ERROR and "failed on purpose" in failed.content

    # the scrubbed environment: the allowlist and the explicit env only
    [env] = loop.run_turn([ToolCall("c3", "env", {})])
    seen = json.loads(env.content)
    assert seen["FIXTURE_TOKEN"] == "given" and "PATH" in seen
    assert set(seen) - {"FIXTURE_TOKEN", "PATH", "LANG", "TZ", "HOME"} <= {k for k in seen if k.startswith("LC_")}

    # a hanging tool: timeout on time, and the server received the cancellation
    started = time.monotonic()
    [hung] = loop.run_turn([ToolCall("c4", "hang", {"seconds": 30})])
    assert hung.error_kind is ErrorKind.TIMEOUT
    assert time.monotonic() - started < deadline_s + slack(1.0)
    # the server got the cancellation: the running hang saw it (a request cancelled before its
    # handler began is dropped by the SDK unstarted: under load the deadline can pass first)
    assert wait_for(lambda: (tmp_path / "cancelled").exists() or not (tmp_path / "hang-started").exists())

    # a crash mid-call: crashed, restarted, tools back, next call fine
    first_pid = (tmp_path / "started").read_text()
    [crashed] = loop.run_turn([ToolCall("c5", "crash", {})])
    assert crashed.error_kind is ErrorKind.CRASHED, crashed
    assert wait_for(lambda: source.connections == 2 and _offered(system) >= LISTED)
    assert (tmp_path / "started").read_text() != first_pid
    [again] = loop.run_turn([ToolCall("c6", "echo", {"text": "back"})])
    assert again.ok and again.content == "back"

    # tools/list_changed refreshes the offer
    assert "grown" not in _offered(system)
    [grew] = loop.run_turn([ToolCall("c7", "grow", {})])
    assert grew.ok
    assert wait_for(lambda: "grown" in _offered(system))
    [grown] = loop.run_turn([ToolCall("c8", "grown", {})])
    assert grown.ok and grown.content == "grown"

    # closing the source: its tools leave, a call names them unavailable
    handle.close()
    assert not {"echo", "grown"} & _offered(system)
    [gone] = loop.run_turn([ToolCall("c9", "echo", {"text": "x"})])
    assert gone.error_kind is ErrorKind.UNAVAILABLE


def test_a_server_that_keeps_dying_is_given_up_alone(system: ActorSystem, tmp_path: Path) -> None:
    reports: list[SupervisorEvent] = []
    system.subscribe(lambda e: reports.append(e) if isinstance(e, SupervisorEvent) else None)
    source = MCPServer(command=[sys.executable, "-c", "raise SystemExit(1)"], name="dies", max_restarts=1,
                       max_seconds=30)
    handle = system.add_source(source, poll_s=None)
    assert wait_for(lambda: any(r.kind == "gave_up" and r.supervisor == "source:mcp:dies" for r in reports))
    assert wait_for(lambda: system.whereis(source.child_id) is None)
    assert not system.stopped and handle.alive and system.whereis("sources") is not None
    assert not any(r.kind == "escalated" for r in reports)
    [sources] = [n for n in system.tree()["children"] if n["id"] == "sources"]
    assert source.child_id not in [n["id"] for n in sources["children"]]
    [call] = system.start_loop("d").run_turn([ToolCall("c1", "echo", "{}")])
    assert call.error_kind is ErrorKind.UNKNOWN_TOOL
    handle.close()  # detaching a given-up connection is fine



def test_http_server_tools_and_deadline(system: ActorSystem, tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, FIXTURE, str(tmp_path), "--http", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: listening(port), timeout_s=WAIT_S)  # a server importing the SDK on a busy machine
        deadline_s = slack(0.6)  # each call's: a quiet machine's 0.6 s, as this machine keeps up now
        source = MCPServer(url=f"http://127.0.0.1:{port}/mcp", headers={"X-Test": "1"},
                           timeout_ms=int(deadline_s * 1000))
        system.add_source(source, poll_s=None)
        assert wait_for(lambda: _offered(system) >= LISTED)
        loop = system.start_loop("h1")
        [ok] = loop.run_turn([ToolCall("c1", "echo", {"text": "over http"})])
        assert ok.ok and ok.content == "over http"
        started = time.monotonic()
        [hung] = loop.run_turn([ToolCall("c2", "hang", {"seconds": 30})])
        assert hung.error_kind is ErrorKind.TIMEOUT and time.monotonic() - started < deadline_s + slack(1.0)
        # the running hang saw the cancellation (one cancelled before its handler began is dropped unstarted)
        assert wait_for(lambda: (tmp_path / "cancelled").exists() or not (tmp_path / "hang-started").exists())
        [again] = loop.run_turn([ToolCall("c3", "echo", {"text": "still fine"})])
        assert again.ok
    finally:
        process.kill()
        process.wait(WAIT_S)


IMPOSTOR = str(Path(__file__).parent / "mcp_fixtures" / "impostor.py")


@pytest.mark.skipif(os.geteuid() != 0, reason="the impostor drops from root to uid 65534")
def test_a_loopback_url_sends_nothing_to_a_listener_of_another_uid(system: ActorSystem, tmp_path: Path) -> None:
    """While the real server is down, a process of another user takes its port: the
    source does not connect (no token, no request), says why, and offers no tools."""
    from rho_actors.mcp.peers import listener_uids

    port = free_port()
    shared = tmp_path / "impostor"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    record = shared / "received"
    impostor = subprocess.Popen([sys.executable, IMPOSTOR, str(port), str(record)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: listener_uids("127.0.0.1", port) == {65534})
        source = MCPServer(url=f"http://127.0.0.1:{port}/mcp", headers={"Authorization": "Bearer host-secret"},
                           name="pinned", connect_timeout_s=WAIT_S, max_restarts=1, max_seconds=30)
        handle = system.add_source(source, poll_s=None)
        assert wait_for(lambda: source._link.last_error is not None)
        assert "uid [65534]" in str(source._link.last_error) and "no headers sent" in str(source._link.last_error)
        assert not source.connected and source.connections == 0 and _offered(system) == set()
        assert not record.exists() or b"host-secret" not in record.read_bytes()
        assert not record.exists(), record.read_bytes()  # not even a connection was made
        handle.close()
    finally:
        impostor.kill()
        impostor.wait(WAIT_S)
    with pytest.raises(ValueError, match="exactly one"):
        MCPServer(server_uid=0)


def _own_address() -> str | None:
    """One of this host's IPv4 addresses that is not a loopback one, if it has one."""
    import psutil

    from rho_actors.mcp.peers import is_loopback

    found = sorted(info.address for infos in psutil.net_if_addrs().values() for info in infos
                   if info.family == socket.AF_INET and not is_loopback(info.address))
    return found[0] if found else None


@pytest.mark.skipif(os.geteuid() != 0, reason="the impostor drops from root to uid 65534")
@pytest.mark.parametrize("spelled", ["[::ffff:127.0.0.1]", "0.0.0.0", "own address"])
def test_a_url_reaching_this_host_by_any_spelling_is_pinned(system: ActorSystem, tmp_path: Path,
                                                           spelled: str) -> None:
    """A URL that reaches this host without naming loopback (an IPv4-mapped loopback
    address, the unspecified address, one of this host's own addresses) reaches a local
    listener all the same: one of another uid gets nothing."""
    from rho_actors.mcp.peers import listener_uids

    host, bind = spelled, "127.0.0.1"
    if spelled == "own address":
        own = _own_address()
        if own is None:
            pytest.skip("this host has no address but loopback ones")
        host = bind = own
    port = free_port()
    shared = tmp_path / "impostor"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    record = shared / "received"
    impostor = subprocess.Popen([sys.executable, IMPOSTOR, str(port), str(record), bind],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: listener_uids(bind, port) == {65534})
        source = MCPServer(url=f"http://{host}:{port}/mcp", headers={"Authorization": "Bearer host-secret"},
                           name="pinned", connect_timeout_s=WAIT_S, max_restarts=1, max_seconds=30)
        handle = system.add_source(source, poll_s=None)
        assert wait_for(lambda: source._link.last_error is not None)
        assert "uid [65534]" in str(source._link.last_error), source._link.last_error
        assert not record.exists(), record.read_bytes()  # not even a connection was made
        handle.close()
    finally:
        impostor.kill()
        impostor.wait(WAIT_S)


def test_rho_consumes_itself_through_mcp(system: ActorSystem, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", served_tools.__file__,
               "--data-dir", str(tmp_path)]
    system.add_source(MCPServer(command=command, name="self", env={"PYTHONPATH": os.getcwd()},
                                connect_timeout_s=WAIT_S), poll_s=None)
    assert wait_for(lambda: {"add", "picture"} <= _offered(system))
    loop = system.start_loop("e2e")
    model = ScriptedModel([
        Reply(tool_calls=(ToolCall("c1", "add", '{"a": 20, "b": 22}'), ToolCall("c2", "picture", "{}"))),
        Reply(text="the answer is 42"),
    ])
    result = loop.prompt("What is 20 + 22?", model=model)
    assert result.error is None and result.text == "the answer is 42"
    [step] = [s for s in result.steps if s.results]
    add, picture = step.results
    assert add.ok and add.content == "42"
    assert picture.ok and picture.content == "a picture"
    assert [i.data for i in picture.images] == [served_tools.PNG]


def test_mcp_server_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        MCPServer()
    with pytest.raises(ValueError, match="exactly one of"):
        MCPServer(command=["x"], url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="non-empty list"):
        MCPServer(command="python server.py")


def test_chat_with_an_mcp_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    import io

    import rho_actors.cli.commands as cli

    model = ScriptedModel([Reply(tool_calls=(ToolCall("c1", "echo", '{"text": "via mcp"}'),)), Reply("echoed")])
    monkeypatch.setattr(cli, "_chat_model", lambda spec, base_url: model)
    monkeypatch.setattr("sys.stdin", io.StringIO("echo something\n/exit\n"))
    argv = ["chat", "--model", "openai:x", "--data-dir", str(tmp_path / "data"),
            "--mcp", f"{sys.executable} {FIXTURE} {tmp_path}"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "echo" in out.split("tools:", 1)[1].splitlines()[0]
    assert "  <- echo [c1]: ok, " in out and out.rstrip().endswith("echoed")
    assert cli.main(["chat", "--model", "openai:x", "--data-dir", str(tmp_path / "data"), "--mcp", " "]) == 2
    assert "--mcp needs a command" in capsys.readouterr().err
