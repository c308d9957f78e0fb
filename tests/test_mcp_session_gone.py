"""A source's HTTP server that restarts (and so no longer knows the connection's
session): the connection is replaced at once, a call of an idempotent tool is sent again
on the new session, any other call fails saying why, and the next call works."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from rho_actors import ActorSystem, ErrorKind
from rho_actors.mcp import MCPServer
from rho_actors.tool import ToolCall
from tests.conftest import WAIT_S, slack, wait_for
from tests.helpers import free_port, listening

UPSTREAM = str(Path(__file__).parent / "mcp_fixtures" / "annotated_upstream.py")




@contextlib.contextmanager
def _upstream(port: int) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, UPSTREAM, "--http", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: listening(port) or process.poll() is not None, timeout_s=WAIT_S * 2)
        assert process.poll() is None
        yield process
    finally:
        process.kill()
        process.wait(WAIT_S)


def test_a_restarted_server_gets_a_new_session_at_once(system: ActorSystem) -> None:
    port = free_port()
    source = MCPServer(url=f"http://127.0.0.1:{port}/mcp", name="up", connect_timeout_s=WAIT_S, mode="legacy",
                       ping_interval_s=300.0,  # nothing but the calls finds the session gone
                       idempotent_hints=True)  # wipe's idempotentHint is trusted: it is declared idempotent
    with _upstream(port):
        system.add_source(source, poll_s=None)
        assert wait_for(lambda: {"wipe", "lookup"} <= set(system.tool_set().entries))
        loop = system.start_loop("restarts")
        [first] = loop.run_turn([ToolCall("c1", "wipe", {})])
        assert first.ok, first.content
        connections = source.connections
    with _upstream(port):  # the same port, a new process: it knows no session
        began = time.monotonic()
        [again] = loop.run_turn([ToolCall("c2", "wipe", {})])  # idempotent: sent again on a new session
        assert again.ok and again.content == "wiped", again.content
        assert time.monotonic() - began < slack(5.0) and source.connections == connections + 1
    with _upstream(port):
        [refused] = loop.run_turn([ToolCall("c3", "lookup", {"key": "k"})])  # not idempotent: not sent again
        assert not refused.ok and refused.error_kind is ErrorKind.UNAVAILABLE
        assert "no longer knew this client's session" in refused.content
        assert "not declared idempotent" in refused.content
        assert wait_for(lambda: source.connections == connections + 2 and "lookup" in system.tool_set().entries)
        [after] = loop.run_turn([ToolCall("c4", "lookup", {"key": "k"})])
        assert after.ok and after.content == "value of k", after.content


def test_a_restarted_2026_server_needs_no_new_connection(system: ActorSystem) -> None:
    """At protocol 2026-07-28 there is no session to lose: a call to the restarted
    server just works, not idempotent either, on the same connection."""
    port = free_port()
    source = MCPServer(url=f"http://127.0.0.1:{port}/mcp", name="up", connect_timeout_s=WAIT_S,
                       ping_interval_s=300.0)
    with _upstream(port):
        system.add_source(source, poll_s=None)
        assert wait_for(lambda: {"wipe", "lookup"} <= set(system.tool_set().entries))
        assert source.protocol_version == "2026-07-28"
        loop = system.start_loop("restarts")
        [first] = loop.run_turn([ToolCall("c1", "lookup", {"key": "a"})])
        assert first.ok, first.content
        connections = source.connections
    with _upstream(port):
        [again] = loop.run_turn([ToolCall("c2", "lookup", {"key": "b"})])
        assert again.ok and again.content == "value of b", again.content
        assert source.connections == connections


def test_an_untrusted_idempotent_hint_does_not_send_a_call_again(system: ActorSystem) -> None:
    """The session-gone resend reads the tool's declared idempotence, as the governor does:
    an upstream's idempotentHint counts only where the host trusts its hints."""
    port = free_port()
    source = MCPServer(url=f"http://127.0.0.1:{port}/mcp", name="wary", connect_timeout_s=WAIT_S, mode="legacy",
                       ping_interval_s=300.0)
    with _upstream(port):
        system.add_source(source, poll_s=None)
        assert wait_for(lambda: "wipe" in system.tool_set().entries)
        assert not system.tool_set().entries["wipe"].info.policy.idempotent
        loop = system.start_loop("wary")
        [first] = loop.run_turn([ToolCall("c1", "wipe", {})])
        assert first.ok, first.content
    with _upstream(port):
        [refused] = loop.run_turn([ToolCall("c2", "wipe", {})])  # its hint says idempotent; not trusted
        assert not refused.ok and refused.error_kind is ErrorKind.UNAVAILABLE
        assert "not declared idempotent" in refused.content
