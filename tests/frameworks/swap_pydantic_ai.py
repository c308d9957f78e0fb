"""pytest plugin (``-p swap_pydantic_ai``, loaded by ``tests/frameworks/run.py``): every
tool added to a pydantic-ai ``FunctionToolset`` (``@agent.tool``, ``@agent.tool_plain``,
``Agent(tools=...)``, ``FunctionToolset(...)``: each goes through ``add_tool``) is also
registered in that toolset's own fresh rho system (``system.register(tool)``, as a rho
user does), and the toolset's ``get_tools``/``call_tool`` become those of rho's adapter
for it (``RhoToolset(loop)``), so every call of its tools runs through rho. One system
per toolset, stopped at the end of its test; rho turns counted as in ``swap_langgraph``."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from swap_langgraph import count_turns, pytest_unconfigure, systems_stopped_and_turns_counted, track

__all__ = ["pytest_configure", "pytest_unconfigure"]

_RHO = "_rho_toolset"


def pytest_configure(config: pytest.Config) -> None:
    from pydantic_ai.toolsets import FunctionToolset

    from rho_actors import ActorSystem
    from rho_actors.integrations.pydantic_ai import RhoToolset

    count_turns()
    add_tool, get_tools, call_tool = FunctionToolset.add_tool, FunctionToolset.get_tools, FunctionToolset.call_tool

    def rho_toolset(toolset: Any) -> Any:
        made = toolset.__dict__.get(_RHO)
        if made is None:
            folder = tempfile.TemporaryDirectory()
            system = ActorSystem(data_dir=folder.name)
            track(system, folder)
            made = toolset.__dict__[_RHO] = (system, RhoToolset(system.start_loop()))
        return made

    def swapped_add_tool(self: Any, tool: Any) -> None:
        add_tool(self, tool)
        system, _ = rho_toolset(self)
        system.register(tool)

    async def swapped_get_tools(self: Any, ctx: Any) -> Any:
        made = self.__dict__.get(_RHO)
        if made is None:
            return await get_tools(self, ctx)
        # the tools stay this toolset's for pydantic-ai (its label in errors; calls come back here)
        return {name: dataclasses.replace(tool, toolset=self) for name, tool in (await made[1].get_tools(ctx)).items()}

    async def swapped_call_tool(self: Any, name: str, tool_args: Any, ctx: Any, tool: Any) -> Any:
        made = self.__dict__.get(_RHO)
        if made is None:
            return await call_tool(self, name, tool_args, ctx, tool)
        return await made[1].call_tool(name, tool_args, ctx, tool)

    FunctionToolset.add_tool = swapped_add_tool  # type: ignore[method-assign]
    FunctionToolset.get_tools = swapped_get_tools  # type: ignore[method-assign]
    FunctionToolset.call_tool = swapped_call_tool  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _rho_systems_stopped() -> Iterator[None]:
    yield from systems_stopped_and_turns_counted()
