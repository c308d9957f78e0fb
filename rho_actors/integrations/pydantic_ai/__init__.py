"""pydantic-ai running its tools through rho (the ``pydantic-ai`` extra; DESIGN §6c).

Example::

    from pydantic_ai import Agent
    from rho_actors.integrations.pydantic_ai import RhoToolset

    agent = Agent("openai:gpt-4o-mini", toolsets=[RhoToolset(loop)])
    result = await agent.run("What is 1 + 2?")

The toolset's tools are the loop's offered tools, read again at every step of a run.
Each call runs as a rho turn of one call under pydantic-ai's ``tool_call_id``; invalid
arguments become pydantic-ai's retry prompt with rho's message (``ModelRetry``), any
other error reaches the model as rho's text as a failed tool result (``ToolFailed``)
and the run goes on. ``exclusive`` tools are ``sequential`` for pydantic-ai. Given an
:class:`rho_actors.ActorSystem` instead of a loop, each pydantic-ai conversation
(``conversation_id``) is a rho session of that id. A call rho would hold for approval
(its tool's ``requires_approval``, the loop's ``approval`` policy) raises pydantic-ai's
``ApprovalRequired`` before anything runs: with ``DeferredToolRequests`` among the
agent's output types the run ends with it in ``approvals``; the next run given
``DeferredToolResults(approvals={call_id: True})`` runs it once (approved in rho too,
``decided_by="pydantic-ai"``, with the ``override_args`` of a ``ToolApproved`` when given),
and ``ToolDenied`` never runs it.

A pydantic-ai ``Tool`` registered in rho (``system.register(tool)``: rho adopts it, see
:mod:`~rho_actors.integrations.pydantic_ai.pydantic_tool`) that rho runs in this process
stays pydantic-ai's everywhere but in its invocation: its own prepared definition
(``prepare``, ``metadata``, ``sequential``, ``timeout``), argument validator and
``args_validator`` (pydantic-ai's retry prompts in pydantic-ai's words), ``max_retries``
(the run's when it has none); its function gets the run's ``RunContext`` (deps, retry,
usage) and what it returns or raises (``ModelRetry``, ``CallDeferred``,
``ApprovalRequired``, ``ToolReturn``, any value) reaches pydantic-ai as the very object.
The call still runs as a rho turn under rho's deadline, isolation and approvals. Its
``timeout`` is rho's deadline (``timeout_ms``, in every isolation): a call past it is
pydantic-ai's retry prompt ("Timed out after ... seconds."), as from pydantic-ai's own
toolset. One that takes a ``RunContext`` runs in ``thread`` isolation only (refused at
registration in another).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rho_actors.errors import needs_extra

with needs_extra("pydantic-ai", "rho_actors.integrations.pydantic_ai"):
    from pydantic_ai import ModelRetry, RunContext, ToolDefinition
    from pydantic_ai.exceptions import ApprovalRequired, ToolFailed
    from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool
    from pydantic_ai.toolsets.function import FunctionToolsetTool
from pydantic_core import SchemaValidator, core_schema

from rho_actors.integrations.host_side import HOST_SIDE_CALLS, HostSideCall
from rho_actors.integrations.pydantic_ai.pydantic_tool import PydanticAiTool, jsonable
from rho_actors.integrations.sessions import SessionLoops, call_id, kept_while_unchanged
from rho_actors.lifecycle import pending_call
from rho_actors.tool import ErrorKind, ToolCall, ToolInfo

if TYPE_CHECKING:
    from rho_actors.declarations.toolset import ToolEntry
    from rho_actors.loop.handle import Loop
    from rho_actors.system import ActorSystem
    from rho_actors.tool import ToolResult

__all__ = ["RhoToolset"]

_ANY_ARGUMENTS = SchemaValidator(core_schema.any_schema())
"""pydantic-ai's check of the arguments lets everything through: rho checks them
against the tool's schema and answers with its own message."""
_RETRY_KINDS = frozenset({ErrorKind.INVALID_ARGUMENTS, ErrorKind.INVALID_JSON})
_RAISED_KINDS = frozenset({ErrorKind.RAISED, ErrorKind.CANCELLED})


def _own(entry: ToolEntry) -> bool:
    """Whether ``entry`` is a pydantic-ai tool rho runs in this process (adopted,
    trusted, ``thread``): pydantic-ai's own handling applies to it."""
    return isinstance(entry.tool, PydanticAiTool) and entry.isolation == "thread" and not entry.untrusted


class RhoToolset(AbstractToolset[Any]):
    """An ``AbstractToolset`` whose tools are what ``target`` offers now.

    ``target`` is a :class:`rho_actors.Loop` (every call runs in that session) or an
    :class:`rho_actors.ActorSystem` (the session is the run's ``conversation_id``,
    started on first use; :meth:`close` stops those loops). ``id`` is the toolset's
    pydantic-ai id; ``max_retries`` is how many retry prompts for invalid arguments
    a tool gets per run. Raises ``TypeError`` for a ``target`` that is neither.
    """

    def __init__(self, target: Loop | ActorSystem, *, id: str | None = None, max_retries: int = 1) -> None:
        self._sessions = SessionLoops(target, what="RhoToolset")
        self._id = id
        self._max_retries = max_retries
        self._made: dict[str, tuple[ToolInfo, ToolsetTool[Any]]] = {}  # by name: kept while unchanged
        self._own: dict[str, PydanticAiTool] = {}  # pydantic-ai's own tools offered at the last step, by rho name
        self._timeouts: dict[str, float] = {}  # the pydantic-ai tools' own timeouts (s) at the last step, by rho name
        self._lock = threading.Lock()

    @property
    def id(self) -> str | None:
        """The toolset's id for pydantic-ai (``id=`` given at construction), or ``None``."""
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The tools the conversation's loop offers now, by name (read at every step,
        from the loop's snapshot in this thread: no actor is asked). A tool whose
        declaration is unchanged keeps its ``ToolsetTool``; a pydantic-ai tool rho runs
        here is prepared by pydantic-ai at every step, as its own toolset does."""
        entries = self._sessions.offered_entries(ctx.conversation_id)
        own = {entry.info.name: entry.tool.tool for entry in entries if _own(entry)}
        timeouts = {entry.info.name: entry.tool.tool.timeout for entry in entries
                    if isinstance(entry.tool, PydanticAiTool) and entry.tool.tool.timeout is not None}
        with self._lock:
            self._own = {name: PydanticAiTool(tool) for name, tool in own.items()}
            self._timeouts = timeouts
            self._made = kept_while_unchanged(
                self._made, [entry.info for entry in entries if not _own(entry)], self._tool)
            tools = {name: tool for name, (_, tool) in self._made.items()}
        if own:
            prepared = FunctionToolset[Any]()
            prepared.tools = own  # not add_tool: the tools are the user's, as they are
            for name, tool in (await prepared.get_tools(ctx)).items():
                tools[name] = replace(tool, toolset=self)
        return tools

    def _tool(self, info: ToolInfo) -> ToolsetTool[Any]:
        return ToolsetTool(
            toolset=self,
            tool_def=ToolDefinition(
                name=info.name, parameters_json_schema=copy.deepcopy(info.parameter_schema),
                description=info.description, sequential=info.concurrency == "exclusive",
            ),
            max_retries=self._max_retries,
            args_validator=_ANY_ARGUMENTS,
        )

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run the call as a rho turn: the result's text when ok; raises
        ``ApprovalRequired`` for a call rho would hold that pydantic-ai has not approved,
        ``ModelRetry`` (invalid arguments or JSON) or ``ToolFailed`` (any other error)
        with rho's text."""
        loop = self._sessions.loop(ctx.conversation_id)
        if isinstance(tool, FunctionToolsetTool):
            return await self._call_own(loop, name, tool_args, ctx, tool)
        call = ToolCall(call_id(ctx.tool_call_id), name, tool_args)
        if not ctx.tool_call_approved and loop.requires_approval(call):
            raise ApprovalRequired(metadata={"rho_session": loop.session_id})
        (result,) = await loop.arun_turn([call])
        if pending_call(result) is not None:  # held by rho, approved in pydantic-ai: rho runs it once
            result = await asyncio.to_thread(loop.approve, call.id, None, "pydantic-ai")
        with self._lock:
            timeout = self._timeouts.get(name)
        return _answer(result, timeout)

    async def _call_own(self, loop: Loop, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: FunctionToolsetTool[Any]) -> Any:
        """A call of a pydantic-ai tool rho runs here: a rho turn (rho's name for it,
        the validated arguments' JSON form) whose run is pydantic-ai's own call of its
        tool (its ``timeout`` included) given the run's ``RunContext``."""
        rho_name = tool.original_name or name
        with self._lock:
            adopted = self._own.get(rho_name)
        arguments = adopted.arguments(tool_args) if adopted is not None else jsonable(tool_args)
        call = ToolCall(call_id(ctx.tool_call_id), rho_name, arguments)
        if not ctx.tool_call_approved and loop.requires_approval(call):
            raise ApprovalRequired(metadata={"rho_session": loop.session_id})
        host = HostSideCall({"invoke": lambda: _RUNNER.call_tool(name, tool_args, ctx, tool)})
        with HOST_SIDE_CALLS.holding(loop.session_id, call.id, host):
            (result,) = await loop.arun_turn([call])
            if pending_call(result) is not None:  # held by rho, approved in pydantic-ai: rho runs it once
                result = await asyncio.to_thread(loop.approve, call.id, None, "pydantic-ai")
        if result.ok and host.returned:
            return host.output
        if result.error_kind in _RAISED_KINDS and host.raised is not None:
            raise host.raised
        return _answer(result, tool.tool_def.timeout)

    def close(self) -> None:
        """Stop the loops started for conversations (a loop given as ``target`` stays)."""
        self._sessions.close()


_RUNNER = FunctionToolset[Any]()
"""Runs a pydantic-ai tool's call as pydantic-ai's own toolset does (no toolset timeout)."""


def _answer(result: ToolResult, timeout: float | None = None) -> Any:
    """What pydantic-ai gets for rho's ``result``: its text when ok; ``ModelRetry``
    (invalid arguments or JSON) or ``ToolFailed`` (any other error) with rho's text; for
    a ``timeout`` of a pydantic-ai tool with its own ``timeout`` (seconds), the
    ``ModelRetry`` pydantic-ai raises then, in its words."""
    if result.ok:
        return result.content
    if result.error_kind is ErrorKind.TIMEOUT and timeout is not None:
        raise ModelRetry(f"Timed out after {timeout} seconds.")
    if result.error_kind in _RETRY_KINDS:
        raise ModelRetry(result.content)
    raise ToolFailed(result.content)
