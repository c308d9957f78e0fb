"""A pydantic-ai ``Tool`` (what ``@agent.tool``, ``@agent.tool_plain`` and
``FunctionToolset`` make of a function) as a rho tool: what
:meth:`rho_actors.ActorSystem.register` makes of one (DESIGN §6c).

The declaration is the tool's own: ``name``, ``description`` (its name when it has none),
its function schema's JSON schema. When pydantic-ai makes the call through rho
(:class:`~rho_actors.integrations.pydantic_ai.RhoToolset`: a
:class:`~rho_actors.integrations.host_side.HostSideCall` whose ``given`` holds
``invoke``, pydantic-ai's own call of its tool with the validated arguments and the
run's ``RunContext``), that call runs: what it returns is kept for pydantic-ai as the
very object (rho's result is its JSON form), what it raises (``ModelRetry``,
``CallDeferred``, ``ApprovalRequired``, any error) is a ``raised`` result and reaches
pydantic-ai as itself. A call rho makes on its own validates the arguments with the
tool's own validator and runs the function, which then gets no ``RunContext``: a tool
that takes one raises ``TypeError`` saying so, and is refused at registration in an
isolation other than ``thread``. The tool's ``timeout`` is rho's deadline (``timeout_ms``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from pydantic_ai import Tool
from pydantic_ai.messages import ToolReturn
from pydantic_core import PydanticSerializationError, to_jsonable_python

from rho_actors.integrations.host_side import HOST_SIDE_CALLS
from rho_actors.tool import DEFAULT_TIMEOUT_MS

__all__ = ["PydanticAiTool", "from_pydantic_ai_tool", "jsonable"]


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (pydantic's serialization, by alias; ``str`` of what
    it cannot serialize): rho's record of a pydantic-ai value. Never raises: what
    pydantic-ai itself cannot serialize is for pydantic-ai to say."""
    try:
        return to_jsonable_python(value, fallback=str, by_alias=True)
    except (PydanticSerializationError, ValueError):  # bytes that are not UTF-8 raise UnicodeDecodeError
        return str(value)


class PydanticAiTool:
    """A rho tool standing for pydantic-ai's ``Tool`` ``tool``."""

    def __init__(self, tool: Tool[Any]) -> None:
        self.tool = tool

    def name(self) -> str:
        """The pydantic-ai tool's own name."""
        return self.tool.name

    def description(self) -> str:
        """The tool's own description; its name when it has none (pydantic-ai allows
        none, rho's declaration check does not; pydantic-ai still sees its own)."""
        return self.tool.description or self.tool.name

    def arguments(self, validated: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON form of arguments pydantic-ai validated for this tool, shaped as its
        schema declares them (a single model-like parameter's fields at the top, as the
        schema has them)."""
        single = self.tool.function_schema.single_arg_name
        if single is not None and set(validated) == {single}:
            fields = jsonable(validated[single])
            if isinstance(fields, dict) and single not in self.tool.function_schema.json_schema.get("properties", {}):
                return fields
        return dict(jsonable(dict(validated)))

    def parameter_schema(self) -> dict[str, Any]:
        """The tool's function schema's JSON schema (a copy)."""
        return copy.deepcopy(self.tool.function_schema.json_schema)

    def timeout_ms(self) -> int:
        """The tool's own ``timeout`` (seconds) as rho's deadline, in milliseconds
        (rounded up); rho's default when it has none."""
        timeout = self.tool.timeout
        return DEFAULT_TIMEOUT_MS if timeout is None else max(1, math.ceil(timeout * 1000))

    async def run(self, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        """pydantic-ai's own call of the tool (see the module's docstring): its result in
        JSON form, or what it raises (a rho error result); cancelled at the call's
        deadline. Raises ``TypeError`` for a tool taking a ``RunContext`` that rho calls
        on its own."""
        host = HOST_SIDE_CALLS.get(ctx)
        if host is None:
            schema = self.tool.function_schema
            if schema.takes_ctx:
                raise TypeError(f"pydantic-ai tool {self.tool.name!r} takes a RunContext, which only pydantic-ai "
                                "gives: call it through RhoToolset")
            validated = schema.validator.validate_python(dict(args))
            return jsonable(_returned(await schema.call(validated, None)))  # type: ignore[arg-type]
        try:
            output = await host.given["invoke"]()
        except BaseException as e:  # the adapter re-raises it for a raised or cancelled result
            host.raised = e
            raise
        host.output, host.returned = output, True
        return jsonable(_returned(output))


def _returned(output: Any) -> Any:
    """What a tool's result says to the model: a ``ToolReturn``'s ``return_value``."""
    return output.return_value if isinstance(output, ToolReturn) else output


def from_pydantic_ai_tool(tool: Tool[Any], isolation: str | None = None) -> PydanticAiTool:
    """The rho tool for pydantic-ai's ``Tool`` ``tool``, to run in ``isolation`` (``None``:
    ``"thread"``). Raises ``TypeError`` for anything but a ``Tool``, and ``ValueError``
    for a tool taking a ``RunContext`` in another isolation than ``"thread"``: the run's
    context (its deps, model, messages, usage) lives in this process and reaches the
    tool only here."""
    if not isinstance(tool, Tool):
        raise TypeError(f"from_pydantic_ai_tool takes a pydantic_ai.Tool, got {type(tool).__name__}")
    if isolation not in (None, "thread") and tool.function_schema.takes_ctx:
        raise ValueError(
            f"pydantic-ai tool {tool.name!r} takes a RunContext, which cannot reach {isolation!r} isolation (the "
            "run's context lives in this process): register it with isolation='thread', or make it a plain tool "
            "(@agent.tool_plain, Tool(takes_ctx=False)) that takes what it needs as arguments")
    return PydanticAiTool(tool)
