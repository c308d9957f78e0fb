"""The OpenAI Agents SDK running its tools through rho (the ``openai-agents`` extra;
DESIGN §6c).

Example::

    from agents import Agent, Runner
    from rho_actors.integrations.openai_agents import function_tools

    loop = system.start_loop("user-42")
    agent = Agent(name="helper", model=model, tools=function_tools(loop))
    result = await Runner.run(agent, "What is 1 + 2?")

Each call the model makes runs as a rho turn of one call in ``loop``, under the SDK's
``tool_call_id``: the tool's deadline stops its work (a sync tool too, which the SDK
cannot bound), and every error, a raise or a timeout included, reaches the model as
rho's text (never the SDK's generic "An error occurred"). A call that rho would hold
for approval (its tool's ``requires_approval``, the loop's ``approval`` policy) is a
``needs_approval`` call for the SDK: the run stops with it in ``result.interruptions``;
``state.approve(item)`` runs it once (approved in rho too, ``decided_by="openai-agents"``)
and ``state.reject(item)`` never runs it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rho_actors.errors import needs_extra

with needs_extra("openai-agents", "rho_actors.integrations.openai_agents"):
    from agents import FunctionTool, Tool
    from agents.exceptions import ModelBehaviorError
    from agents.run_context import RunContextWrapper
    from agents.tool_context import ToolContext

from rho_actors.integrations.host_side import HOST_SIDE_CALLS, HostSideCall
from rho_actors.integrations.openai_agents.sdk_tool import WRAPPED_MARKER, SdkFunctionTool
from rho_actors.integrations.sessions import call_id, kept_while_unchanged
from rho_actors.lifecycle import pending_call
from rho_actors.loop.handle import Loop
from rho_actors.tool import ErrorKind, ToolCall, ToolInfo, ToolResult

if TYPE_CHECKING:
    from rho_actors.declarations.toolset import ToolEntry

__all__ = ["LoopFunctionTools", "function_tools"]


def _unparsed(arguments: str) -> bool:
    """Whether the SDK's own parsing refuses ``arguments`` before its function runs (not
    JSON, or no JSON object)."""
    try:
        return not isinstance(json.loads(arguments), dict)
    except ValueError:
        return True


async def _sdk_answer(invoke: Any, ctx: ToolContext[Any], arguments: str, result: ToolResult,
                      host: HostSideCall) -> Any:
    """What the SDK gets for a call of its own tool run through rho: what the tool
    returned or raised, the very object; for JSON the SDK cannot parse, what its own
    ``invoke`` says (it refuses it before running anything); else rho's text."""
    if result.ok and host.returned:
        return host.output
    if result.error_kind in _RAISED_KINDS and host.raised is not None:
        raise host.raised  # a CancelledError or other BaseException too: the SDK's executor propagates them
    if result.error_kind is ErrorKind.INVALID_JSON and _unparsed(arguments):
        return await invoke(ctx, arguments)
    if result.error_kind in _RETRY_KINDS:  # the SDK's own error for arguments its tool refuses, with rho's words
        raise ModelBehaviorError(f"Invalid JSON input for tool {ctx.tool_name}: {result.content}")
    return result.content


async def _ended_as_tool_ends(host: HostSideCall, cancelled: asyncio.CancelledError, deadline: float) -> Any:
    """The end of a call whose awaiting task was cancelled, as the SDK's own executor
    gives it (it runs its tool in that very task): the tool, cancelled in the same step
    (DESIGN §4), ends the call as it ends, returning what it returns or raising what it
    raises (its cleanup's error, the ``CancelledError`` it lets through). A tool that
    never started, or still runs at its ``deadline`` (``time.monotonic()`` s), ends it
    with ``cancelled``; one more cancel of the awaiting task is the tool's too."""
    task = host.task
    aio = asyncio.get_running_loop()
    if task is None or task.get_loop() is not aio:
        raise cancelled
    if not task.done():
        waiting = asyncio.shield(task)  # the tool's own task (which never raises): the SDK follows its progress
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            waiting.cancel()

        timer = aio.call_later(max(0.0, deadline - time.monotonic()), expire)
        try:
            await waiting
        except asyncio.CancelledError:
            if expired and not task.done():
                raise cancelled from None
            if not task.done():  # the awaiting task cancelled again: so is the tool
                task.cancel()
                raise
        finally:
            timer.cancel()
    host.apply_context()
    if host.returned:
        return host.output
    raise host.raised or cancelled


_RAISED_KINDS = frozenset({ErrorKind.RAISED, ErrorKind.EXITED, ErrorKind.CANCELLED})
_RETRY_KINDS = frozenset({ErrorKind.INVALID_JSON, ErrorKind.INVALID_ARGUMENTS})


def _routed(loop: Loop, original: FunctionTool, needs_approval: Any, timeout_ms: int) -> FunctionTool:
    """A copy of the SDK's own ``original`` (every field of it) whose calls run through
    rho. The SDK's failure handling (``failure_error_function``, its copy and replace
    rules) wraps its tool's invocation in an invoker object; rho goes in between the two,
    so the SDK handles what its tool raised inside rho as its own."""
    name = original.name
    invoker = original.on_invoke_tool
    impl = getattr(invoker, "_invoke_tool_impl", None)
    invoke: Any = impl if impl is not None else invoker

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        call = ToolCall(call_id(ctx.tool_call_id), name, arguments)
        host = HostSideCall({"context": ctx, "arguments": arguments, "invoke": invoke})
        with HOST_SIDE_CALLS.holding(loop.session_id, call.id, host):
            deadline = time.monotonic() + timeout_ms / 1000
            try:
                (result,) = await loop.arun_turn([call])
            except asyncio.CancelledError as cancelled:  # the task awaiting it: its tool is cancelled with it
                return await _ended_as_tool_ends(host, cancelled, deadline)
            if pending_call(result) is not None:  # the SDK approved it: rho runs it
                result = await asyncio.to_thread(loop.approve, call.id, None, "openai-agents")
        host.apply_context()
        return await _sdk_answer(invoke, ctx, arguments, result, host)

    routed = copy.copy(original)
    if impl is not None and hasattr(invoker, "_on_handled_error"):
        if hasattr(impl, WRAPPED_MARKER):
            setattr(on_invoke_tool, WRAPPED_MARKER, getattr(impl, WRAPPED_MARKER))
        invoker_type: Any = type(invoker)  # the SDK's failure-handling invoker
        routed.on_invoke_tool = invoker_type(on_invoke_tool, invoker._on_handled_error, function_tool=routed)
    else:
        routed.on_invoke_tool = on_invoke_tool
    if needs_approval is not False:
        routed.needs_approval = needs_approval
    return routed


def _function_tool(loop: Loop, entry: ToolEntry) -> FunctionTool:
    info = entry.info
    name = info.name

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> str:
        call = ToolCall(call_id(ctx.tool_call_id), name, arguments)
        (result,) = await loop.arun_turn([call])
        if pending_call(result) is not None:  # held by rho; the SDK approved it (needs_approval): rho runs it
            result = await asyncio.to_thread(loop.approve, call.id, None, "openai-agents")
        return result.content

    async def needs_approval(ctx: RunContextWrapper[Any], params: dict[str, Any], sdk_call_id: str) -> bool:
        return loop.requires_approval(ToolCall(call_id(sdk_call_id), name, params))

    asks = info.requires_approval or loop.approval_policy is not None  # else no call of it is ever held
    if isinstance(entry.tool, SdkFunctionTool) and entry.isolation == "thread" and not entry.untrusted:
        return _routed(loop, entry.tool.tool, needs_approval if asks else False, info.timeout_ms)
    return FunctionTool(
        name=name, description=info.description, params_json_schema=copy.deepcopy(info.parameter_schema),
        on_invoke_tool=on_invoke_tool, strict_json_schema=False, needs_approval=needs_approval if asks else False,
    )


class LoopFunctionTools(list[Tool]):
    """A ``list`` of ``agents.FunctionTool`` that follows ``loop``: each time it is
    iterated (the SDK reads ``Agent.tools`` once per turn) it first becomes the loop's
    offered tools now, so withheld and unregistered tools drop out and new ones join.
    A tool whose declaration is unchanged keeps its ``FunctionTool`` object. The offer
    is read in the iterating thread from the loop's snapshot (no actor is asked)."""

    def __init__(self, loop: Loop) -> None:
        if not isinstance(loop, Loop):
            raise TypeError(f"function_tools takes a rho_actors.Loop, got {type(loop).__name__}")
        self._loop = loop
        self._made: dict[str, tuple[ToolInfo, FunctionTool]] = {}
        self._entries: dict[str, ToolEntry] = {}
        self._lock = threading.Lock()
        super().__init__(self._current())

    def _current(self) -> list[Tool]:
        entries = self._loop.offered_entries()
        with self._lock:
            self._entries = {entry.info.name: entry for entry in entries}
            self._made = kept_while_unchanged(
                self._made, [entry.info for entry in entries],
                lambda info: _function_tool(self._loop, self._entries[info.name]))
            return [tool for _, tool in self._made.values()]

    def refresh(self) -> None:
        """Become the loop's offered tools now (iteration does this by itself)."""
        super().__init__(self._current())

    def __iter__(self) -> Iterator[Tool]:
        self.refresh()
        return super().__iter__()


def function_tools(loop: Loop) -> LoopFunctionTools:
    """The tools ``loop`` offers as ``agents.FunctionTool`` values, for
    ``Agent(tools=...)``: a :class:`LoopFunctionTools` that follows the loop's offer.
    Each ``on_invoke_tool(ctx, arguments)`` runs ``ToolCall(ctx.tool_call_id, name,
    arguments)`` as a turn of ``loop`` (rho checks the arguments against the tool's
    schema: the SDK is told ``strict_json_schema=False``) and returns the result's text,
    the text rho's own loop gives a model (an error's names what went wrong). Raises
    ``TypeError`` when ``loop`` is not a :class:`rho_actors.Loop`, and what
    :meth:`Loop.offered` raises when it has stopped."""
    return LoopFunctionTools(loop)
