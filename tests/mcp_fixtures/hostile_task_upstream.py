"""A hostile MCP server with the tasks extension (SEP-2663), built with the official SDK's
``MCPServer`` and its extension interface: every tool's call (but ``plain_wait``'s) becomes a task whose
creation or status is malformed or hostile in one way, for
``tests/test_hostile_mcp_gateway_tasks.py``. Usage: hostile_task_upstream.py MARKS_DIR
(it writes ``task-<n>`` naming the tool when it creates a task, ``cancelled-task-<n>``
when ``tasks/cancel`` names one, and waits for ``release`` before ``late_task``'s
creation is answered).

- ``no_task_id``: a ``CreateTaskResult`` without ``taskId``;
- ``number_task_id``: ``taskId`` a number;
- ``negative_poll`` / ``huge_poll``: ``pollIntervalMs`` of -5 and 10^12 (the task ends
  ``completed`` at its first ``tasks/get``);
- ``unknown_status``: its ``tasks/get`` says ``exploded``;
- ``result_not_object``: its ``tasks/get`` says ``completed`` with a string ``result``;
- ``upstream_fails``: its ``tasks/get`` says ``failed`` with a 100,000-character message;
- ``late_task``: the ``CreateTaskResult`` is answered only once ``release`` exists, and
  the server's loop is blocked until then (it reads a ``notifications/cancelled`` for the
  call only after it answered: a task made before the server read the cancel); the task
  then works until cancelled;
- ``plain_wait``: no task, a plain call that waits until it is cancelled (it writes
  ``started-plain_wait``, then ``cancelled-plain_wait`` when its call is cancelled).
"""

import itertools
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from pydantic import Field

TASKS = "io.modelcontextprotocol/tasks"
MARKS = Path(sys.argv[1])


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Tasks(Extension):
    identifier = TASKS

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.called: dict[str, str] = {}  # task id -> the tool called
        self.cancelled: set[str] = set()

    def methods(self) -> list[MethodBinding]:
        return [MethodBinding("tasks/get", TaskParams, self.get),
                MethodBinding("tasks/update", TaskParams, self.update),
                MethodBinding("tasks/cancel", TaskParams, self.cancel)]

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        if params.name == "plain_wait":
            return await call_next(ctx)
        task_id = f"task-{next(self.ids)}"
        self.called[task_id] = params.name
        (MARKS / task_id).write_text(params.name)
        created: dict[str, Any] = {"resultType": "task", "taskId": task_id, "status": "working",
                                   "createdAt": _now(), "lastUpdatedAt": _now(), "ttlMs": 60_000,
                                   "pollIntervalMs": 50}
        if params.name == "no_task_id":
            del created["taskId"]
        elif params.name == "number_task_id":
            created["taskId"] = 42
        elif params.name == "negative_poll":
            created["pollIntervalMs"] = -5
        elif params.name == "huge_poll":
            created["pollIntervalMs"] = 10**12
        elif params.name == "late_task":
            while not (MARKS / "release").exists():  # the gateway's client cancels meanwhile, unread
                time.sleep(0.02)
        return created

    async def get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        tool = self.called.get(params.task_id)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"unknown task {params.task_id!r}")
        state: dict[str, Any] = {"resultType": "complete", "taskId": params.task_id, "status": "working",
                                 "createdAt": _now(), "lastUpdatedAt": _now(), "ttlMs": 60_000,
                                 "pollIntervalMs": 50}
        if params.task_id in self.cancelled:
            state["status"] = "cancelled"
        elif tool in ("negative_poll", "huge_poll"):
            state.update(status="completed", result={"content": [{"type": "text", "text": f"{tool} done"}],
                                                     "isError": False})
        elif tool == "unknown_status":
            state["status"] = "exploded"
        elif tool == "result_not_object":
            state.update(status="completed", result="not an object")
        elif tool == "upstream_fails":
            state.update(status="failed", error={"code": -32603, "message": "disk on fire " + "x" * 100_000})
        return state

    async def update(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        return {"resultType": "complete"}

    async def cancel(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        (MARKS / f"cancelled-{params.task_id}").touch()
        self.cancelled.add(params.task_id)
        return {"resultType": "complete"}


server = MCPServer("hostile-tasks", extensions=[Tasks()])


def _tool(name: str) -> None:
    async def run() -> str:
        return "never run: the call is a task"

    run.__name__ = name
    server.tool(name=name, description=f"A task whose {name.replace('_', ' ')}.")(run)


@server.tool(description="A plain call that waits until it is cancelled.")
async def plain_wait() -> str:
    (MARKS / "started-plain_wait").touch()
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        (MARKS / "cancelled-plain_wait").touch()
        raise
    return "never: it waits until cancelled"


for _name in ("no_task_id", "number_task_id", "negative_poll", "huge_poll", "unknown_status", "result_not_object",
              "upstream_fails", "late_task"):
    _tool(_name)


if __name__ == "__main__":
    server.run("stdio")
