"""The README's quickstart (and docs/getting-started.md's first turn): two tools, one session, one turn of three calls.

Run: .venv/bin/python examples/quickstart.py
"""

import tempfile
import time

from rho_actors import ActorSystem, ToolCall, tool


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


@tool(timeout_ms=200)
def slow() -> str:
    """Take too long."""
    time.sleep(5)
    return "never seen"


with tempfile.TemporaryDirectory() as data_dir, ActorSystem(data_dir=data_dir) as system:
    system.register(add)
    system.register(slow)
    loop = system.start_loop("session-1")
    print(loop.declarations("openai")[0]["function"]["name"])  # what you send to the model
    results = loop.run_turn([  # what the model asked for, in its order
        ToolCall("call_1", "add", '{"a": 1, "b": 2}'),
        ToolCall("call_2", "add", '{"a": "one"}'),
        ToolCall("call_3", "slow", "{}"),
    ])
    for r in results:
        print(r.call_id, r.ok, r.error_kind, r.content)
