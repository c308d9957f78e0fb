"""A stateful tool server under supervision: a key-value store that survives a crash.

The server is an actor (like an OTP GenServer) started in its own subtree under the
system's ``servers`` supervisor, with restart type ``permanent``; the ``kv`` tool reaches it by name through
``ctx["whereis"]``. When the server crashes, it is restarted with fresh state, the name
follows the new actor, and the session goes on.

Run: .venv/bin/python examples/kv_server.py
"""

import tempfile
import time
from collections.abc import Mapping
from typing import Any

from rho_actors import Actor, ActorSystem, ChildSpec, StartChild, ToolCall, kill, tool


class KvServer(Actor):
    """Owns one dict; answers ("put", key, value) and ("get", key, None)."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}

    def on_receive(self, message: Any) -> Any:
        op, key, value = message
        if op == "put":
            self.data[key] = value
            return "stored"
        return self.data.get(key, "(not set)")


@tool(timeout_ms=2_000)
def kv(op: str, key: str, ctx: Mapping[str, Any], value: str = "") -> str:
    """Put a value under a key ("put") or read it back ("get")."""
    server = ctx["whereis"]("kv")
    if server is None:
        raise RuntimeError("the kv server is restarting; try again")
    reply: str = server.ask((op, key, value), timeout=1.0)
    return reply


with tempfile.TemporaryDirectory() as data_dir, ActorSystem(data_dir=data_dir) as system:
    system.start_child(ChildSpec("kv", StartChild(KvServer), restart="permanent", name="kv"))
    system.register(kv)
    loop = system.start_loop("demo")

    def call(arguments: str) -> str:
        [result] = loop.run_turn([ToolCall("c", "kv", arguments)])
        return result.content

    print(call('{"op": "put", "key": "city", "value": "Lisbon"}'))
    print(call('{"op": "get", "key": "city"}'))
    before = system.whereis("kv")
    assert before is not None
    kill(before)  # the server crashes (exit reason "killed")
    give_up = time.monotonic() + 5
    while system.whereis("kv") in (None, before) and time.monotonic() < give_up:
        time.sleep(0.01)  # the supervisor restarts it
    print(call('{"op": "get", "key": "city"}'))  # fresh state after the restart
    servers = next(c for c in system.tree()["children"] if c["id"] == "servers")
    [kv_subtree] = servers["children"]  # each server has its own supervisor
    print("restarts:", kv_subtree["children"][0]["restarts"])
