""":class:`RhoToolNode`: a LangGraph node running the last ``AIMessage``'s tool calls
as one rho turn (DESIGN §6c).

Calls rho would hold for approval (their tool's ``requires_approval``, the loop's
``approval`` policy) pause the graph with LangGraph's ``interrupt`` before any call of
the turn runs (the node runs again from its start when resumed: nothing has run twice).
The interrupt's value is ``{"session": id, "pending": [{"call_id", "name", "arguments"},
...]}``; resume with ``Command(resume={call_id: decision})``, a decision being ``True``
(approve), ``{"arguments": {...}}`` (approve these edited arguments), or a ``str``
(reject, the text for the model; ``False`` or a missing decision rejects too). Each is a
rho decision, ``decided_by="langgraph"``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langgraph.types import interrupt

from rho_actors.declarations.formats import to_dialect
from rho_actors.integrations.sessions import SessionLoops, call_id
from rho_actors.lifecycle import pending_call
from rho_actors.tool import ToolCall, ToolResult

if TYPE_CHECKING:
    from rho_actors.loop.handle import Loop
    from rho_actors.system import ActorSystem

__all__ = ["RhoToolNode"]


def _messages(state: Any) -> list[AnyMessage]:
    messages = state.get("messages") if isinstance(state, dict) else getattr(state, "messages", state)
    if isinstance(messages, list):
        return messages
    raise ValueError(
        f"RhoToolNode takes a state with a 'messages' list (MessagesState) or a list of messages, "
        f"got {type(state).__name__}"
    )


def _calls(state: Any) -> list[ToolCall]:
    messages = _messages(state)
    last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if last is None:
        raise ValueError("RhoToolNode: the state's messages hold no AIMessage whose tool calls it could run")
    calls = [ToolCall(call_id(c.get("id")), str(c["name"]), dict(c["args"])) for c in last.tool_calls]
    calls += [  # what the model sent that LangChain could not parse: rho answers it (invalid_json)
        ToolCall(call_id(c.get("id")), str(c.get("name") or ""), c.get("args") or "")
        for c in last.invalid_tool_calls
    ]
    return calls


def _thread_id(config: RunnableConfig | None) -> str | None:
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else None


def _output(state: Any, results: Sequence[ToolResult]) -> Any:
    messages = [
        ToolMessage(r.content, tool_call_id=r.call_id, name=r.name, status="success" if r.ok else "error")
        for r in results
    ]
    return messages if isinstance(state, list) else {"messages": messages}


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


def _decided(loop: Loop, results: list[ToolResult], decisions: dict[str, Any]) -> list[ToolResult]:
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


class RhoToolNode(Runnable[Any, Any]):
    """A node for a ``StateGraph`` over ``MessagesState``: runs the tool calls of the
    last ``AIMessage`` as one rho turn (so ``exclusive`` tools keep their rule) and
    returns ``{"messages": [ToolMessage, ...]}``, one per call in order, each with the
    call's id and ``status="error"`` for an error result (a list of messages for a
    list input).

    ``target`` is a :class:`rho_actors.Loop` (every turn runs in that session) or an
    :class:`rho_actors.ActorSystem` (the session is the graph's ``thread_id``, started
    on first use; :meth:`close` stops those loops). Raises ``TypeError`` for a
    ``target`` that is neither; ``invoke`` raises ``ValueError`` for a state without
    messages or an ``AIMessage``, or (given a system) a run without ``thread_id``.
    """

    name = "tools"

    def __init__(self, target: Loop | ActorSystem) -> None:
        self._sessions = SessionLoops(target, what="RhoToolNode")

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Run the last ``AIMessage``'s ``tool_calls`` of ``input`` (a ``MessagesState``
        or a list of messages) as one rho turn, in the thread's session given a system;
        returns ``{"messages": [ToolMessage, ...]}`` (a list for a list), one per call in
        order, ``status="error"`` for every error result. Calls that need approval first
        pause the graph (see the module doc). Raises ``ValueError`` for input without
        such a message."""
        loop = self._sessions.loop(_thread_id(config))
        calls = _calls(input)
        decisions = _decisions(loop, calls)
        return _output(input, _decided(loop, loop.run_turn(calls), decisions))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """:meth:`invoke` for asyncio: the turn awaited, the event loop never blocked."""
        loop = self._sessions.loop(_thread_id(config))
        calls = _calls(input)
        decisions = _decisions(loop, calls)
        results = await loop.arun_turn(calls)
        return _output(input, await asyncio.to_thread(_decided, loop, results, decisions))

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
