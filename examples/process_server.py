"""A stateful tool server in a process of its own: killed at a call's deadline, restarted fresh.

The key-value store lives in a worker process (``ProcessActor``), started in its own
subtree under the system's ``servers`` supervisor like any child, and found by name from
the ``kv`` tool (``call_server``). A call that runs past its deadline gets the process
really killed: its state is lost, the model is told so in the call's error result, and
the supervisor starts a fresh process within its restart intensity. ``trusted=False``
would run the same store confined as an untrusted worker (its own uid, Landlock...).

Run: .venv/bin/python examples/process_server.py
"""

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rho_actors import ActorSystem, ChildSpec, SupervisorEvent, ToolCall, ToolContext, tool
from rho_actors.isolation.servers import ProcessActor, ServerCall, call_server


class KvStore:
    """The server's state: one dict, in the server's process."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def put(self, key: str, value: str) -> str:
        self.data[key] = value
        return "stored"

    def get(self, key: str) -> str:
        return self.data.get(key, "(not set)")

    def pid(self) -> int:
        return os.getpid()

    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"


@tool(timeout_ms=10_000, concurrency="exclusive")
def kv(op: str, key: str, ctx: ToolContext, value: str = "") -> Any:
    """Put a value under a key ("put"), read it back ("get"), or run a slow operation ("slow")."""
    if op == "put":
        return call_server(ctx, "kv", "put", key, value)
    if op == "slow":
        return call_server(ctx, "kv", "slow", 60, timeout_ms=500)  # its own deadline: 500 ms
    return call_server(ctx, "kv", "get", key)


def main() -> None:
    with tempfile.TemporaryDirectory() as data_dir, ActorSystem(data_dir=data_dir) as system:
        restarted = threading.Event()

        def on_event(event: Any) -> None:
            if isinstance(event, SupervisorEvent) and event.kind == "restarted":
                restarted.set()

        system.subscribe(on_event)
        system.start_child(ChildSpec("kv", ProcessActor(KvStore), restart="permanent", name="kv"))
        system.register(kv)
        loop = system.start_loop("demo")

        def call(arguments: str) -> str:
            [result] = loop.run_turn([ToolCall("c", "kv", arguments)])
            return result.content if result.ok else f"[{result.error_kind}] {result.content}"

        print(call('{"op": "put", "key": "city", "value": "Lisbon"}'))
        print(call('{"op": "get", "key": "city"}'))
        server = system.whereis("kv")
        assert server is not None
        pid = server.ask(ServerCall("pid"))
        print(call('{"op": "slow", "key": "-"}'))  # past its deadline: the process is killed
        print("old process gone:", not Path(f"/proc/{pid}").exists())
        assert restarted.wait(30)  # the supervisor started a fresh one
        print(call('{"op": "get", "key": "city"}'))  # fresh state
        servers = next(c for c in system.tree()["children"] if c["id"] == "servers")
        [[node]] = [s["children"] for s in servers["children"]]
        print("restarts:", node["restarts"], "isolation:", node["server"]["isolation"])


if __name__ == "__main__":  # the server's process is started by a fork server that imports this script
    main()
