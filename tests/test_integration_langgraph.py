"""LangGraph's own graph run (``StateGraph`` over ``MessagesState``, ``tools_condition``)
with rho's ``RhoToolNode`` and a scripted LangChain chat model; LangChain tools passed
to ``system.register``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import InjectedToolArg, ToolException
from langchain_core.tools import tool as lc_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from pydantic import Field

from rho_actors import ActorSystem, ToolCall
from rho_actors.integrations.langgraph import RhoToolNode
from tests import adapter_tools
from tests.adapter_tools import later, set_up

Call = tuple[str, str, Any]


class ScriptedChat(BaseChatModel):
    """Replies ``script[i]`` at step ``i`` (tool calls or a final text), recording the
    tool names bound for each step."""

    script: list[Any]
    between: Any = None
    offered: list[list[str]] = Field(default_factory=list)
    bound: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.bound = [t["function"]["name"] for t in tools]
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        step = len(self.offered)
        self.offered.append(self.bound)
        if self.between is not None:
            self.between(step)
        reply = self.script[step]
        if isinstance(reply, str):
            message = AIMessage(reply)
        else:
            message = AIMessage("", tool_calls=[{"id": cid, "name": n, "args": a, "type": "tool_call"}
                                                for cid, n, a in reply])
        return ChatResult(generations=[ChatGeneration(message=message)])


def graph(node: RhoToolNode, model: ScriptedChat) -> Any:
    bound = node.bind_model(model)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state, config: {"messages": [bound.invoke(state["messages"], config)]})
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile()


def alone(node: RhoToolNode) -> Any:
    """A graph of ``node`` alone (LangGraph gives a node its runtime only in a graph)."""
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    return builder.compile()


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def chat(script: list[Any], between: Callable[[int], None] | None = None) -> ScriptedChat:
    return ScriptedChat(script=script, between=between)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_graph_run_gets_one_tool_message_per_call_in_order(
    system: ActorSystem, tmp_path: Path, mode: str
) -> None:
    setup = set_up(system, tmp_path)
    app = graph(RhoToolNode(setup.loop), chat([setup.calls(), "all done"]))
    t0 = time.monotonic()
    start = {"messages": [HumanMessage("go")]}
    state = app.invoke(start) if mode == "invoke" else asyncio.run(app.ainvoke(start))
    elapsed = time.monotonic() - t0
    assert state["messages"][-1].content == "all done"
    messages = tool_messages(state)
    assert [m.tool_call_id for m in messages] == [cid for cid, _, _ in setup.calls()]
    assert [m.status for m in messages] == ["success", "error", "error", "error", "success", "success"]
    adapter_tools.check_outputs({m.tool_call_id: str(m.content) for m in messages}, setup, elapsed)


def test_the_bound_tools_follow_the_loop(system: ActorSystem, tmp_path: Path) -> None:
    setup = set_up(system, tmp_path, processes=False)

    def between(step: int) -> None:
        if step == 0:
            setup.loop.set_withheld({"boom"})
            system.register(later)

    model = chat([[("c1", "add", {"a": 1, "b": 1})], [("c2", "later", {})], "ok"], between)
    state = graph(RhoToolNode(setup.loop), model).invoke({"messages": [HumanMessage("go")]})
    assert state["messages"][-1].content == "ok"
    assert model.offered == [["add", "boom", "meet"], ["add", "meet", "later"], ["add", "meet", "later"]]
    assert [(m.tool_call_id, m.content) for m in tool_messages(state)] == [("c1", "2"), ("c2", "later")]


def test_given_a_system_each_graph_thread_is_a_rho_session(system: ActorSystem, tmp_path: Path) -> None:
    set_up(system, tmp_path, processes=False)
    node = RhoToolNode(system)
    app = graph(node, chat([[("c1", "add", {"a": 2, "b": 3})], "five"]))
    try:
        state = app.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "thread-9"}})
        assert state["messages"][-1].content == "five"
        assert system.whereis("loop:thread-9") is not None
        with pytest.raises(ValueError, match="needs the framework's thread or conversation id"):
            alone(node).invoke({"messages": [AIMessage("", tool_calls=[{"id": "x", "name": "add", "args": {}}])]})
    finally:
        node.close()
    assert system.whereis("loop:thread-9") is None


def test_a_state_without_an_ai_message_is_refused_as_tool_node_refuses_it(system: ActorSystem, tmp_path: Path) -> None:
    app = alone(RhoToolNode(set_up(system, tmp_path, processes=False).loop))
    with pytest.raises(ValueError, match="No AIMessage found in input"):
        app.invoke({"messages": [HumanMessage("hi")]})


@lc_tool
def lc_add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


@lc_tool
async def lc_echo(text: str) -> str:
    """Echo the text."""
    return text


@lc_tool
def lc_refuse() -> str:
    """Always fail."""
    raise ToolException("no such record")


def test_a_langchain_tool_registers_with_its_own_declaration(system: ActorSystem) -> None:
    for t in (lc_add, lc_echo, lc_refuse):
        assert system.register(t).reason is None
    info = {i.name: i for i in system.tools()}
    assert info["lc_add"].description == "Add two integers."
    assert info["lc_add"].parameter_schema["properties"]["a"]["type"] == "integer"
    assert info["lc_add"].parameter_schema["required"] == ["a"]
    loop = system.start_loop("lc")
    results = loop.run_turn([
        ToolCall("1", "lc_add", {"a": 1, "b": 2}), ToolCall("2", "lc_echo", {"text": "hi"}),
        ToolCall("3", "lc_refuse", {}), ToolCall("4", "lc_add", {"b": 1}),
    ])
    assert [(r.ok, r.content) for r in results[:2]] == [(True, "3"), (True, "hi")]
    assert results[2].error_kind == "raised" and "no such record" in results[2].content
    assert results[3].error_kind == "invalid_arguments" and '"a" is a required property' in results[3].content
    assert system.unregister(lc_add)
    assert "lc_add" not in {i.name for i in loop.offered()}


def test_calls_rho_holds_pause_the_graph_and_resume_with_the_decisions(system: ActorSystem) -> None:
    from langgraph.checkpoint.memory import MemorySaver
    from langgraph.types import Command

    from rho_actors import tool

    ran: list[str] = []

    @tool(requires_approval=True)
    def wipe(path: str) -> str:
        """Wipe a folder."""
        ran.append(path)
        return f"wiped {path}"

    @tool
    def peek(path: str) -> str:
        """Look at a folder."""
        ran.append(f"peek {path}")
        return f"saw {path}"

    system.register(wipe)
    system.register(peek)
    loop = system.start_loop("lg-approval")
    node = RhoToolNode(loop)
    model = chat([[("c1", "wipe", {"path": "/a"}), ("c2", "wipe", {"path": "/b"}), ("c3", "peek", {"path": "/"})],
                  "done"])
    bound = node.bind_model(model)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state, config: {"messages": [bound.invoke(state["messages"], config)]})
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    app = builder.compile(checkpointer=MemorySaver())
    config: Any = {"configurable": {"thread_id": "t1"}}
    paused = app.invoke({"messages": [HumanMessage("clean up")]}, config)
    [pause] = paused["__interrupt__"]
    assert [p["call_id"] for p in pause.value["pending"]] == ["c1", "c2"] and ran == []  # nothing ran yet
    resume: Command[Any] = Command(resume={"c1": {"arguments": {"path": "/tmp/a"}}, "c2": "keep /b"})
    done = app.invoke(resume, config)
    assert done["messages"][-1].content == "done"
    assert sorted(ran) == ["/tmp/a", "peek /"]  # each call a turn of one, run side by side as ToolNode runs them
    assert [(m.tool_call_id, m.content, m.status) for m in tool_messages(done)] == [
        ("c1", "wiped /tmp/a", "success"), ("c2", "keep /b", "error"), ("c3", "saw /", "success")]
    assert loop.pending() == []


@lc_tool
def lc_account(amount: int, user_id: Annotated[str, InjectedToolArg] = "the app's user") -> str:
    """Charge the app's user (``user_id`` is the app's to give, never the model's)."""
    return f"charged {amount} to {user_id}"


def test_a_value_the_model_sends_for_an_injected_argument_never_reaches_the_tool(system: ActorSystem) -> None:
    system.register(lc_account)
    assert "user_id" not in system.tool_set().entries["lc_account"].info.parameter_schema["properties"]
    loop = system.start_loop("lc-injected")
    [result] = loop.run_turn([ToolCall("1", "lc_account", {"amount": 5, "user_id": "someone else"})])
    assert (result.ok, result.content) == (True, "charged 5 to the app's user")
    node = RhoToolNode(loop)
    message = AIMessage("", tool_calls=[{"id": "2", "name": "lc_account", "args": {"amount": 7, "user_id": "forged"}}])
    [answer] = alone(node).invoke({"messages": [message]})["messages"][1:]
    assert (answer.tool_call_id, answer.content) == ("2", "charged 7 to the app's user")
