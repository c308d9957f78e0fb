"""pytest plugin (``-p swap_openai_agents``, loaded by ``tests/frameworks/run.py``): the
Agents SDK's ``function_tool`` makes the SDK's own tool, registers it in a fresh rho
system (``system.register(sdk_tool)``, as a rho user does) and hands the SDK what rho's
adapter gives for it (``function_tools(loop)``), so every call of it runs through rho.
One system per tool, stopped at the end of its test; rho turns counted as in
``swap_langgraph``. A tool rho refuses to register (a name such as ``<lambda>``, which no
provider takes) raises ``ValueError`` with rho's reason where the SDK made it."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from swap_langgraph import count_turns, pytest_unconfigure, systems_stopped_and_turns_counted, track

__all__ = ["pytest_configure", "pytest_unconfigure"]


def pytest_configure(config: pytest.Config) -> None:
    import agents
    import agents.tool as tool_module

    from rho_actors import ActorSystem
    from rho_actors.integrations.openai_agents import function_tools

    count_turns()
    original = tool_module.function_tool

    def swapped(made: Any) -> Any:
        if not isinstance(made, agents.FunctionTool):
            return made
        folder = tempfile.TemporaryDirectory()
        system = ActorSystem(data_dir=folder.name)
        track(system, folder)
        registration = system.register(made)
        if registration.reason is not None:  # left out, as for a rho user (a name providers refuse, say)
            raise ValueError(f"rho refused the SDK tool {made.name!r}: {registration.reason}")
        [adapted] = [t for t in function_tools(system.start_loop()) if t.name == made.name]
        return adapted

    @functools.wraps(original)
    def function_tool(func: Any = None, **kwargs: Any) -> Any:
        made = original(func, **kwargs)
        if callable(made) and not isinstance(made, agents.FunctionTool):
            return lambda f: swapped(made(f))
        return swapped(made)

    for module in (agents, tool_module):
        setattr(module, "function_tool", function_tool)  # noqa: B010 - each module's own name


@pytest.fixture(autouse=True)
def _rho_systems_stopped() -> Iterator[None]:
    yield from systems_stopped_and_turns_counted()
