"""A host process for tests/test_approvals_durable.py: ``python -m tests.approval_host
DATA_DIR ACTION``. ``prompt``: a prompt whose reply asks for two deletions and a look,
then prints ``PENDING <ids>`` and waits to be killed (``prompt_put``: one idempotent
``put``; ``turn``: the same calls as a turn run directly, no prompt); ``approve
CALL_ID``: approves a call (printing ``APPROVING``) and waits."""

from __future__ import annotations

import sys
import time

from rho_actors import ActorSystem, Reply, ScriptedModel, ToolCall
from tests.approval_tools import Put, delete, look

REPLY = Reply(tool_calls=(ToolCall("c1", "delete", '{"path": "/a"}'), ToolCall("c2", "delete", '{"path": "/b"}'),
                          ToolCall("c3", "look", '{"path": "/"}')))


def main(data_dir: str, action: str, *rest: str) -> None:
    system = ActorSystem(data_dir=data_dir)
    system.register(delete)
    system.register(look)
    system.register(Put)
    loop = system.start_loop("s1")
    if action in ("prompt", "prompt_put"):
        reply = REPLY if action == "prompt" else Reply(tool_calls=(ToolCall("p1", "put", '{"key": "k"}'),))
        result = loop.prompt("clean up", model=ScriptedModel([reply]))
        print("PENDING", " ".join(p.call_id for p in result.pending), flush=True)
    elif action == "turn":
        results = loop.run_turn(REPLY.tool_calls)
        print("PENDING", " ".join(r.call_id for r in results if r.error_kind == "pending_approval"), flush=True)
    elif action == "approve":
        print("APPROVING", flush=True)
        loop.approve(rest[0], decided_by="host")
        print("APPROVED", flush=True)
    print("READY", flush=True)
    time.sleep(300)


if __name__ == "__main__":
    main(*sys.argv[1:])
