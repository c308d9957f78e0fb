"""A LangChain tool (a ``langchain_core.tools.BaseTool``, ``@tool`` functions included)
as a rho tool: what :meth:`rho_actors.ActorSystem.register` makes of one (DESIGN §6c).

The declaration is the tool's own: ``name``, ``description`` and the JSON Schema of its
arguments (``tool_call_schema``: its ``args_schema`` without injected arguments). A
call runs ``tool.invoke(args)`` (``await tool.ainvoke(args)`` for a tool with only a
coroutine, which then gets asyncio cancellation at its deadline); what it raises, a
``ToolException`` included, is a ``raised`` result.

A call that LangGraph's ``ToolNode`` makes through rho (``RhoToolNode``) has a
:class:`HostSideCall` in :data:`HOST_SIDE_CALLS` under its session and call id: the tool
is then invoked as ``ToolNode`` invokes it (the whole tool call, with the injected
arguments, and the run's config), and what it returns or raises is kept there as the
very object for ``ToolNode`` (rho's result is its text).
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from langchain_core.tools import BaseTool
from pydantic import BaseModel

__all__ = ["HOST_SIDE_CALLS", "AsyncLangChainTool", "HostSideCall", "HostSideCalls", "LangChainTool", "from_langchain"]


class HostSideCall:
    """One call ``ToolNode`` makes through rho: ``call_args`` (the tool call dict
    ``ToolNode`` would invoke the tool with, injected arguments included) and ``config``
    (the run's); after the call, ``output`` (what the tool returned, when ``returned``)
    or ``raised`` (the exception it raised)."""

    def __init__(self, call_args: Mapping[str, Any], config: Any) -> None:
        self.call_args = dict(call_args)
        self.config = config
        self.returned = False
        self.output: Any = None
        self.raised: Exception | None = None

    def invocation(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The tool call to invoke: ``args`` (what rho's check let through) with the
        injected arguments over them."""
        return {**self.call_args, "args": {**args, **self.call_args.get("args", {})}}

    def text(self, output: Any) -> Any:
        """Keep ``output`` and give rho its text: a ``ToolMessage``'s content, else
        ``output`` itself when it is plain data, else its ``str``."""
        self.output, self.returned = output, True
        content = getattr(output, "content", output)
        plain = content is None or isinstance(content, str | int | float | bool | list | dict)
        return content if plain else str(content)


class HostSideCalls:
    """The calls ``ToolNode`` makes now, by (session id, call id)."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str], HostSideCall] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def holding(self, session_id: str, call_id: str, call: HostSideCall | None) -> Iterator[None]:
        """``call`` known under (``session_id``, ``call_id``) while the block runs (nothing for ``None``)."""
        if call is None:
            yield
            return
        key = (session_id, call_id)
        with self._lock:
            self._calls[key] = call
        try:
            yield
        finally:
            with self._lock:
                if self._calls.get(key) is call:
                    del self._calls[key]

    def get(self, ctx: Mapping[str, Any]) -> HostSideCall | None:
        """The host-side call of a rho call's context ``ctx``, or ``None``."""
        with self._lock:
            return self._calls.get((str(ctx.get("session_id", "")), str(ctx.get("call_id", ""))))


HOST_SIDE_CALLS = HostSideCalls()
"""The process's host-side calls (see the module doc)."""


def _schema(tool: BaseTool) -> dict[str, Any]:
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return copy.deepcopy(schema)
    if not issubclass(schema, BaseModel):  # a pydantic.v1 model
        raise TypeError(f"LangChain tool {tool.name!r}: its args schema is a pydantic v1 model; use pydantic v2")
    return schema.model_json_schema()


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
            return self.tool.invoke(dict(args))
        try:
            return host.text(self.tool.invoke(host.invocation(args), host.config))
        except Exception as e:  # a GraphInterrupt too; never a cancellation at the deadline
            host.raised = e
            raise


class AsyncLangChainTool(LangChainTool):
    """:class:`LangChainTool` for a tool with a coroutine and no sync function."""

    async def run(self, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        """``await tool.ainvoke(args)``, cancelled at the call's deadline."""
        host = HOST_SIDE_CALLS.get(ctx)
        if host is None:
            return await self.tool.ainvoke(dict(args))
        try:
            return host.text(await self.tool.ainvoke(host.invocation(args), host.config))
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
