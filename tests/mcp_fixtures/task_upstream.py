"""An MCP server with the tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663),
built with the official SDK's ``MCPServer`` and its extension interface (the SDK ships
no tasks implementation of its own): for a client that declares the extension,
``slow_compute`` and ``failing_job`` calls become tasks (a flat ``CreateTaskResult``),
followed with ``tasks/get`` and stopped with ``tasks/cancel``; ``ask_who``'s task is
``input_required`` (an elicitation under its ``key`` argument, ``name`` by default) until
``tasks/update`` answers it;
``greet`` stays a plain call. Usage: task_upstream.py MARKS_DIR (it writes ``task-<n>`` when it creates a task,
``polled-task-<n>`` when its ``tasks/get`` comes, ``cancelled`` when one is cancelled).
For ``tests/test_mcp_modern_upstream.py`` and ``tests/test_mcp_gateway_tasks.py``."""

import asyncio
import itertools
import sys
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


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses", default_factory=dict)


_ASK_NAME = {"method": "elicitation/create", "params": {
    "mode": "form", "message": "Your name?",
    "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Tasks(Extension):
    identifier = TASKS

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Task[Any]] = {}
        self.state: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)
        self.slow_polls: dict[str, bool] = {}  # a task whose tasks/get answers take 5 s (slow_polls)
        self.keys: dict[str, str] = {}  # ask_who's task -> the key of its question
        self.answers: dict[str, asyncio.Future[Any]] = {}  # ask_who's task -> its answer

    def methods(self) -> list[MethodBinding]:
        return [MethodBinding("tasks/get", TaskParams, self.get),
                MethodBinding("tasks/update", UpdateParams, self.update),
                MethodBinding("tasks/cancel", TaskParams, self.cancel)]

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        declared = (ctx.session.client_capabilities.extensions or {}) if ctx.session.client_capabilities else {}
        if params.name == "greet" or TASKS not in declared:
            return await call_next(ctx)
        task_id = f"task-{next(self.ids)}"
        (MARKS / task_id).write_text(params.name)
        self.state[task_id] = {"taskId": task_id, "status": "working", "createdAt": _now(), "lastUpdatedAt": _now(),
                               "ttlMs": 60_000, "pollIntervalMs": 50}
        self.slow_polls[task_id] = params.name == "slow_polls"
        self.keys[task_id] = str((params.arguments or {}).get("key", "name"))

        async def asked() -> dict[str, Any]:
            answer = self.answers[task_id] = asyncio.get_running_loop().create_future()
            self.state[task_id].update(status="input_required", inputRequests={self.keys[task_id]: _ASK_NAME},
                                       lastUpdatedAt=_now())
            said = await answer
            self.state[task_id].pop("inputRequests")
            self.state[task_id].update(status="working", lastUpdatedAt=_now())
            hello = f"Hello, {said['content']['name']}!"
            return {"content": [{"type": "text", "text": hello}], "structuredContent": {"result": hello},
                    "isError": False}

        async def run() -> None:
            try:
                result = await asked() if params.name == "ask_who" else await call_next(ctx)
                dumped = (result.model_dump(by_alias=True, mode="json", exclude_none=True)
                          if hasattr(result, "model_dump") else dict(result))
                self.state[task_id].update(status="completed", result=dumped, lastUpdatedAt=_now())
            except asyncio.CancelledError:
                (MARKS / "cancelled.part").write_text(task_id)  # whole when the test sees it
                (MARKS / "cancelled.part").replace(MARKS / "cancelled")
                self.state[task_id].update(status="cancelled", lastUpdatedAt=_now())

        self.running[task_id] = asyncio.get_running_loop().create_task(run())
        return {"resultType": "task", **self.state[task_id]}

    def _known(self, params: TaskParams) -> dict[str, Any]:
        if params.task_id not in self.state:
            raise MCPError(INVALID_PARAMS, f"unknown task {params.task_id!r}")
        return self.state[params.task_id]

    async def get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        (MARKS / f"polled-{params.task_id}").touch()  # its client follows it
        if self.slow_polls.get(params.task_id):
            await anyio.sleep(5)  # a poll still unanswered at the caller's deadline
        return {"resultType": "complete", **self._known(params)}

    async def update(self, ctx: Any, params: UpdateParams) -> dict[str, Any]:
        answer = self.answers.get(params.task_id)
        key = self.keys.get(params.task_id, "name")
        if self._known(params)["status"] == "input_required" and key in params.input_responses and (
                answer is not None and not answer.done()):
            (MARKS / f"answered-{params.task_id}").write_text(str(params.input_responses[key]))
            answer.set_result(params.input_responses[key])
        return {"resultType": "complete"}

    async def cancel(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        if self._known(params)["status"] in ("working", "input_required"):
            self.running[params.task_id].cancel()
        return {"resultType": "complete"}


server = MCPServer("tasks", extensions=[Tasks()])


@server.tool()
def greet(name: str) -> str:
    """Greet at once (never a task)."""
    return f"Hello, {name}!"


@server.tool()
async def slow_compute(seconds: float) -> str:
    """Sleep ``seconds``, then answer (a task)."""
    await anyio.sleep(seconds)
    return f"computed after {seconds:g} s"


@server.tool()
async def slow_polls(seconds: float) -> str:
    """As slow_compute, but each ``tasks/get`` of its task takes 5 s to answer."""
    await anyio.sleep(seconds)
    return f"computed after {seconds:g} s"


@server.tool()
async def ask_who(key: str = "name") -> str:
    """Ask the client's name within the task (``input_required``, under ``key``), then greet."""
    return "never run: its task asks through tasks/get"


@server.tool()
async def failing_job() -> str:
    """Fail as a tool does (a task that completes with isError)."""
    raise ValueError("the job failed")


if __name__ == "__main__":
    server.run("stdio")
