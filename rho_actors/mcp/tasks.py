"""MCP Tasks, served: the ``io.modelcontextprotocol/tasks`` extension (SEP-2663) over
rho's background calls (DESIGN §6b "Tasks").

``rho-actors mcp serve`` advertises the extension under ``capabilities.extensions``. A
client that declares it (in ``initialize``, or per request in
``_meta["io.modelcontextprotocol/clientCapabilities"]``) gets, for a tool declared
``background=True`` or ``background="optional"``, a ``CreateTaskResult`` (flat:
``resultType: "task"``, ``taskId``, ``status``, ``createdAt``, ``lastUpdatedAt``,
``ttlMs``, ``pollIntervalMs``) instead of the tool's result; the call runs on as a rho
background task (:mod:`rho_actors.tasks`: one registry, one record in the session's
folder, ``loop.tasks()`` lists it). A client that does not declare it gets
``MissingRequiredClientCapability`` (``-32021``, naming the extension) for a
``background=True`` tool, and the tool's result, run as an ordinary call, for an
``"optional"`` one.

- ``tasks/get``: the task (``DetailedTask``): ``working``, ``input_required`` with its
  ``inputRequests``, ``completed`` with the tool's ``result`` inlined (an error the tool
  reported is ``completed`` with ``result.isError``), ``failed`` with an ``error``
  (JSON-RPC's shape: the call crashed, its process died, its host stopped), or
  ``cancelled``.
- ``tasks/update``: answers (``inputResponses``, by key) to the questions the task's
  tool asked through ``client_of(ctx)``: the tool waits for them (its thread blocked,
  bounded by the call's deadline and by a cancel), the task ``input_required``
  meanwhile; answering some keeps it ``input_required`` with the others.
- At 2026-07-28 a trusted tool's optional ``input_requests(args)`` names questions its
  call needs before it becomes a task: unanswered, the request is answered
  ``input_required`` (SEP-2322) and the client's next round, answering them, creates the
  task, whose ``client_of(ctx)`` finds those answers by key (:func:`up_front`).
- A call held for approval (``requires_approval``, DESIGN §4 "Approvals") of a
  background tool is a task ``input_required`` from its start, asking ``approval``
  (:data:`APPROVAL_KEY`, an ``elicitation/create`` naming the tool and its arguments):
  ``tasks/update`` answering ``{"action": "accept", "content": {"approve": true}}``
  approves it (it runs as the task), any other answer rejects it; ``loop.approve`` or
  ``rho-actors approve`` moves it on the same way. A server killed while it waits leaves
  it to the next server on the data folder, which serves it again to the same principal
  (:meth:`ServedTasks.taken_back`, :mod:`rho_actors.mcp.held_sessions`).
- ``tasks/cancel``: cancels it as ``loop.cancel_task`` does (a worker killed, a thread's
  ``ctx["cancel"]`` set); an ended task is left as it is. Both answer an empty result.
- A task id is 128 random bits and bound to the principal that created it (as a
  session handle is): an unknown id, or another principal's, is ``invalid params``;
  ``tasks/update`` of a task not ``input_required`` too. A ``Mcp-Name`` header that
  does not match ``taskId`` is ``HeaderMismatch`` (``-32020``, SEP-2243). Without the
  extension declared each of the three is ``-32021``. ``tasks/result`` and
  ``tasks/list`` (removed by SEP-2663) are unknown methods.
- A handshake-era client (protocol 2025-11-25: its wire has no ``CreateTaskResult`` for
  ``tools/call``) that declared the extension gets the task as a ``CallToolResult``
  (:func:`handshake_created`) and follows it with the same three methods.
- ``notifications/tasks`` (the task's status, with its ``result`` or ``error`` when
  ended) is sent to a handshake-era client on its connection each time a task it
  created changes status; a 2026-07-28 client, which has no connection, names the
  tasks in a ``subscriptions/listen`` request (``notifications.taskIds``) and gets them
  on that stream (:mod:`rho_actors.mcp.listen`, through :meth:`ServedTasks.follow`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import mcp_types as types
from loguru import logger
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, MISSING_REQUIRED_CLIENT_CAPABILITY
from pydantic import BaseModel, Field

from rho_actors.encoding import describe_exception
from rho_actors.errors import RhoError
from rho_actors.lifecycle.tasks import OPEN, TaskInfo
from rho_actors.mcp.client_requests import ClientRequestError, unbind
from rho_actors.mcp.upstream_tasks import FAILED
from rho_actors.tasks.registry import TaskError
from rho_actors.tool import ErrorKind, ToolResult, is_untrusted

__all__ = ["APPROVAL_KEY", "EXTENSION", "POLL_INTERVAL_MS", "RELATED_TASK", "ServedTask", "ServedTasks", "TaskParams",
           "UpdateParams", "as_task_call", "declared", "handshake_created", "required_error", "up_front"]

EXTENSION: Final = "io.modelcontextprotocol/tasks"
"""The tasks extension's identifier (SEP-2663)."""
POLL_INTERVAL_MS: Final = 500
"""How often a client is told to poll ``tasks/get`` (milliseconds)."""
RELATED_TASK: Final = "io.modelcontextprotocol/related-task"
"""The ``_meta`` key naming the task a handshake-era result created."""
HEADER_MISMATCH: Final = -32020
"""SEP-2243's error code for a routing header that does not match the body."""
_FAILED_KINDS: Final = frozenset({ErrorKind.CRASHED, ErrorKind.EXITED, ErrorKind.MEMORY, ErrorKind.UNAVAILABLE,
                                  ErrorKind.CANCELLED})  # a "failed" rho task that is MCP's failed, not isError
_MAX_QUESTIONS: Final = 64  # input requests one task may have open
_PRUNE_EVERY: Final = 256  # tasks created between two looks for ended ones to forget
_UNCLAIMED_KEPT: Final = 256  # ended tasks kept for the CreateTaskResult not made yet (the latest)
_SHOWN_ARGUMENTS: Final = 2000  # characters of a held call's arguments shown in its approval question
APPROVAL_KEY: Final = "approval"
"""The ``inputRequests`` key of the question a task asks while its call waits for a
person's decision (answer ``{"action": "accept", "content": {"approve": true}}`` to
approve it; any other answer rejects it)."""


class TaskParams(types.RequestParams):
    """The params of ``tasks/get`` and ``tasks/cancel``."""

    task_id: str


class UpdateParams(types.RequestParams):
    """The params of ``tasks/update``: answers by the keys of the task's ``inputRequests``."""

    task_id: str
    input_responses: dict[str, Any] = Field(default_factory=dict)


def declared(ctx: Any) -> bool:
    """Whether the client of request ``ctx`` declared the tasks extension (in its
    handshake, or in this request's ``_meta`` at 2026-07-28)."""
    capabilities = getattr(ctx.session, "client_capabilities", None)
    extensions = getattr(capabilities, "extensions", None)
    return isinstance(extensions, dict) and EXTENSION in extensions


def required_error(what: str) -> MCPError:
    """``MissingRequiredClientCapability`` (``-32021``) naming the tasks extension."""
    return MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY,
                    f"{what} needs the client to declare the {EXTENSION} extension",
                    {"requiredCapabilities": {"extensions": {EXTENSION: {}}}})


def as_task_call(entry: Any, withheld: tuple[str, ...], ctx: Any, name: str) -> bool:
    """Whether the call of tool ``name`` (its tool-set entry ``entry``, None when not
    registered) is served as a task: its tool is declared ``background`` (or
    ``"optional"``) and the client declared the tasks extension. Raises
    ``MissingRequiredClientCapability`` for a ``background=True`` tool of a client that
    did not."""
    mode = entry.info.policy.background if entry is not None and name not in withheld else False
    if mode is False:
        return False
    if declared(ctx):
        return True
    if mode is True:
        raise required_error(f"tool {name[:100]!r} runs as a task: it")
    return False


def up_front(entry: Any, name: str, arguments: dict[str, Any], answers: Mapping[str, Any]) -> dict[str, Any]:
    """The questions a task's call of tool ``name`` (its tool-set entry ``entry``) needs
    answered before it starts, which the request has not answered yet (key -> the
    request's wire JSON): what its trusted tool's optional ``input_requests(args)``
    returns (``{key: an SDK request, or its JSON}``; an untrusted tool's code is never
    run here). A callback that raises or answers another shape asks nothing (logged)."""
    declare = getattr(entry.tool, "input_requests", None) if entry is not None else None
    if entry is None or is_untrusted(entry.tool) or not callable(declare):
        return {}
    try:
        asked = declare(dict(arguments)) or {}
        wire = {str(key): request.model_dump(mode="json", by_alias=True, exclude_none=True)
                if isinstance(request, BaseModel) else dict(request) for key, request in asked.items()}
        if len(wire) > _MAX_QUESTIONS or not all(isinstance(r.get("method"), str) for r in wire.values()):
            raise ValueError(f"at most {_MAX_QUESTIONS} requests, each with a method")
    except Exception as exc:
        logger.warning("MCP: tool {!r}: its input_requests() asks nothing: {}", name, describe_exception(exc))
        return {}
    return {key: request for key, request in wire.items() if key not in answers}


def handshake_created(ack: ToolResult, created: dict[str, Any]) -> types.CallToolResult:
    """A task's creation for a handshake-era client, whose wire carries no
    ``CreateTaskResult``: a ``CallToolResult`` whose text says the call runs as a task,
    whose ``structuredContent`` is the task (``taskId``, ``status``, ``createdAt``...),
    and whose ``_meta`` names it under ``io.modelcontextprotocol/related-task``."""
    task = {key: value for key, value in created.items() if key not in ("resultType", "_meta")}
    meta = {**(created.get("_meta") or {}), RELATED_TASK: {"taskId": task["taskId"]}}
    return types.CallToolResult.model_validate({"content": [{"type": "text", "text": ack.content}],
                                                "structuredContent": task, "_meta": meta})


def _approval_question(pending: Any) -> dict[str, Any]:
    """The ``elicitation/create`` request asking the client to approve a held call."""
    shown = json.dumps(dict(pending.arguments), ensure_ascii=False, default=str)[:_SHOWN_ARGUMENTS]
    return {"method": "elicitation/create", "params": {
        "mode": "form", "message": f"Approve the call of {pending.name} with {shown}?",
        "requestedSchema": {"type": "object", "properties": {"approve": {"type": "boolean", "title": "Approve"}},
                            "required": ["approve"]}}}


def _upstream_failed(result: ToolResult) -> bool:
    """Whether ``result`` is an upstream MCP task's ``failed`` (or a malformed upstream task's)."""
    details = result.details
    return isinstance(details, Mapping) and all(details.get(k) == v for k, v in FAILED.items())


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True, eq=False)
class ServedTask:
    """A task an MCP client created: who may name it, and the questions its tool asked."""

    principal: str
    session: Any  # rho_actors.mcp.sessions.Session
    name: str
    notify: Any = None  # a handshake-era connection (the SDK's Connection): notifications/tasks go there
    aloop: asyncio.AbstractEventLoop | None = None
    bound: tuple[str, str] | None = None  # its (session id, call id) bound for client_of, until it ends
    approval: str | None = None  # the call id while its call waits for a person's decision
    task_id: str | None = None  # known once its call started (its tool may ask before)
    asked: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> an unanswered question (wire JSON)
    answers: dict[str, Any] = field(default_factory=dict)  # key -> the client's answer, until the tool reads it
    ended: bool = False
    ended_at: float = 0.0  # time.monotonic() s of its end: forgotten task_ttl_s after
    final: TaskInfo | None = None  # what it ended as (the registry may forget it first, past its ttl)


class ServedTasks:
    """The tasks of one ``mcp serve`` (see the module doc), over the system's
    :class:`~rho_actors.tasks.TaskRegistry` ``registry``; ``answer(result)`` makes a
    finished call's ``CallToolResult``. Safe from any thread."""

    def __init__(self, registry: Any, answer: Callable[[ToolResult], types.CallToolResult]) -> None:
        self._registry = registry
        self._answer = answer
        self._lock = threading.Lock()
        self._woken = threading.Condition(self._lock)
        self._tasks: dict[str, ServedTask] = {}
        self._made = 0  # tasks created, for _prune
        self._admitted: set[ServedTask] = set()  # the calls becoming tasks and the tasks open
        self._followers: dict[str, dict[object, Callable[[str], None]]] = {}  # task id -> its listen streams
        # tasks that ended before their call's CreateTaskResult was made (kept for created(): the registry may
        # forget one past its ttl first), by id, the latest _UNCLAIMED_KEPT
        self._unclaimed: dict[str, TaskInfo] = {}
        self._unwatch = registry.watch(self._changed)

    def close(self) -> None:
        """Stop following the registry; every tool waiting for input is woken (it fails)."""
        self._unwatch()
        with self._lock:
            bound = [served.bound for served in self._tasks.values() if served.bound is not None]
            for served in self._tasks.values():
                served.ended, served.bound = True, None
            self._admitted.clear()
            self._woken.notify_all()
        for key in bound:
            unbind(*key)

    # --- the tools/call side ----------------------------------------------------------------

    def asking(self, served: ServedTask) -> Callable[[dict[str, dict[str, Any]], float], dict[str, Any]]:
        """The ``Bound.task_input`` of ``served``'s call: it waits for the answers."""
        return lambda asked, deadline: self._wait_input(served, asked, deadline)

    def admit(self, served: ServedTask, bound: int) -> None:
        """Count ``served``'s call among its principal's open tasks until its task ends (or
        :meth:`release`); raises ``MCPError`` (``-32600``, naming ``max_tasks_per_client``)
        when the principal has ``bound`` open already."""
        with self._lock:
            held = sum(1 for other in self._admitted if other.principal == served.principal)
            if held >= bound:
                raise MCPError(INVALID_REQUEST, f"too many tasks: this client has {held} open, at most {bound} "
                                                "(max_tasks_per_client); wait for one to end, or cancel one",
                               {"maxTasksPerClient": bound})
            self._admitted.add(served)

    def release(self, served: ServedTask) -> None:
        """``served``'s call did not become a task: it no longer counts (:meth:`admit`)."""
        with self._lock:
            self._admitted.discard(served)

    def created(self, served: ServedTask, ack: ToolResult, meta: dict[str, Any] | None) -> dict[str, Any]:
        """The ``CreateTaskResult`` of a call run as a task (``ack``: its turn's result,
        naming the task), the task now known by its id."""
        task_id = ack.details["task_id"]
        pending = ack.details.get("pending")  # a PendingCall: the call waits for a person's decision
        with self._lock:
            served.task_id = task_id
            if pending is not None:
                served.approval = pending.call_id
                served.asked[APPROVAL_KEY] = _approval_question(pending)
            self._tasks[task_id] = served
            kept = self._unclaimed.pop(task_id, None)  # ended already: this served task's from now on
            self._made += 1
            if self._made % _PRUNE_EVERY == 0:
                self._prune()
            waiting = bool(served.asked)
        session = served.session.loop
        try:  # a held call's task is input_required in the registry already (unless decided meanwhile: not set back)
            info = self._registry.waiting(session.session_id, session.data_dir, task_id, True) \
                if waiting and pending is None else self._registry.get(session.session_id, session.data_dir, task_id)
        except TaskError:  # it ended, and its ttl passed, before this: what it ended as was kept when it ended
            with self._lock:
                ended = kept or served.final
            if ended is None:
                raise
            info = ended
        if info.status not in OPEN or (pending is not None and info.status != "input_required"):
            self._changed(info)  # it ended, or its call was decided, already: the registry's watcher did not know it
        created: dict[str, Any] = {"resultType": "task", **self._envelope(served, info)}
        if meta is not None:
            created["_meta"] = meta
        return created

    def taken_back(self, session: Any, infos: list[TaskInfo], held: Mapping[str, Any]) -> None:
        """Serve again the tasks ``infos`` of ``session``, a session a killed server left
        and this one took back (:mod:`rho_actors.mcp.held_sessions`), to its principal:
        one whose call waits for approval (``held``: by call id, its ``PendingCall``)
        asks its ``approval`` question again; one that ended is served as it ended. A
        task decided or ended while this ran is told as the registry has it now."""
        loop = session.loop
        for info in infos:
            served = ServedTask(session.principal, session, info.name, task_id=info.task_id)
            pending = held.get(info.call_id) if info.status in OPEN else None
            if pending is not None:
                served.approval, served.asked[APPROVAL_KEY] = pending.call_id, _approval_question(pending)
            with self._lock:
                if self._tasks.setdefault(info.task_id, served) is not served:
                    continue
            try:
                now = self._registry.get(loop.session_id, loop.data_dir, info.task_id)
            except TaskError:
                now = info
            if now.status not in OPEN or (pending is not None and now.status != "input_required"):
                self._changed(now)  # ended, or its call decided, before it was served again

    def _prune(self) -> None:
        """Forget (under the lock) the tasks that ended over ``task_ttl_s`` ago: the
        registry has forgotten them too, so a ``tasks/get`` would be unknown anyway."""
        horizon = time.monotonic() - self._registry.settings.task_ttl_s
        for task_id in [t for t, served in self._tasks.items() if served.ended and served.ended_at < horizon]:
            del self._tasks[task_id]

    def _wait_input(self, served: ServedTask, asked: dict[str, dict[str, Any]], deadline: float) -> dict[str, Any]:
        """The tool's thread: ask ``asked`` (key -> request) and wait for every answer."""
        with self._lock:
            if len(served.asked) + len(asked) > _MAX_QUESTIONS:
                raise ClientRequestError(f"a task may wait for at most {_MAX_QUESTIONS} answers at once")
            served.asked.update({k: v for k, v in asked.items() if k not in served.answers})
            task_id = served.task_id
        if task_id is not None:
            self._set_waiting(served, task_id)
        with self._lock:
            while not served.ended and not all(k in served.answers for k in asked):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._woken.wait(left)
            got = {k: served.answers.pop(k) for k in asked if k in served.answers}
            for key in asked:
                served.asked.pop(key, None)
            ended, task_id = served.ended, served.task_id
        if task_id is not None and not ended:
            self._set_waiting(served, task_id)
        if len(got) < len(asked):
            raise ClientRequestError("the task ended before the client answered" if ended
                                     else "the client did not answer before the call's deadline")
        return got

    def _set_waiting(self, served: ServedTask, task_id: str) -> None:
        with self._lock:
            waiting = bool(served.asked)
        loop = served.session.loop
        self._registry.waiting(loop.session_id, loop.data_dir, task_id, waiting)

    # --- the tasks/* methods ----------------------------------------------------------------

    def install(self, server: Any, principal_of: Callable[[Any], str]) -> None:
        """Serve ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` on ``server`` (the
        SDK's low-level ``Server``) and advertise the extension under
        ``capabilities.extensions``; ``principal_of(ctx)`` names a request's client."""
        for method, params_type in (("tasks/get", TaskParams), ("tasks/update", UpdateParams),
                                    ("tasks/cancel", TaskParams)):
            server.add_request_handler(method, params_type, functools.partial(self._handle, method, principal_of))
        server.extensions[EXTENSION] = {}

    async def _handle(self, method: str, principal_of: Callable[[Any], str], ctx: Any, params: Any) -> dict[str, Any]:
        principal = principal_of(ctx)
        if method == "tasks/get":  # memory only: answered on the event loop
            return self.get(ctx, params, principal)
        act = self.update if method == "tasks/update" else self.cancel
        return await anyio.to_thread.run_sync(act, ctx, params, principal)  # writes the task's record

    def get(self, ctx: Any, params: TaskParams, principal: str) -> dict[str, Any]:
        """``tasks/get``: the ``DetailedTask``."""
        served, info = self._find(ctx, params.task_id, principal, "tasks/get")
        return {"resultType": "complete", **self._detailed(served, info)}

    def update(self, ctx: Any, params: UpdateParams, principal: str) -> dict[str, Any]:
        """``tasks/update``: give the task's tool the answers to its questions."""
        served, info = self._find(ctx, params.task_id, principal, "tasks/update")
        with self._lock:
            if info.status not in OPEN or not served.asked:
                raise MCPError(INVALID_PARAMS, f"task {params.task_id} is {info.status}, not input_required: it "
                                               "asks for no input", {"taskId": params.task_id, "status": info.status})
            held = served.approval is not None  # its "approval" question is rho's (else a tool's, an upstream's)
            decision = params.input_responses.get(APPROVAL_KEY) if held and APPROVAL_KEY in served.asked else None
            for key, answer in params.input_responses.items():
                if key in served.asked and isinstance(answer, dict) and not (held and key == APPROVAL_KEY):
                    served.answers[key] = answer
                    del served.asked[key]
            self._woken.notify_all()

        if isinstance(decision, dict):
            self._decide(served, decision, principal)
        return {"resultType": "complete"}

    def _decide(self, served: ServedTask, answer: dict[str, Any], principal: str) -> None:
        """The client's answer to the approval question: the call approved (it runs as
        the task) when accepted with ``approve: true``, else rejected."""
        call_id, loop = served.approval, served.session.loop
        content = answer.get("content")
        approved = answer.get("action") == "accept" and isinstance(content, dict) and content.get("approve") is True
        by = f"MCP client {principal}"
        try:
            if approved:
                loop.approve(call_id, decided_by=by)
            else:
                loop.reject(call_id, "the MCP client declined the call", decided_by=by)
        except (RhoError, LookupError, ValueError, RuntimeError) as exc:  # decided meanwhile (by the host, say)
            logger.info("task {}: the client's decision was not taken: {}", served.task_id, exc)

    def cancel(self, ctx: Any, params: TaskParams, principal: str) -> dict[str, Any]:
        """``tasks/cancel``: cancel the task (an ended one is left as it is)."""
        served, info = self._find(ctx, params.task_id, principal, "tasks/cancel")
        if info.status in OPEN:
            served.session.loop.cancel_task(params.task_id)
        return {"resultType": "complete"}

    def _find(self, ctx: Any, task_id: str, principal: str, method: str) -> tuple[ServedTask, TaskInfo]:
        if not declared(ctx):
            raise required_error(method)
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", None)
        named = headers.get("mcp-name") if headers is not None else None
        if named is not None and named.strip() != task_id:
            raise MCPError(HEADER_MISMATCH, "Mcp-Name header does not match the request body's 'taskId' parameter")
        with self._lock:
            served = self._tasks.get(task_id)
        if served is None or served.principal != principal:
            raise MCPError(INVALID_PARAMS, f"unknown task {task_id[:100]!r}: this server has no such task for this "
                                           "client (ended longer ago than its ttlMs, or the server restarted)",
                           {"taskId": task_id})
        loop = served.session.loop
        try:
            info = self._registry.get(loop.session_id, loop.data_dir, task_id)
        except LookupError:  # expired: past task_ttl_s after its end, or past max_ended_tasks_per_session
            with self._lock:
                self._tasks.pop(task_id, None)
            raise MCPError(INVALID_PARAMS, f"unknown task {task_id[:100]!r}: it ended longer ago than its ttlMs, or "
                                           "its session has since ended more tasks than it keeps "
                                           "(max_ended_tasks_per_session)", {"taskId": task_id}) from None
        return served, info

    def follow(self, task_ids: list[str], principal: str, changed: Callable[[str], None]
               ) -> tuple[list[str], Callable[[], None]]:
        """Call ``changed(task_id)`` (from any thread) at each change of status of each of
        ``task_ids`` that ``principal`` created (the others, unknown or another's, are left
        out alike). Returns the ids followed and the callable that stops following them."""
        token = object()
        with self._lock:
            followed = [t for t in task_ids if (s := self._tasks.get(t)) is not None and s.principal == principal]
            for task_id in followed:
                self._followers.setdefault(task_id, {})[token] = changed

        def unfollow() -> None:
            with self._lock:
                for task_id in followed:
                    streams = self._followers.get(task_id)
                    if streams is not None:
                        streams.pop(token, None)
                        if not streams:
                            del self._followers[task_id]

        return followed, unfollow

    def detailed(self, task_id: str, principal: str) -> dict[str, Any] | None:
        """Task ``task_id``'s ``DetailedTask`` as ``tasks/get`` gives it now, or None when
        ``principal`` has no such task (unknown, another's, or forgotten)."""
        with self._lock:
            served = self._tasks.get(task_id)
        if served is None or served.principal != principal:
            return None
        loop = served.session.loop
        try:
            info = self._registry.get(loop.session_id, loop.data_dir, task_id)
        except LookupError:
            return None
        return self._detailed(served, info)

    # --- what a client sees of a task --------------------------------------------------------

    def _envelope(self, served: ServedTask, info: TaskInfo) -> dict[str, Any]:
        status = self._status(served, info)
        loop = served.session.loop
        try:
            updated = self._registry.updated(loop.session_id, loop.data_dir, info.task_id)
        except LookupError:
            updated = info.finished or info.started
        return {"taskId": info.task_id, "status": status, "createdAt": _iso(info.started),
                "lastUpdatedAt": _iso(updated), "ttlMs": max(1, round(self._registry.settings.task_ttl_s * 1000)),
                "pollIntervalMs": POLL_INTERVAL_MS}

    def _status(self, served: ServedTask, info: TaskInfo) -> str:
        if info.status in OPEN:
            return "input_required" if served.asked else "working"
        if info.status == "failed" and info.result is not None and info.result.error_kind not in _FAILED_KINDS \
                and not _upstream_failed(info.result):
            return "completed"  # the tool ran and reported an error: result.isError (SEP-2663)
        return info.status

    def _detailed(self, served: ServedTask, info: TaskInfo) -> dict[str, Any]:
        detailed = self._envelope(served, info)
        status = detailed["status"]
        if status == "input_required":
            with self._lock:
                detailed["inputRequests"] = dict(served.asked)
        elif status == "completed" and info.result is not None:
            detailed["result"] = self._answer(info.result).model_dump(mode="json", by_alias=True, exclude_none=True)
        elif status == "failed" and info.result is not None:
            detailed["error"] = {"code": INTERNAL_ERROR, "message": info.result.content,
                                 "data": {"errorKind": str(info.result.error_kind)}}
            detailed["statusMessage"] = info.result.content[:500]
        elif status == "cancelled" and info.result is not None:  # why (a cancel, its host's stop, held_task_lost)
            detailed["statusMessage"] = info.result.content[:500]
        return detailed

    def _changed(self, info: TaskInfo) -> None:
        """The registry's watcher: a task ended (its tool's waits end) or changed status
        (a handshake-era client is told)."""
        with self._lock:
            served = self._tasks.get(info.task_id)
            if served is None:  # not (yet) a served task: an ended one is kept a while for created()
                if info.status not in OPEN:
                    if len(self._unclaimed) >= _UNCLAIMED_KEPT:
                        del self._unclaimed[next(iter(self._unclaimed))]  # the oldest
                    self._unclaimed[info.task_id] = info
                return
            ended = info.status not in OPEN
            if ended:
                served.ended, served.ended_at, served.final = True, time.monotonic(), info
                self._admitted.discard(served)
                self._woken.notify_all()
            bound, served.bound = (served.bound, None) if ended else (None, served.bound)
            if info.status != "input_required" and served.approval is not None:  # decided (here or by the host)
                served.asked.pop(APPROVAL_KEY, None)
                served.approval = None
            followers = list(self._followers.get(info.task_id, {}).values())
        if bound is not None:
            unbind(*bound)
        for changed in followers:  # 2026-07-28 clients' subscriptions/listen streams (rho_actors.mcp.listen)
            changed(info.task_id)
        if served.notify is not None and served.aloop is not None:
            params = self._detailed(served, info)
            try:
                asyncio.run_coroutine_threadsafe(_notify(served.notify, params), served.aloop)
            except RuntimeError:  # the server's loop has closed
                logger.debug("notifications/tasks for {} not sent: the server stopped", info.task_id)


async def _notify(connection: Any, params: dict[str, Any]) -> None:
    """Send ``notifications/tasks`` with ``params`` on a handshake-era connection's
    standalone channel (the SDK drops it, never raising, when there is none)."""
    await connection.notify("notifications/tasks", params)
