"""An upstream server's MCP Tasks, consumed (SEP-2663; design mcp "MCP Tasks, consumed"):
a call an upstream answers with a ``CreateTaskResult`` is followed to the task's end
(:class:`TaskFollowing`, the part of :class:`~rho_actors.mcp.MCPServer` that does it).

An upstream is untrusted input, so everything it says of a task is checked before it is
used (:func:`created_task`, :func:`task_status`, pydantic in strict mode): a ``taskId``
a string of 1 to 256 characters (and, in a status, the call's own), ``status`` one of the
five, ``pollIntervalMs`` a number, which is clamped to [:data:`MIN_POLL_S`,
:data:`MAX_POLL_S`] whatever it says, ``result`` and ``error`` objects, an error's
``message`` and a ``statusMessage`` strings (shown bounded). A malformed creation or
status ends the call with ``mcp_task_malformed`` naming the server, what it answered and
what was wrong, and ``tasks/cancel`` is sent (not waited for) whenever the task's id is
known. A task the upstream ends ``failed`` (or that is malformed) is a failure whose
result's ``details`` say :data:`FAILED` so that a served client's task ends ``failed``
too, not ``completed`` with ``isError``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

import mcp_types as types
from loguru import logger
from mcp.client._input_required import DEFAULT_INPUT_REQUIRED_MAX_ROUNDS
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from rho_actors.mcp.bounds import shown_text
from rho_actors.mcp.connection import Link
from rho_actors.mcp.content import rho_value
from rho_actors.results import TEXTS, text
from rho_actors.tool import ToolFailure

__all__ = ["FAILED", "MAX_INPUT_ROUNDS", "MAX_POLL_S", "MAX_TASK_QUESTIONS", "MIN_POLL_S", "CreatedTask",
           "MalformedTask", "TaskFollowing", "TaskStatus", "created_task", "task_status", "tool_failure"]

MIN_POLL_S: Final = 0.05
"""The shortest wait between two ``tasks/get`` of an upstream's task, whatever its ``pollIntervalMs``."""
MAX_POLL_S: Final = 5.0
"""The longest wait between two ``tasks/get`` of an upstream's task, whatever its ``pollIntervalMs``."""
MAX_TASK_QUESTIONS: Final = 64
"""The most questions an upstream's ``input_required`` task may ask at once (its ``inputRequests``)."""
MAX_INPUT_ROUNDS: Final = DEFAULT_INPUT_REQUIRED_MAX_ROUNDS
"""The most ``input_required`` rounds of one call of a 2026-07-28 server (the SDK's own bound)."""
FAILED: Final = {"task_status": "failed"}
"""The ``details`` of a call's failure that is an upstream task's ``failed`` (or a malformed task)."""
_OPEN_TASK: Final = ("working", "input_required")
_MAX_KEY_CHARS: Final = 256  # the longest key of an upstream task's question
_SHOWN_PROBLEM: Final = 300  # characters of a malformed task's problem shown
_RAW: Any = TypeAdapter(dict[str, Any])  # a result as JSON (the SDK's parameter is typed for models)


class _Label(str):
    """A tool's label (:func:`rho_actors.results.called_as`), shown as is by ``{tool!r}`` too."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def tool_failure(key: str, tool: str, failed: bool = False, **fields: Any) -> ToolFailure:
    """The :class:`ToolFailure` of situation ``key`` of the results table (``tool``: the
    tool's label, :func:`rho_actors.results.called_as`); ``failed``: an upstream task's
    failure (its result's ``details`` are :data:`FAILED`)."""
    return ToolFailure(TEXTS[key][0], text(key, tool=_Label(tool), **fields), details=FAILED if failed else None)


class MalformedTask(ValueError):
    """What an upstream said of a task is not a valid task: ``str()`` says what was wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)


class CreatedTask(_Strict):
    """A server's ``CreateTaskResult`` (SEP-2663: flat, ``resultType: "task"``), checked."""

    task_id: str = Field(alias="taskId", min_length=1, max_length=256)
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    poll_interval_ms: float | None = Field(default=None, alias="pollIntervalMs", allow_inf_nan=False)

    @property
    def poll_s(self) -> float:
        """The wait between two ``tasks/get`` (seconds): its ``pollIntervalMs`` (1 s when
        it gives none) clamped to [:data:`MIN_POLL_S`, :data:`MAX_POLL_S`]."""
        asked = 1.0 if self.poll_interval_ms is None else self.poll_interval_ms / 1000
        return min(MAX_POLL_S, max(MIN_POLL_S, asked))


class _Error(_Strict):
    code: int = Field(ge=-(2**31), lt=2**31)  # JSON-RPC's codes are 32-bit
    message: str


class TaskStatus(CreatedTask):
    """A server's answer to ``tasks/get`` (its ``DetailedTask``), checked; its ``taskId`` may be left out."""

    task_id: str = Field(default="", alias="taskId", max_length=256)
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")
    result: dict[str, Any] | None = None
    error: _Error | None = None
    status_message: str | None = Field(default=None, alias="statusMessage")


def _problem(err: ValidationError) -> str:
    """The first of pydantic's errors, as ``field: what (got value)``, bounded."""
    first = err.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "the result"
    got = "" if first["type"] == "missing" else f" (got {shown_text(repr(first.get('input')), 60)})"
    return f"{where}: {first['msg']}{got}"[:_SHOWN_PROBLEM]


def created_task(raw: Mapping[str, Any]) -> CreatedTask:
    """``raw`` (a ``tools/call`` result with ``resultType: "task"``) checked; raises :class:`MalformedTask`."""
    try:
        return CreatedTask.model_validate(dict(raw))
    except ValidationError as err:
        raise MalformedTask(_problem(err)) from None


def task_status(raw: Mapping[str, Any], task_id: str) -> TaskStatus:
    """``raw`` (a ``tasks/get`` result for task ``task_id``) checked; raises
    :class:`MalformedTask` (another task's id, ``completed`` without a ``result`` object too)."""
    try:
        status = TaskStatus.model_validate(dict(raw))
    except ValidationError as err:
        raise MalformedTask(_problem(err)) from None
    if status.task_id not in ("", task_id):
        raise MalformedTask(f"taskId: it names another task ({shown_text(status.task_id, 60)!r})")
    if status.status == "completed" and status.result is None:
        raise MalformedTask("result: a completed task needs a result object")
    return status


class TaskFollowing:
    """The part of :class:`~rho_actors.mcp.MCPServer` that follows an upstream's tasks."""

    name: str
    connect_timeout_s: float

    def _send(self, link: Link, label: str, request: Any, ctx: Mapping[str, Any], deadline: float,
              kept: Any = None) -> dict[str, Any]:
        raise NotImplementedError

    def _answers(self, label: str, asked: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _timed_out(self, tool: str) -> ToolFailure:
        raise NotImplementedError

    def _created(self, link: Link, label: str, raw: Mapping[str, Any]) -> CreatedTask:
        """A ``CreateTaskResult`` checked; malformed, the call fails (its task cancelled when its id is known)."""
        try:
            return created_task(raw)
        except MalformedTask as bad:
            raise self._malformed(link, label, "a CreateTaskResult", bad, raw.get("taskId")) from None

    def _malformed(self, link: Link, label: str, what: str, bad: MalformedTask, task_id: Any) -> ToolFailure:
        """The call's failure for a malformed task; ``tasks/cancel`` sent for ``task_id`` when it is one."""
        known = isinstance(task_id, str) and 0 < len(task_id) <= 256
        if known:
            self._cancel_task(link, task_id)
        fate = f"tasks/cancel was sent for its task {shown_text(task_id, 60)!r}" if known else \
            "it named no task id to cancel"
        logger.warning("MCP server {}: {} is not a valid task: {}", self.name, what, bad)
        return tool_failure("mcp_task_malformed", label, True, server=self.name, what=what, problem=str(bad),
                            fate=fate)

    def _cancel_late(self, link: Link, label: str, raw: Mapping[str, Any]) -> None:
        """The answer to a ``tools/call`` cancelled before it came (kept for it): the task
        it made, if any, is cancelled now (a malformed one too when its id is known)."""
        task_id = raw.get("taskId")
        if raw.get("resultType") == "task" and isinstance(task_id, str) and 0 < len(task_id) <= 256:
            logger.info("MCP server {}: call of {} was cancelled before its task {} was made: tasks/cancel sent",
                        self.name, label, shown_text(task_id, 60))
            self._cancel_task(link, task_id)

    def _follow(self, link: Link, label: str, task: CreatedTask, ctx: Mapping[str, Any], deadline: float) -> Any:
        """Follow the task a server made of a call (SEP-2663) with ``tasks/get``, every
        :attr:`CreatedTask.poll_s`, until it ends: the call's one deadline bounds the task
        as a whole, and at it, or at the call's cancellation, ``tasks/cancel`` is sent (not
        waited for) and the call's result is ``timeout`` (``cancelled``). ``input_required``:
        its ``inputRequests`` not answered yet are asked of the call's own MCP client
        (:meth:`_relay_input`) and the answers sent with ``tasks/update``, at most
        :data:`MAX_INPUT_ROUNDS` times. ``completed``: the task's ``result`` as the call's;
        ``failed``: ``mcp_task_failed`` with its error (bounded); ``cancelled`` by the
        server: ``mcp_task_ended``; a malformed status: ``mcp_task_malformed``. Whatever
        ends the call while the task is open (a question unanswered included) cancels the task."""
        cancel, status = ctx.get("cancel"), TaskStatus.model_validate(task.model_dump(by_alias=True))
        answered: set[str] = set()
        rounds = 0
        while status.status in _OPEN_TASK:
            try:
                if status.status == "input_required":
                    rounds += self._relay_input(link, label, task.task_id, status, answered, ctx, deadline, rounds)
                pause = min(status.poll_s, deadline - time.monotonic())
                if cancel is not None:
                    stopped = cancel.wait(max(0.0, pause))
                else:
                    time.sleep(max(0.0, pause))
                    stopped = False
                if stopped or time.monotonic() >= deadline:
                    reason = getattr(cancel, "reason", None) or "timeout"
                    raise self._timed_out(label) if reason == "timeout" else tool_failure("cancelled", label,
                                                                                          reason=reason)
                raw = self._send(link, label, types.GetTaskRequest(params=types.GetTaskRequestParams(
                    task_id=task.task_id)), ctx, deadline)
                try:
                    status = task_status(raw, task.task_id)
                except MalformedTask as bad:
                    raise self._malformed(link, label, "a task status", bad, None) from None
            except BaseException:  # the deadline, a cancel (during a poll too), a question unanswered: the task ends
                self._cancel_task(link, task.task_id)
                raise
        if status.status == "completed" and status.result is not None:
            try:
                return rho_value(types.CallToolResult.model_validate(status.result))
            except ValidationError as err:
                raise self._malformed(link, label, "a task's result", MalformedTask(_problem(err)),
                                      task.task_id) from None
        if status.status == "failed":
            error = status.error
            said = error.message if error is not None else status.status_message or "no message"
            raise tool_failure("mcp_task_failed", label, True, server=self.name,
                               code=error.code if error is not None else "none", message=shown_text(said, 2000))
        raise tool_failure("mcp_task_ended", label, server=self.name, status=status.status)

    def _relay_input(self, link: Link, label: str, task_id: str, status: TaskStatus, answered: set[str],
                     ctx: Mapping[str, Any], deadline: float, rounds: int) -> int:
        """An ``input_required`` task's questions not answered yet (``answered``: the keys
        sent so far, which a server may still show until it took them) asked of the
        call's client, and the answers sent with ``tasks/update``; the rounds this took (0
        or 1). A question that is not an MCP request (elicitation, sampling, roots), over
        :data:`MAX_TASK_QUESTIONS` at once, keyed over 256 characters, or past
        :data:`MAX_INPUT_ROUNDS` rounds ends the call (``mcp_input_unanswered``)."""
        raw = status.input_requests or {}
        fresh = {k: v for k, v in raw.items() if k not in answered}
        if not fresh:
            return 0
        if len(fresh) > MAX_TASK_QUESTIONS or rounds >= MAX_INPUT_ROUNDS or any(
                len(key) > _MAX_KEY_CHARS for key in fresh):
            raise tool_failure("mcp_input_unanswered", label, server=self.name,
                               reason=f"its task asked more than {MAX_TASK_QUESTIONS} questions at once, in more "
                                      f"than {MAX_INPUT_ROUNDS} rounds, or under a key over {_MAX_KEY_CHARS} "
                                      "characters")
        try:
            asked = types.InputRequiredResult.model_validate({"inputRequests": fresh}).input_requests or {}
        except ValidationError:
            raise tool_failure("mcp_input_unanswered", label, server=self.name,
                               reason="its task asked something that is not an MCP request") from None
        answers = self._answers(label, asked, ctx)
        self._send(link, label, types.Request[Any, Any](method="tasks/update", params={
            "taskId": task_id, "inputResponses": {key: answer.model_dump(mode="json", by_alias=True, exclude_none=True)
                                                  if isinstance(answer, BaseModel) else answer
                                                  for key, answer in answers.items()}}), ctx, deadline)
        answered.update(answers)
        return 1

    def _cancel_task(self, link: Link, task_id: str) -> None:
        """Send ``tasks/cancel`` for ``task_id`` without waiting for the answer (bounded by
        ``connect_timeout_s``)."""
        with link.lock:
            session, aloop = link.session, link.aloop
        if session is None or aloop is None:
            return
        sending = session.send_request(types.CancelTaskRequest(params=types.CancelTaskRequestParams(
            task_id=task_id)), _RAW, request_read_timeout_seconds=self.connect_timeout_s)
        try:
            asyncio.run_coroutine_threadsafe(sending, aloop)
        except RuntimeError:  # the loop closed in between
            sending.close()
