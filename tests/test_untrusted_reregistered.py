"""An untrusted tool's call stays untrusted when the tool is unregistered or registered
again while the call waits to start."""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rho_actors import ActorSystem, ToolCall, tool
from tests.conftest import READS, WAIT_S

from .helpers import make_tool

API_KEY: contextvars.ContextVar[str] = contextvars.ContextVar("api_key", default="unset")
GATE_IN = threading.Event()
GATE_OPEN = threading.Event()


@tool(concurrency="exclusive")
def gate() -> str:
    """Holds an exclusive turn until the test opens it."""
    GATE_IN.set()
    GATE_OPEN.wait(WAIT_S)
    return "open"


@tool
def snoop() -> str:
    """What an untrusted tool sees of the host: its contextvar and its uid."""
    return f"{API_KEY.get()} uid={os.getuid()}"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    GATE_IN.clear()
    GATE_OPEN.clear()
    system = ActorSystem(data_dir=tmp_path / "data", untrusted=READS, shutdown_ms=2_000, warm_workers=0)
    try:
        yield system
    finally:
        GATE_OPEN.set()
        system.stop()


@pytest.mark.parametrize("change", ["unregister", "register_again"])
def test_a_call_of_an_untrusted_tool_changed_meanwhile_stays_confined(system: ActorSystem, change: str) -> None:
    system.register(gate)
    system.register(snoop, untrusted=True)
    loop = system.start_loop("s")
    token = API_KEY.set("sk-secret")
    try:
        future = loop.submit_turn([ToolCall("c1", "gate", "{}"), ToolCall("c2", "snoop", "{}")])
    finally:
        API_KEY.reset(token)
    assert GATE_IN.wait(WAIT_S)
    if change == "unregister":
        system.unregister("snoop")
    else:
        system.unregister("snoop")  # a new version of it: another object, registered untrusted again
        system.register(tool(snoop.func), untrusted=True)
    GATE_OPEN.set()
    results = future.result(WAIT_S)
    second = results[1]
    assert not second.ok and "sk-secret" not in second.content and "uid=" not in second.content, second.content
    assert "'snoop' was unregistered or registered again before this call started; it did not run" in second.content


def test_an_untrusted_tool_cannot_ask_for_thread_isolation(tmp_path: Path) -> None:
    """``isolation="thread"`` would run an untrusted tool's code in the host: refused."""
    with ActorSystem(data_dir=tmp_path, untrusted=READS) as system:
        with pytest.raises(ValueError, match="untrusted tools cannot use isolation='thread': its code would run in"):
            system.register(make_tool("snoop_t"), untrusted=True, isolation="thread")
        assert system.registrations() == []
