"""An OpenAI Agents SDK ``FunctionTool`` (``@agents.function_tool`` functions included)
as a rho tool: what :meth:`rho_actors.ActorSystem.register` makes of one (DESIGN §6c).

The declaration is the tool's own: ``name``, ``description``, ``params_json_schema``. A
call runs the tool's own ``on_invoke_tool`` (the SDK's argument parsing, its
``failure_error_function``, the function itself): given the ``ToolContext`` of the SDK's
run when the SDK makes the call through rho (``function_tools``: a
:class:`~rho_actors.integrations.host_side.HostSideCall` whose ``given`` holds
``context`` and ``arguments``, the JSON text the model sent), else a ``ToolContext``
without a run context. What it returns is kept for the SDK as the very object (rho's
result is its text); what it raises is a ``raised`` result (an ``exited`` one for a
``BaseException``), and the very exception for the SDK.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Mapping
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

from rho_actors.integrations.host_side import HOST_SIDE_CALLS

__all__ = ["SdkFunctionTool", "from_function_tool"]

WRAPPED_MARKER = "__agents_function_tool_wrapped_callable__"
"""The attribute on which ``function_tool``'s invocation keeps the function it wraps."""


class SdkFunctionTool:
    """A rho tool standing for the Agents SDK's ``FunctionTool`` ``tool``."""

    def __init__(self, tool: FunctionTool) -> None:
        self.tool = tool

    def name(self) -> str:
        """The SDK tool's own name."""
        return self.tool.name

    def description(self) -> str:
        """The SDK tool's own description; its name when it has none (the SDK allows an
        empty one, rho's declaration check does not; the SDK still sees its own)."""
        return self.tool.description or self.tool.name

    def parameter_schema(self) -> dict[str, Any]:
        """The SDK tool's own ``params_json_schema`` (a copy), checked as the SDK checks
        arguments: a strict schema lists every property as required and forbids others
        (what OpenAI's strict mode needs), while the SDK's own validation, which runs in
        the call, lets an argument with a default (or that may be null) be left out, a
        function's ``*args`` and ``**kwargs`` too (empty by default), and ignores extra
        ones; rho's check does the same."""
        schema = copy.deepcopy(self.tool.params_json_schema)
        if not self.tool.strict_json_schema:
            return schema
        properties = schema.get("properties") or {}
        required = schema.get("required")
        if isinstance(required, list):
            variadic = _variadic(self.tool)
            schema["required"] = [name for name in required
                                  if not _optional(properties.get(name)) and name not in variadic]
        if schema.get("additionalProperties") is False:
            del schema["additionalProperties"]
        return schema

    async def run(self, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        """``await tool.on_invoke_tool(context, arguments)``: what it returns, or what
        it raises (a rho error result); cancelled at the call's deadline."""
        host = HOST_SIDE_CALLS.get(ctx)
        if host is None:
            text = json.dumps(dict(args))
            context: ToolContext[Any] = ToolContext(
                None, tool_name=self.tool.name, tool_call_id=str(ctx.get("call_id", "")), tool_arguments=text)
            return await self.tool.on_invoke_tool(context, text)
        invoke = host.given.get("invoke", self.tool.on_invoke_tool)
        with host.running():
            try:
                return host.keep(await invoke(host.given["context"], host.given["arguments"]))
            except BaseException as e:  # the adapter re-raises it, as the SDK would (not past the deadline)
                host.raised = e
                raise


def _optional(schema: Any) -> bool:
    """Whether a strict schema's property may be left out for the SDK: it has a default,
    or it may be null."""
    if not isinstance(schema, dict):
        return False
    if "default" in schema or schema.get("type") == "null":
        return True
    options = schema.get("anyOf") or schema.get("oneOf") or []
    types = schema.get("type")
    return (isinstance(types, list) and "null" in types) or any(
        isinstance(o, dict) and o.get("type") == "null" for o in options)


def _variadic(tool: FunctionTool) -> frozenset[str]:
    """The names of the ``*args`` and ``**kwargs`` parameters of the function that
    ``function_tool`` made ``tool`` of (none for a ``FunctionTool`` made by hand): the
    SDK's strict schema requires them, its own validation gives them an empty list or
    dict (``default_factory``, which no JSON schema shows)."""
    invoker = tool.on_invoke_tool
    function = getattr(getattr(invoker, "_invoke_tool_impl", invoker), WRAPPED_MARKER, None)
    if function is None:
        return frozenset()
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the schema as it is
        return frozenset()
    return frozenset(p.name for p in parameters if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def from_function_tool(tool: FunctionTool) -> SdkFunctionTool:
    """The rho tool for the SDK's ``FunctionTool`` ``tool``; ``TypeError`` for anything else."""
    if not isinstance(tool, FunctionTool):
        raise TypeError(f"from_function_tool takes an agents.FunctionTool, got {type(tool).__name__}")
    return SdkFunctionTool(tool)
