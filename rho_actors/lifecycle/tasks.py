"""What a background call is to the host and the model (DESIGN §4 "Background calls"):
:class:`TaskInfo`, its statuses, and the texts that tell the model of a task. The
registry that runs them is :mod:`rho_actors.tasks`; this module is plain data, for the
agent loop below it as for the runtime."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final, Literal

from rho_actors.errors import RhoError
from rho_actors.results import failure
from rho_actors.tool import ToolInfo, ToolResult

__all__ = ["OPEN", "RUN_IN_BACKGROUND", "TaskHostStopped", "TaskInfo", "TaskStatus", "acknowledgement", "delivery_text",
           "offers_choice", "runs_as_task", "take_choice", "with_choice"]

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
"""MCP's task statuses (the tasks extension): the first two are open."""
OPEN: Final = frozenset({"working", "input_required"})
"""The statuses of a task that has not ended."""
_STARTED: Final = ("tool {tool!r} runs in the background as task {task_id}; its result will be given to you when "
                   "it finishes")
_DELIVERED: Final = "Background task {task_id} (tool {tool!r}, call {call_id}) {outcome}:\n{content}"
RUN_IN_BACKGROUND: Final = "run_in_background"
"""The argument by which the model chooses to run a call of a ``background="optional"``
tool in the background (pydantic-ai harness's name): offered in the tool's declaration
shown to the model (:func:`with_choice`), taken out of the call's arguments before they
are validated (:func:`take_choice`), never given to the tool."""
_CHOICE: Final = {
    "type": "boolean",
    "description": "Set to true to run this call in the background: you get a task id at once, can go on with "
                   "other work, and are given its result in a later message when it finishes.",
}


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


class TaskHostStopped(RhoError, RuntimeError):
    """What a waiter for a held task's end (``loop.task_result``) is told when the host
    stops first (as OTP tells a caller whose server went down): the task has not ended,
    its call waits for a decision in the session's transcript and the next host on the
    same ``data_dir`` takes both back. ``info``: the task as the host left it
    (``input_required``); ``str(err)`` names it and says so."""

    def __init__(self, info: TaskInfo) -> None:
        super().__init__(f"task {info.task_id} ({info.name}, call {info.call_id}) is still {info.status}: its host "
                         "stopped before its call was decided; the call stays held in its session's transcript, and "
                         "the next host on the same data_dir takes both back")
        self.info = info


def runs_as_task(declared: bool | str, chosen: bool | frozenset[str], call_id: str, asked: bool = False) -> bool:
    """Whether call ``call_id`` runs as a task: its tool is declared ``background=True``
    (``declared``), or ``"optional"`` and its turn's caller chose it (``chosen``: every
    such call, or their ids) or the model asked for it (``asked``: its
    ``run_in_background``)."""
    if declared is True:
        return True
    if declared != "optional":
        return False
    return asked or (chosen if isinstance(chosen, bool) else call_id in chosen)


def offers_choice(info: ToolInfo) -> bool:
    """Whether the model may choose to run a call of ``info``'s tool in the background:
    it is declared ``background="optional"`` and has no argument of its own named
    :data:`RUN_IN_BACKGROUND` (that one stays the tool's)."""
    if info.policy.background != "optional":
        return False
    properties = info.parameter_schema.get("properties")
    return not (isinstance(properties, dict) and RUN_IN_BACKGROUND in properties)


def with_choice(info: ToolInfo) -> ToolInfo:
    """``info`` as shown to a model that may choose (:func:`offers_choice`): its schema
    with the optional boolean :data:`RUN_IN_BACKGROUND` added (a shallow copy: the
    tool's own schema is not changed); any other ``info`` as it is."""
    if not offers_choice(info):
        return info
    schema = info.parameter_schema
    properties = schema.get("properties")
    shown = {**(properties if isinstance(properties, dict) else {}), RUN_IN_BACKGROUND: dict(_CHOICE)}
    return dataclasses.replace(info, parameter_schema={**schema, "properties": shown})


def take_choice(info: ToolInfo, call_id: str, args: dict[str, Any], allowed: bool) -> bool | ToolResult:
    """Take the model's :data:`RUN_IN_BACKGROUND` out of ``args`` (a call of ``info``'s
    tool, decoded, before its validation) when the tool offers the choice: whether it
    asked for the background, or the ``invalid_arguments`` refusal naming the argument
    when its value is not a boolean, or when the host does not let the model choose
    (``allowed`` false). False when there is nothing to take."""
    if RUN_IN_BACKGROUND not in args or not offers_choice(info):
        return False
    value = args.pop(RUN_IN_BACKGROUND)
    if not allowed:
        return failure("background_choice_forbidden", call_id, info.name)
    if not isinstance(value, bool):
        return failure("background_choice_invalid", call_id, info.name, value=repr(value)[:80])
    return value


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
