"""No child process the system started outlives ``ActorSystem.stop(0)``: a stop past its
timeout returns before its tree has stopped (the tree stops on behind it), so every kind
of child is looked at once it returned: a worker process running a call, a stateful
server's process (``ProcessActor``: one in a long call, whose actor stops only once the
call ends, and a confined one) and a stdio MCP server's process (``MCPServer``, which
its connection gives 4 s to exit once its stdin is closed). A pid counts as gone once no
process has it, a zombie's included (killed and reaped); every wait is bounded by
``WAIT_S``."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from rho_actors import ActorSystem, CallEvent, ChildSpec, ToolCall
from rho_actors.function_tool import tool
from rho_actors.isolation.servers import ProcessActor, ServerCall

from .conftest import WAIT_S, Recorder, wait_for
from .server_classes import Store

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(4 * WAIT_S)

FIXTURE = str(Path(__file__).parent / "mcp_fixtures" / "fixture_server.py")


@tool(timeout_ms=600_000)  # the stop ends its call, never its deadline
def nap(seconds: float) -> str:
    """Sleep ``seconds``."""
    time.sleep(seconds)
    return "rested"


class Staller:
    """A server whose ``stall`` marks that it began, then sleeps."""

    def stall(self, marker: str) -> str:
        Path(marker).write_text("began")
        time.sleep(600)
        return "done"


def running(pid: int) -> bool:
    """Whether a process (a zombie too) has ``pid``."""
    return Path(f"/proc/{pid}").exists()


def _server_pid(system: ActorSystem, name: str, cls: type, trusted: bool) -> int:
    system.start_child(ChildSpec(name, ProcessActor(cls, trusted=trusted), name=name))
    node = next(n for n in _walk(system.tree()) if n.get("id") == name and "server" in n)
    return int(node["server"]["pid"])  # the host's view (a confined one is pid 1 inside)


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("children", []):
        found.extend(_walk(child))
    return found


@pytest.mark.parametrize("timeout_s", [0.0])
def test_no_child_process_outlives_a_stop_past_its_timeout(tmp_path: Path, timeout_s: float) -> None:
    """``stop(0)``: the worker running a call, the servers' processes (trusted and
    confined) and the stdio MCP server's process are all gone once it returned."""
    pytest.importorskip("mcp")
    from rho_actors.mcp import MCPServer

    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    results: list[Any] = []
    turn: threading.Thread | None = None
    try:
        pids: dict[str, int] = {
            "server in a call": _server_pid(system, "stalled", Staller, True),
            "confined server": _server_pid(system, "confined", Store, False),
        }
        stalled = system.whereis("stalled")
        assert stalled is not None
        began = tmp_path / "began"
        stalled.ask(ServerCall("stall", (str(began),), timeout_ms=600_000), block=False)  # its stop waits for it
        assert wait_for(began.exists)
        marks = tmp_path / "marks"
        marks.mkdir()
        source = MCPServer(command=[sys.executable, FIXTURE, str(marks)], connect_timeout_s=WAIT_S)
        system.add_source(source, poll_s=None)
        assert wait_for(lambda: "echo" in {info.name for info in system.tools()})
        pids["MCP server"] = int((marks / "started").read_text())
        events = Recorder()
        system.subscribe(events, only=(CallEvent,))
        system.register(nap, isolation="process")
        loop = system.start_loop("s1")
        turn = threading.Thread(target=lambda: results.append(
            loop.run_turn([ToolCall("c1", "nap", '{"seconds": 600}')], timeout_s=4 * WAIT_S)), daemon=True)
        turn.start()
        assert wait_for(lambda: "started" in events.kinds("c1") and bool(system.worker_pids()))
        for number, pid in enumerate(system.worker_pids()):
            pids[f"worker {number}"] = pid
        assert all(map(running, pids.values())), pids
        system.stop(timeout_s=timeout_s)
        left = {what: pid for what, pid in pids.items() if running(pid)}
        assert not left, f"child processes outlived the system's stop(0): {left}"
    finally:
        system.stop()
        if turn is not None:
            turn.join(WAIT_S)
