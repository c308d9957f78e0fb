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
import threading
from collections.abc import Iterator
from typing import Any

from rho_actors.errors import needs_extra

with needs_extra("openai-agents", "rho_actors.integrations.openai_agents"):
    from agents import FunctionTool, Tool
    from agents.run_context import RunContextWrapper
    from agents.tool_context import ToolContext

from rho_actors.integrations.sessions import call_id, kept_while_unchanged
from rho_actors.lifecycle import pending_call
from rho_actors.loop.handle import Loop
from rho_actors.tool import ToolCall, ToolInfo

__all__ = ["LoopFunctionTools", "function_tools"]


def _function_tool(loop: Loop, info: ToolInfo) -> FunctionTool:
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
        self._lock = threading.Lock()
        super().__init__(self._current())

    def _current(self) -> list[Tool]:
        offered = [entry.info for entry in self._loop.offered_entries()]
        with self._lock:
            self._made = kept_while_unchanged(self._made, offered, lambda info: _function_tool(self._loop, info))
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
