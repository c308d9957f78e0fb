"""An MCP server as a source, as a new user meets it: default names that say what the
command runs (``python -m a`` and ``python -m b`` differ), a name collision that names both, the server's
stderr in the log under its name (bounded), a server that cannot start failing once
and at once, and ``structuredContent`` kept in a result's details. Real SDK-built
servers over stdio."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from loguru import logger

from rho_actors import ActorSystem, ToolCall
from rho_actors.mcp import MCPServer
from rho_actors.mcp.source import default_name
from rho_actors.mcp.stderr_log import MAX_LINE_BYTES, MAX_LINES_PER_WINDOW, StderrLog
from tests.conftest import WAIT_S, slack, wait_for

FIXTURE = str(Path(__file__).parent / "mcp_fixtures" / "fixture_server.py")
MODULE = "tests.mcp_fixtures.fixture_server"


def test_default_names_say_what_the_command_runs_by_the_gateways_rule() -> None:
    from rho_actors.mcp.names import numbered

    assert default_name(["python", "-m", "a"]) == "a" and default_name(["python", "-m", "b"]) == "b"
    assert default_name(["/usr/bin/python3", "/srv/tools/weather.py", "--port", "3"]) == "weather"
    assert default_name(["npx", "-y", "@modelcontextprotocol/server-everything"]) == "server-everything"
    assert default_name(["uvx", "mcp-server-git", "--repository", "/srv/repo"]) == "mcp-server-git"
    assert default_name(["docker", "run", "-i", "--rm", "mcp/time:latest"]) == "time"
    assert default_name(None, "http://127.0.0.1:8000/mcp") == "127_0_0_1-8000"
    assert default_name(["python", "-c", "..."]) == "python"  # nothing better in the command: give name=
    long = default_name(["python", "-m", "a_module_with_a_name_longer_than_thirty_two_characters_"])
    assert len(long) == 32 and "__" not in long and not long.endswith("_")
    assert numbered("time", {"time", "time-2"}) == "time-3" and len(numbered(long, {long})) == 32
    assert MCPServer(command=["python", "-m", "a"]).name == "a"
    with pytest.raises(ValueError, match="needs a command"):
        default_name([])


def test_two_servers_of_one_module_collide_by_name_and_the_message_names_both(
        system: ActorSystem, tmp_path: Path) -> None:
    env = {"PYTHONPATH": os.getcwd()}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    def of(marks: str, name: str | None = None) -> MCPServer:
        return MCPServer(command=[sys.executable, "-m", MODULE, str(tmp_path / marks)], env=env, name=name,
                         connect_timeout_s=WAIT_S)

    first, again = of("a"), of("b")
    assert first.name == again.name == "fixture_server"
    system.add_source(first, poll_s=None)
    assert first.connected
    with pytest.raises(ValueError) as caught:
        system.add_source(again, poll_s=None)
    message = str(caught.value)
    assert "a source named 'fixture_server' is already added" in message
    assert str(tmp_path / "a") in message and str(tmp_path / "b") in message  # both commands, in full
    assert "name=..." in message
    assert not again.connected  # nothing of it was started
    second = of("b", name="fixture-b")
    system.add_source(second, poll_s=None)
    assert second.connected and second.child_id == "mcp:fixture-b"


def test_a_servers_stderr_goes_to_the_log_under_its_name_and_structured_content_to_details(
        system: ActorSystem, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    records: list[tuple[str, dict[str, object]]] = []
    logger.enable("rho_actors")
    sink = logger.add(lambda m: records.append((m.record["message"], dict(m.record["extra"]))), level="INFO")
    try:
        source = MCPServer(command=[sys.executable, FIXTURE, str(tmp_path)], name="loud",
                           connect_timeout_s=WAIT_S)
        system.add_source(source, poll_s=None)
        [said] = system.start_loop("s").run_turn([ToolCall("c1", "shout", {"text": "hello there"})])
        assert said.ok and said.content == "hello there"
        assert wait_for(lambda: ("MCP server loud: stderr says: hello there", {"mcp_server": "loud"}) in records)
        # and an upstream's structuredContent is kept in the result's details, for the host
        [weather] = system.start_loop("s2").run_turn([ToolCall("c2", "weather", {"city": "Oslo"})])
        assert weather.ok and weather.details == {"structuredContent": {"city": "Oslo", "celsius": 21}}
    finally:
        logger.remove(sink)
        logger.disable("rho_actors")
    raw = capfd.readouterr().err
    assert not any(line.startswith("stderr says:") for line in raw.splitlines())  # never raw on the terminal


def test_stderr_is_bounded_per_line_and_per_window() -> None:
    seen: list[str] = []
    logger.enable("rho_actors")
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="INFO",  # this server's lines only
                      filter=lambda record: record["extra"].get("mcp_server") == "bounded")
    try:
        log = StderrLog("bounded")
        log.writer.write("x" * (MAX_LINE_BYTES * 3) + "\n")  # one line of 3 reads
        for i in range(MAX_LINES_PER_WINDOW + 50):
            log.writer.write(f"line {i}\n")
        log.writer.write("the last words\n")
        log.close_writer()
        assert log.done.wait(WAIT_S)
    finally:
        logger.remove(sink)
        logger.disable("rho_actors")
    assert log.logged == MAX_LINES_PER_WINDOW and log.dropped == 1 + MAX_LINES_PER_WINDOW + 50 + 1 - 100
    assert seen[0] == f"MCP server bounded: {'x' * MAX_LINE_BYTES} [cut]"
    assert seen[-1] == "MCP server bounded: 52 more stderr lines were not logged"
    assert log.last().endswith("the last words")


def test_stderr_control_characters_are_shown_escaped() -> None:
    seen: list[str] = []
    logger.enable("rho_actors")
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="INFO",  # this server's lines only
                      filter=lambda record: record["extra"].get("mcp_server") == "sly")
    try:
        log = StderrLog("sly")
        os.write(log.writer.fileno(), "\x1b[2Jcleared\rover \u202eevil\n".encode())  # as a process writes it
        log.close_writer()
        assert log.done.wait(WAIT_S)
    finally:
        logger.remove(sink)
        logger.disable("rho_actors")
    assert seen == ["MCP server sly: \\x1b[2Jcleared\\rover \\u202eevil"]
    assert log.last() == "\\x1b[2Jcleared\\rover \\u202eevil"


def test_a_server_that_cannot_start_fails_once_and_at_once(system: ActorSystem, tmp_path: Path) -> None:
    missing = MCPServer(command=["no-such-command", "--flag"], connect_timeout_s=3 * WAIT_S)
    started = time.monotonic()
    with pytest.raises(FileNotFoundError, match="its program 'no-such-command' is not found on PATH="):
        system.add_source(missing, poll_s=None)
    assert time.monotonic() - started < slack(2.0)
    assert system.whereis(missing.child_id) is None  # nothing was started, nothing restarts

    exits = MCPServer(command=[sys.executable, "-c", "import sys; sys.exit('bad config: no API key')"],
                      name="exits", connect_timeout_s=3 * WAIT_S, max_restarts=0)
    started = time.monotonic()
    system.add_source(exits, poll_s=None)
    assert time.monotonic() - started < WAIT_S  # the first failure ends the wait, not connect_timeout_s
    assert not exits.connected
    assert exits.last_error is not None and "bad config: no API key" in exits.last_error


def test_the_chat_command_says_once_that_a_server_cannot_start(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from rho_actors.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used")
    code = main(["chat", "--model", "openai:gpt-4o", "--base-url", "http://127.0.0.1:9/v1", "--data-dir",
                 str(tmp_path), "--mcp", "no-such-command"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()  # one message, from the look-up before any start
    assert len(err) == 1 and "its program 'no-such-command' is not found" in err[0], err


def test_a_given_up_servers_tools_say_it_was_given_up_why_and_what_brings_it_back(
        system: ActorSystem, tmp_path: Path) -> None:
    from rho_actors import ErrorKind

    source = MCPServer(command=[sys.executable, FIXTURE, str(tmp_path)], name="fixture", max_restarts=0,
                       max_seconds=5, connect_timeout_s=3 * WAIT_S)
    handle = system.add_source(source, poll_s=None)
    loop = system.start_loop("given-up")
    [crashed] = loop.run_turn([ToolCall("c1", "crash", {})])
    assert crashed.error_kind is ErrorKind.CRASHED
    assert wait_for(lambda: source.given_up is not None)
    assert source.last_error is not None and "the server closed the connection" in source.last_error
    # its withdrawn tools get the given-up text at the source's next scan, after the give-up
    assert wait_for(lambda: "given up" in str(system.tool_set().unavailable.get("echo", "")))
    [gone] = loop.run_turn([ToolCall("c2", "echo", {"text": "x"})])
    assert gone.error_kind is ErrorKind.UNAVAILABLE
    assert gone.content == (
        "tool 'echo' cannot be called: MCP server fixture was given up: it failed past its restart intensity "
        f"(0 restarts in 5 s) and is not restarted again; its last error: {source.last_error}; to start it "
        "afresh, remove the source and add it again (SourceHandle.close(), then ActorSystem.add_source())")
    handle.close()
    system.add_source(source, poll_s=None)  # what the text says brings it back
    [back] = loop.run_turn([ToolCall("c3", "echo", {"text": "back"})])
    assert back.ok and back.content == "back"


def test_a_connection_whose_client_thread_does_not_end_at_its_stop_says_so_naming_the_server(
        monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    """A stopping connection waits a bounded time for its client thread (a transport that
    does not let go); when it gives up, the log says so, naming the server (it gave up
    without a word)."""
    import threading
    from types import SimpleNamespace

    from rho_actors.mcp import connection
    from rho_actors.mcp.connection import Link, MCPConnection

    monkeypatch.setattr(connection, "_HALT_WAIT_S", 0.01)
    server = SimpleNamespace(name="stuck-server", refresh_offer=lambda: None)
    actor = MCPConnection(server, Link())
    release = threading.Event()
    actor._thread = threading.Thread(target=release.wait, args=(WAIT_S,), daemon=True)  # a client that holds on
    actor._thread.start()
    try:
        actor.on_stop()
    finally:
        release.set()
        actor._thread.join(WAIT_S)
    assert any("MCP server stuck-server: its client thread did not end" in line for line in logs), logs
