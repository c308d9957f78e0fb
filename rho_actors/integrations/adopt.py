"""Other frameworks' tools as rho tools, for :meth:`rho_actors.ActorSystem.register`
(DESIGN §6c). No framework is imported here: a LangChain tool exists only once
``langchain_core`` is loaded (an Agents SDK tool once ``agents`` is, a pydantic-ai one once
``pydantic_ai`` is), and only a value's
type is looked at."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["adopted", "registered_as"]


def _langchain_tool(value: object) -> bool:
    tools = sys.modules.get("langchain_core.tools")
    return tools is not None and issubclass(type(value), tools.BaseTool)


def _sdk_tool(value: object) -> bool:
    tools = sys.modules.get("agents.tool")
    return tools is not None and issubclass(type(value), tools.FunctionTool)


def _pydantic_ai_tool(value: object) -> bool:
    tools = sys.modules.get("pydantic_ai.tools")
    return tools is not None and issubclass(type(value), tools.Tool)


def _foreign(value: object) -> bool:
    return _langchain_tool(value) or _sdk_tool(value) or _pydantic_ai_tool(value)


def adopted(tool: Any, isolation: str | None = None) -> Any:
    """A LangChain ``BaseTool``, an Agents SDK ``FunctionTool`` or a pydantic-ai ``Tool``
    as its rho tool (:func:`rho_actors.integrations.langgraph.langchain_tool.from_langchain`,
    :func:`rho_actors.integrations.openai_agents.sdk_tool.from_function_tool`,
    :func:`rho_actors.integrations.pydantic_ai.pydantic_tool.from_pydantic_ai_tool`), to
    run in ``isolation`` (``None``: the default); any other value as it is. Raises what
    they raise (a ``ValueError`` for a tool that cannot run in ``isolation``)."""
    if _langchain_tool(tool):
        from rho_actors.integrations.langgraph.langchain_tool import from_langchain

        return from_langchain(tool)
    if _sdk_tool(tool):
        from rho_actors.integrations.openai_agents.sdk_tool import from_function_tool

        return from_function_tool(tool)
    if _pydantic_ai_tool(tool):
        from rho_actors.integrations.pydantic_ai.pydantic_tool import from_pydantic_ai_tool

        return from_pydantic_ai_tool(tool, isolation)
    return tool


def registered_as(name_or_tool: Any) -> Any:
    """What the registry knows ``name_or_tool`` by: a LangChain tool's name (its rho
    tool is a new object), else ``name_or_tool``."""
    return name_or_tool.name if _foreign(name_or_tool) else name_or_tool
