"""What a background call is to the host and the model (DESIGN §4 "Background calls"):
:class:`TaskInfo`, its statuses, and the texts that tell the model of a task. The
registry that runs them is :mod:`rho_actors.tasks`; this module is plain data, for the
agent loop below it as for the runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from rho_actors.tool import ToolResult

__all__ = ["OPEN", "TaskInfo", "TaskStatus", "acknowledgement", "delivery_text", "runs_as_task"]

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
"""MCP's task statuses (the tasks extension): the first two are open."""
OPEN: Final = frozenset({"working", "input_required"})
"""The statuses of a task that has not ended."""
_STARTED: Final = ("tool {tool!r} runs in the background as task {task_id}; its result will be given to you when "
                   "it finishes")
_DELIVERED: Final = "Background task {task_id} (tool {tool!r}, call {call_id}) {outcome}:\n{content}"


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """One background call (``loop.tasks()``): ``task_id``; its ``call_id`` and tool
    ``name``; ``status`` (MCP's: ``working``, ``input_required``, ``completed``,
    ``failed``, ``cancelled``); ``started`` and ``finished`` (Unix time, seconds;
    ``finished`` ``None`` while open); ``result`` (its :class:`~rho_actors.ToolResult`
    once ended); ``delivered``: whether the agent loop gave the model its result."""

    task_id: str
    call_id: str
    name: str
    session_id: str
    status: TaskStatus
    started: float
    finished: float | None = None
    result: ToolResult | None = None
    delivered: bool = False

    @property
    def open(self) -> bool:
        """Whether it has not ended (``working`` or ``input_required``)."""
        return self.status in OPEN


def runs_as_task(declared: bool | str, chosen: bool | frozenset[str], call_id: str) -> bool:
    """Whether call ``call_id`` runs as a task: its tool is declared ``background=True``
    (``declared``), or ``"optional"`` and its turn's caller chose it (``chosen``: every
    such call, or their ids)."""
    if declared is True:
        return True
    if declared != "optional":
        return False
    return chosen if isinstance(chosen, bool) else call_id in chosen


def acknowledgement(task_id: str, call_id: str, name: str) -> ToolResult:
    """The ``ok`` result a background call's turn gets at once: its text tells the model
    the call runs as task ``task_id``, ``details={"task_id": task_id}``."""
    return ToolResult(call_id, name, True, _STARTED.format(tool=name, task_id=task_id), details={"task_id": task_id})


def delivery_text(info: TaskInfo) -> str:
    """The message that gives the model task ``info``'s result at its next step (a user
    message: every provider takes one after a turn's tool results)."""
    result = info.result
    assert result is not None
    outcome = "finished" if result.ok else f"failed ({result.error_kind})"
    return _DELIVERED.format(task_id=info.task_id, tool=info.name, call_id=info.call_id, outcome=outcome,
                             content=result.content)
