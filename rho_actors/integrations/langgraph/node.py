""":class:`RhoToolNode`: LangGraph's own ``ToolNode`` whose tools run through rho
(DESIGN §6c).

Everything LangGraph's ``ToolNode`` does around a call is its own code, unchanged: the
input shapes (messages, a ``MessagesState``, a list of tool calls, a ``Send``'s
``ToolCallWithContext``), ``messages_key``, injected arguments (``InjectedState``,
``InjectedStore``, ``InjectedToolCallId``, ``ToolRuntime``: a value the model sends for
one never reaches the tool), ``handle_tool_errors``, ``wrap_tool_call`` /
``awrap_tool_call``, ``Command`` and ``ToolMessage`` returns, content blocks. Only the
tool's invocation is rho's: each call runs as a rho turn of one in the session's loop,
under the model's call id, with its deadline, isolation and supervision. For a LangChain
tool registered in rho (``system.register(langchain_tool)``, trusted, ``thread``
isolation) the tool is invoked as ``ToolNode`` would, with the injected values and the
run's config, and what it returns or raises reaches ``ToolNode`` as the very object; for
any other rho tool (or a LangChain tool in a worker process) the model's arguments go in
and rho's text comes back. What only rho has (a deadline passed, a crash, an argument
that fails rho's schema check but not the tool's own validation, a tool withheld) is an
error ``ToolMessage`` with rho's text, whatever ``handle_tool_errors`` says.

Calls rho would hold for approval (their tool's ``requires_approval``, the loop's
``approval`` policy) pause the graph with LangGraph's ``interrupt`` before any call of
the step runs (the node runs again from its start when resumed: nothing has run twice).
The interrupt's value is ``{"session": id, "pending": [{"call_id", "name", "arguments"},
...]}``; resume with ``Command(resume={call_id: decision})``, a decision being ``True``
(approve), ``{"arguments": {...}}`` (approve these edited arguments), or a ``str``
(reject, the text for the model; ``False`` or a missing decision rejects too). Each is a
rho decision, ``decided_by="langgraph"``.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import interrupt
from pydantic import BaseModel

from rho_actors.declarations.formats import to_dialect
from rho_actors.integrations.host_side import HOST_SIDE_CALLS, HostSideCall
from rho_actors.integrations.langgraph.langchain_tool import LangChainTool
from rho_actors.integrations.sessions import SessionLoops, call_id
from rho_actors.lifecycle import pending_call
from rho_actors.tool import ErrorKind, ToolCall, ToolInfo, ToolResult

if TYPE_CHECKING:
    from rho_actors.declarations.toolset import ToolEntry
    from rho_actors.loop.handle import Loop
    from rho_actors.system import ActorSystem

__all__ = ["RhoToolNode"]

_DECISIONS: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "rho_langgraph_decisions", default=types.MappingProxyType({}))
"""The graph's approval decisions for the step being run (read by each call's route)."""


def _thread_id(config: RunnableConfig | None) -> str | None:
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else None


def _decisions(loop: Loop, calls: list[ToolCall]) -> dict[str, Any]:
    """The graph's decisions on the calls rho would hold: none asked when none would be
    held, else LangGraph's ``interrupt`` (which pauses the graph the first time and
    returns the ``Command(resume=...)`` value when resumed)."""
    held = [c for c in calls if loop.requires_approval(c)]
    if not held:
        return {}
    answer = interrupt({"session": loop.session_id, "pending": [
        {"call_id": c.id, "name": c.name, "arguments": c.arguments} for c in held]})
    return dict(answer) if isinstance(answer, dict) else {}


def _decided(loop: Loop, results: list[ToolResult], decisions: Mapping[str, Any]) -> list[ToolResult]:
    """``results`` with each held call decided, in the model's order: as the graph said,
    or approved when it was held only behind an earlier call of its exclusive turn."""
    decided = list(results)
    for index, result in enumerate(results):
        if pending_call(result) is None:  # held by rho, not a tool's own answer claiming that kind
            continue
        decision = decisions.get(result.call_id, None if "runs after call" not in result.content else True)
        if decision is True or (isinstance(decision, dict) and "arguments" in decision):
            arguments = decision["arguments"] if isinstance(decision, dict) else None
            decided[index] = loop.approve(result.call_id, arguments, "langgraph")
        else:
            why = decision if isinstance(decision, str) and decision.strip() else "the call was not approved"
            decided[index] = loop.reject(result.call_id, why, "langgraph")
    return decided


def _stand_in(info: ToolInfo) -> BaseTool:
    """A LangChain tool standing for rho tool ``info`` in ``ToolNode.tools_by_name``: its
    name, description and schema (it is never invoked: each call goes through rho)."""

    def never(**kwargs: Any) -> Any:  # pragma: no cover - every call is routed through rho
        raise RuntimeError(f"rho tool {info.name!r} runs only through rho")

    return StructuredTool(name=info.name, description=info.description, args_schema=dict(info.parameter_schema),
                          func=never)


def _model_properties(tool: BaseTool) -> set[str] | None:
    """The argument names the model may send (``tool_call_schema``'s), ``None`` when unknown."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        properties = schema.get("properties")
    elif isinstance(schema, type) and issubclass(schema, BaseModel):
        properties = schema.model_fields
    else:
        return None
    return set(properties) if isinstance(properties, Mapping) else None


class _Route:
    """What ``ToolNode`` invokes for one call: the call as a rho turn of one. ``tool`` is
    the LangChain tool rho runs in this process (its invocation gets the injected
    arguments and the run's config through :data:`HOST_SIDE_CALLS`), or ``None``."""

    def __init__(self, node: RhoToolNode, request: ToolCallRequest, local: BaseTool | None) -> None:
        self._node = node
        self._request = request
        self._local = local

    def _calls(self, call_args: Mapping[str, Any], config: RunnableConfig | None) -> tuple[Loop, ToolCall, Any]:
        call = self._request.tool_call
        loop = self._node.session_loop(config)
        injected_args = dict(call_args.get("args") or {})
        allowed = _model_properties(self._local) if self._local is not None else None
        model_args = {k: v for k, v in (call.get("args") or {}).items() if allowed is None or k in allowed}
        rho_call = ToolCall(call_id(call.get("id")), str(call["name"]), model_args)
        given = {"call_args": {**call_args, "args": injected_args}, "config": config}
        host = HostSideCall(given) if self._local is not None else None
        return loop, rho_call, host

    def _answer(self, result: ToolResult, host: HostSideCall | None) -> Any:
        if host is not None and result.error_kind is ErrorKind.RAISED and host.raised is not None:
            raise host.raised
        if host is not None and result.ok and host.returned:
            return host.output
        if result.error_kind is ErrorKind.INVALID_ARGUMENTS and self._local is not None:
            self._validate(result)
        call = self._request.tool_call
        return ToolMessage(result.content, tool_call_id=call.get("id") or result.call_id, name=result.name,
                           status="success" if result.ok else "error")

    def _validate(self, result: ToolResult) -> None:
        """Raise the tool's own ``ValidationError`` for arguments rho's schema check
        refused (``ToolNode`` words it), when the tool's own validation refuses them too."""
        assert self._local is not None
        schema = self._local.tool_call_schema
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            schema.model_validate(self._request.tool_call.get("args") or {})


    def invoke(self, call_args: Mapping[str, Any], config: RunnableConfig | None = None, **_: Any) -> Any:
        loop, rho_call, host = self._calls(call_args, config)
        with HOST_SIDE_CALLS.holding(loop.session_id, rho_call.id, host):
            (result,) = loop.run_turn([rho_call])
            if pending_call(result) is not None:
                (result,) = _decided(loop, [result], _DECISIONS.get())
            return self._answer(result, host)

    async def ainvoke(self, call_args: Mapping[str, Any], config: RunnableConfig | None = None, **_: Any) -> Any:
        loop, rho_call, host = self._calls(call_args, config)
        with HOST_SIDE_CALLS.holding(loop.session_id, rho_call.id, host):
            (result,) = await loop.arun_turn([rho_call])
            if pending_call(result) is not None:
                decisions = _DECISIONS.get()
                (result,) = await asyncio.to_thread(_decided, loop, [result], decisions)
            return self._answer(result, host)


class RhoToolNode(ToolNode):
    """LangGraph's ``ToolNode`` (a subclass: every argument and input shape of it) whose
    tools are what ``target`` offers now and whose calls run through rho, each as a rho
    turn of one under the model's call id (see the module doc).

    ``target`` is a :class:`rho_actors.Loop` (every call runs in that session) or an
    :class:`rho_actors.ActorSystem` (the session is the graph's ``thread_id``, started
    on first use; :meth:`close` stops those loops). The keyword arguments are
    ``ToolNode``'s own (``name``, ``tags``, ``handle_tool_errors``, ``messages_key``,
    ``wrap_tool_call``, ``awrap_tool_call``). Raises ``TypeError`` for a ``target`` that
    is neither; ``invoke`` raises what ``ToolNode`` raises for its input, and
    ``ValueError`` (given a system) for a run without ``thread_id``.
    """

    def __init__(self, target: Loop | ActorSystem, **tool_node_kwargs: Any) -> None:
        self._sessions = SessionLoops(target, what="RhoToolNode")
        self._made: dict[str, tuple[ToolInfo, BaseTool]] = {}
        self._made_lock = threading.Lock()
        super().__init__([], **tool_node_kwargs)

    def session_loop(self, config: RunnableConfig | None) -> Loop:
        """The loop a call of a run with ``config`` runs in (see the class doc)."""
        return self._sessions.loop(_thread_id(config))

    @property
    def tools_by_name(self) -> dict[str, BaseTool]:
        """The offered tools now, by name, as LangChain tools: a LangChain tool registered
        in rho is itself, any other rho tool a stand-in with its declaration. Read again
        at each access (withheld and unregistered tools drop out, new ones join)."""
        entries = self._sessions.offered_entries()
        with self._made_lock:
            made: dict[str, tuple[ToolInfo, BaseTool]] = {}
            for entry in entries:
                known = self._made.get(entry.info.name)
                if known is not None and (known[0] is entry.info or known[0] == entry.info):
                    made[entry.info.name] = known
                else:
                    made[entry.info.name] = (entry.info, self._langchain_tool(entry))
            self._made = made
            self._tools_by_name = {name: tool for name, (_, tool) in made.items()}
            for name, tool in self._tools_by_name.items():
                if name not in self._injected_args:
                    self._injected_args[name] = _injected_args(tool)
            return self._tools_by_name

    @staticmethod
    def _langchain_tool(entry: ToolEntry) -> BaseTool:
        if isinstance(entry.tool, LangChainTool) and entry.isolation == "thread" and not entry.untrusted:
            return entry.tool.tool
        return _stand_in(entry.info)

    def _local(self, request: ToolCallRequest) -> BaseTool | None:
        """The LangChain tool rho runs in this process for ``request``, if it is one."""
        tool = request.tool
        if tool is None:
            return None
        for entry in self._sessions.offered_entries():
            if entry.info.name == tool.name:
                return tool if isinstance(entry.tool, LangChainTool) and entry.tool.tool is tool else None
        return None

    def _routed(self, request: ToolCallRequest) -> ToolCallRequest:
        if request.tool is None or request.tool.name not in self.tools_by_name:
            return request  # ToolNode answers a call of a tool it does not know (or a wrapper's own tool)
        route: Any = _Route(self, request, self._local(request))
        return request.override(tool=route)

    def _execute_tool_sync(self, request: ToolCallRequest, input_type: Any, config: RunnableConfig) -> Any:
        return super()._execute_tool_sync(self._routed(request), input_type, config)

    async def _execute_tool_async(self, request: ToolCallRequest, input_type: Any, config: RunnableConfig) -> Any:
        return await super()._execute_tool_async(self._routed(request), input_type, config)

    def _step_decisions(self, input: Any, config: RunnableConfig) -> dict[str, Any]:
        tool_calls, _ = self._parse_input(input)
        loop = self.session_loop(config)
        return _decisions(loop, [ToolCall(call_id(c.get("id")), str(c["name"]), dict(c.get("args") or {}))
                                 for c in tool_calls])

    def _func(self, input: Any, config: RunnableConfig, runtime: Any) -> Any:
        token = _DECISIONS.set(self._step_decisions(input, config))
        try:
            return super()._func(input, config, runtime)
        finally:
            _DECISIONS.reset(token)

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Any) -> Any:
        token = _DECISIONS.set(self._step_decisions(input, config))
        try:
            return await super()._afunc(input, config, runtime)
        finally:
            _DECISIONS.reset(token)

    def declarations(self, config: RunnableConfig | None = None) -> list[dict[str, Any]]:
        """The tools offered now (the thread's session's, given a system), in
        OpenAI's function format, which ``bind_tools`` of every chat model takes."""
        return [to_dialect(info, "openai") for info in self._sessions.offered(_thread_id(config))]

    def bind_model(self, model: BaseChatModel, **bind_kwargs: Any) -> Runnable[Any, Any]:
        """(Not ``bind``, which every LangChain ``Runnable`` has for its own purpose.)
        ``model`` with the offered tools bound afresh at every invocation
        (``model.bind_tools(self.declarations(config), **bind_kwargs)``), so withheld
        and unregistered tools drop out and new ones join at the next step."""

        def call(messages: Any, config: RunnableConfig) -> Any:
            return model.bind_tools(self.declarations(config), **bind_kwargs).invoke(messages, config)

        async def acall(messages: Any, config: RunnableConfig) -> Any:
            return await model.bind_tools(self.declarations(config), **bind_kwargs).ainvoke(messages, config)

        return RunnableLambda(call, acall, name="rho_bound_model")

    def close(self) -> None:
        """Stop the loops started for threads (a loop given as ``target`` stays)."""
        self._sessions.close()


def _injected_args(tool: BaseTool) -> Any:
    from langgraph.prebuilt import tool_node

    finder: Callable[[BaseTool], Any] = tool_node._get_all_injected_args
    return finder(tool)
