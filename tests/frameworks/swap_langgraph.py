"""pytest plugin (``-p swap_langgraph``, loaded by ``tests/frameworks/run.py``): LangGraph's
``ToolNode`` replaced, everywhere LangGraph's tests and its prebuilt agent reach it, by
rho's ``RhoToolNode`` over a rho system holding the same tools, each registered as a rho
user registers a LangChain tool (``system.register(tool)``; a plain function as
``ToolNode`` makes it a tool first, with ``langchain_core.tools.tool``). One system per
node, stopped at the end of its test. The rho turns run are counted into the file
``$RHO_FRAMEWORKS_TURNS`` names (so a run shows its calls went through rho)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

_systems: list[tuple[Any, tempfile.TemporaryDirectory[str]]] = []
_kept: list[tuple[Any, tempfile.TemporaryDirectory[str]]] = []
"""Systems made outside a test (for a tool made at a module's import): stopped at the end."""
_turns = [0]
_in_test = [False]


def _stop_all() -> None:
    while _systems:
        system, folder = _systems.pop()
        system.stop()
        folder.cleanup()


def _counted(method: Any) -> Any:
    def run(self: Any, calls: Any, *args: Any, **kwargs: Any) -> Any:
        _turns[0] += 1
        return method(self, calls, *args, **kwargs)

    return run


def count_turns() -> None:
    """Count every rho turn run (``Loop.run_turn`` and ``arun_turn``)."""
    from rho_actors.loop.handle import Loop

    Loop.run_turn = _counted(Loop.run_turn)  # type: ignore[method-assign]
    Loop.arun_turn = _counted(Loop.arun_turn)  # type: ignore[method-assign]


def track(system: Any, folder: tempfile.TemporaryDirectory[str]) -> None:
    """Stop ``system`` and remove ``folder`` at the end of the test (of the run, for one
    made outside a test)."""
    (_systems if _in_test[0] else _kept).append((system, folder))


def systems_stopped_and_turns_counted() -> Iterator[None]:
    """Each test's systems stopped after it, and its rho turns counted."""
    _in_test[0] = True
    yield
    _in_test[0] = False
    _stop_all()
    report = os.environ.get("RHO_FRAMEWORKS_TURNS")
    if report and _turns[0]:
        with open(report, "a") as f:
            f.write(f"{_turns[0]}\n")
        _turns[0] = 0


def pytest_configure(config: pytest.Config) -> None:
    import langgraph.prebuilt.chat_agent_executor as executor
    import langgraph.prebuilt.tool_node as tool_node_module
    from langchain_core.tools import BaseTool
    from langchain_core.tools import tool as create_tool
    from langgraph import prebuilt

    from rho_actors import ActorSystem
    from rho_actors.integrations.langgraph import RhoToolNode

    count_turns()

    class ToolNode(RhoToolNode):
        """What ``ToolNode(tools, **kwargs)`` makes with rho swapped in."""

        def __init__(self, tools: Any, **kwargs: Any) -> None:
            folder = tempfile.TemporaryDirectory()
            system = ActorSystem(data_dir=folder.name)
            track(system, folder)
            for t in tools:
                system.register(t if isinstance(t, BaseTool) else create_tool(t))
            super().__init__(system.start_loop(), **kwargs)

    for module in (prebuilt, tool_node_module, executor):
        setattr(module, "ToolNode", ToolNode)  # noqa: B010 - each module's own name, as LangGraph looks it up


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_all()
    _systems.extend(_kept)
    _stop_all()


@pytest.fixture(autouse=True)
def _rho_systems_stopped() -> Iterator[None]:
    yield from systems_stopped_and_turns_counted()
