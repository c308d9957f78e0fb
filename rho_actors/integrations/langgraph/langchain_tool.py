"""A LangChain tool (a ``langchain_core.tools.BaseTool``, ``@tool`` functions included)
as a rho tool: what :meth:`rho_actors.ActorSystem.register` makes of one (DESIGN §6c).

The declaration is the tool's own: ``name``, ``description`` and the JSON Schema of its
arguments (``tool_call_schema``: its ``args_schema`` without injected arguments). A
call runs ``tool.invoke(args)`` (``await tool.ainvoke(args)`` for a tool with only a
coroutine, which then gets asyncio cancellation at its deadline); what it raises, a
``ToolException`` included, is a ``raised`` result.

A call that LangGraph's ``ToolNode`` makes through rho (``RhoToolNode``) has a
:class:`~rho_actors.integrations.host_side.HostSideCall` (``given``: ``call_args`` and
``config``): the tool is then invoked as ``ToolNode`` invokes it (the whole tool call,
with the injected arguments, and the run's config), and what it returns or raises is kept there as the
very object for ``ToolNode`` (rho's result is its text).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from langchain_core.tools import BaseTool
from pydantic import BaseModel

from rho_actors.integrations.host_side import HOST_SIDE_CALLS, HostSideCall

__all__ = ["AsyncLangChainTool", "LangChainTool", "from_langchain", "invocation", "model_arguments"]


def invocation(host: HostSideCall, args: Mapping[str, Any]) -> dict[str, Any]:
    """The tool call ``ToolNode`` would invoke the tool with (``host.given["call_args"]``,
    injected arguments included), over ``args`` (what rho's check let through)."""
    call_args = host.given["call_args"]
    return {**call_args, "args": {**args, **call_args.get("args", {})}}





def _schema(tool: BaseTool) -> dict[str, Any]:
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return copy.deepcopy(schema)
    if not issubclass(schema, BaseModel):  # a pydantic.v1 model
        raise TypeError(f"LangChain tool {tool.name!r}: its args schema is a pydantic v1 model; use pydantic v2")
    return schema.model_json_schema()


def model_arguments(tool: BaseTool, args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` without what the model may not set: only the properties of the tool's
    ``tool_call_schema`` (a value the model sends for an injected argument, such as
    ``InjectedToolArg`` or ``InjectedState``, never reaches the tool, as under LangGraph's
    ``ToolNode``), unless that schema lets other properties in."""
    schema = _schema(tool)
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or schema.get("additionalProperties") not in (None, False):
        return dict(args)
    return {name: value for name, value in args.items() if name in properties}


class LangChainTool:
    """A rho tool standing for LangChain tool ``tool`` (its callbacks read it when
    called, so a tool registered untrusted is read in a worker process)."""

    def __init__(self, tool: BaseTool) -> None:
        self.tool = tool

    def name(self) -> str:
        """The LangChain tool's own name."""
        return self.tool.name

    def description(self) -> str:
        """The LangChain tool's own description."""
        return self.tool.description

    def parameter_schema(self) -> dict[str, Any]:
        """The JSON Schema of the tool's arguments, from its own args schema."""
        return _schema(self.tool)

    def run(self, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        """``tool.invoke(args)``: what it returns, or what it raises (a rho error result);
        a call ``ToolNode`` makes is invoked as ``ToolNode`` would (see the module doc)."""
        host = HOST_SIDE_CALLS.get(ctx)
        if host is None:
            return self.tool.invoke(model_arguments(self.tool, args))
        try:
            return host.keep(self.tool.invoke(invocation(host, args), host.given["config"]))
        except Exception as e:  # a GraphInterrupt too; never a cancellation at the deadline
            host.raised = e
            raise


class AsyncLangChainTool(LangChainTool):
    """:class:`LangChainTool` for a tool with a coroutine and no sync function."""

    async def run(self, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        """``await tool.ainvoke(args)``, cancelled at the call's deadline."""
        host = HOST_SIDE_CALLS.get(ctx)
        if host is None:
            return await self.tool.ainvoke(model_arguments(self.tool, args))
        try:
            return host.keep(await self.tool.ainvoke(invocation(host, args), host.given["config"]))
        except Exception as e:  # a GraphInterrupt too; never a cancellation at the deadline
            host.raised = e
            raise


def from_langchain(tool: BaseTool) -> LangChainTool:
    """The rho tool for LangChain tool ``tool``; ``TypeError`` when it is no
    ``BaseTool``."""
    if not isinstance(tool, BaseTool):
        raise TypeError(f"from_langchain takes a langchain_core.tools.BaseTool, got {type(tool).__name__}")
    only_async = getattr(tool, "coroutine", None) is not None and getattr(tool, "func", None) is None
    return AsyncLangChainTool(tool) if only_async else LangChainTool(tool)
