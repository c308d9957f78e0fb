"""LangGraph and LangChain running their tools through rho (the ``langgraph`` extra;
DESIGN §6c).

Example::

    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition
    from rho_actors.integrations.langgraph import RhoToolNode

    tools = RhoToolNode(loop)
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [tools.bind_model(model).invoke(state["messages"])]})
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")

A LangChain tool (``BaseTool``, ``@langchain_core.tools.tool``) can be passed to
``system.register`` itself (see :mod:`rho_actors.integrations.langgraph.langchain_tool`).
"""

from __future__ import annotations

from rho_actors.errors import needs_extra

with needs_extra("langgraph", "rho_actors.integrations.langgraph"):
    from rho_actors.integrations.langgraph.node import RhoToolNode

__all__ = ["RhoToolNode"]
