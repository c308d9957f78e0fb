"""The framework adapters (rho_actors.integrations.*) against each framework's own tool
path, side by side in one run (issue #25).

For each framework, one no-op tool call through its native path and through the rho
adapter, interleaved round by round (a noisy neighbour slows both alike); each path
warms up first; the report gives the median (p50) and p99 per call in microseconds and
the ratio adapter / native of the medians:

- LangGraph: ``ToolNode.invoke`` of an ``AIMessage`` with one call vs ``RhoToolNode.invoke``
  (goal <= 1.3);
- pydantic-ai: a whole ``Agent.run`` whose ``FunctionModel`` calls the tool once, with
  a ``tool_plain`` tool vs ``RhoToolset`` (goal <= 1.3);
- OpenAI Agents SDK: ``FunctionTool.on_invoke_tool`` of ``function_tool(noop)`` vs the
  tool of ``function_tools(loop)`` (goal <= 1.6).

Nothing here asserts a timing: the goals are printed as PASS/FAIL and the exit code is
0 unless a measurement could not be made. Without the frameworks (the ``langgraph``,
``pydantic-ai`` and ``openai-agents`` extras) it prints ``skipped: <reason>``.

Usage::

    .venv/bin/python benchmarks/bench_adapters.py            # full run
    .venv/bin/python benchmarks/bench_adapters.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_adapters.py --json     # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stats import BenchmarkError, environment, publish, summary, verdict

from rho_actors import ActorSystem, Loop, tool

FRAMEWORKS = ("langgraph.prebuilt", "pydantic_ai", "agents")
GOALS = {"LangGraph ToolNode": 1.3, "pydantic-ai Agent.run": 1.3, "OpenAI Agents on_invoke_tool": 1.6}


@dataclass(frozen=True)
class Plan:
    warmup: int
    rounds: int
    per_round: int


FULL = Plan(warmup=50, rounds=10, per_round=50)
QUICK = Plan(warmup=3, rounds=2, per_round=5)


def noop() -> str:
    """Do nothing."""
    return "ok"


rho_noop = tool(name="noop")(noop)

Path = Callable[[], Awaitable[Any]]


def pairs(loop: Loop) -> dict[str, tuple[Path, Path]]:
    """framework -> (native call, adapter call), each an async function doing one call."""
    from agents import function_tool
    from agents.tool_context import ToolContext
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.prebuilt import ToolNode
    from langgraph.runtime import DEFAULT_RUNTIME
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from rho_actors.integrations.langgraph import RhoToolNode
    from rho_actors.integrations.openai_agents import function_tools
    from rho_actors.integrations.pydantic_ai import RhoToolset

    state = {"messages": [AIMessage("", tool_calls=[{"name": "noop", "args": {}, "id": "c1", "type": "tool_call"}])]}
    config: Any = {"configurable": {"__pregel_runtime": DEFAULT_RUNTIME}}
    native_node, rho_node = ToolNode([lc_tool("noop")(noop)]), RhoToolNode(loop)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("noop", {}, tool_call_id="c1")])

    native_agent = Agent(FunctionModel(respond))
    native_agent.tool_plain(name="noop")(noop)
    rho_agent = Agent(FunctionModel(respond), toolsets=[RhoToolset(loop)])

    oa_ctx = ToolContext(context=None, tool_name="noop", tool_call_id="c1", tool_arguments="{}")
    oa_native = function_tool(noop, name_override="noop")
    (oa_rho,) = [t for t in function_tools(loop) if getattr(t, "name", None) == "noop"]

    def checked(expected: Any, fn: Path) -> Path:
        async def call() -> Any:
            got = await fn()
            if expected(got):
                return got
            raise BenchmarkError(f"unexpected result {got!r}")
        return call

    def node_ok(out: Any) -> bool:
        return bool(out["messages"][0].content == "ok" and out["messages"][0].status == "success")

    return {
        "LangGraph ToolNode": (
            checked(node_ok, lambda: asyncio.to_thread(native_node.invoke, state, config)),
            checked(node_ok, lambda: asyncio.to_thread(rho_node.invoke, state, config)),
        ),
        "pydantic-ai Agent.run": (
            checked(lambda r: r.output == "done", lambda: native_agent.run("go")),
            checked(lambda r: r.output == "done", lambda: rho_agent.run("go")),
        ),
        "OpenAI Agents on_invoke_tool": (
            checked(lambda r: r == "ok", lambda: oa_native.on_invoke_tool(oa_ctx, "{}")),
            checked(lambda r: r == "ok", lambda: oa_rho.on_invoke_tool(oa_ctx, "{}")),  # type: ignore[union-attr]
        ),
    }


async def sample(fn: Path, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await fn()
        out.append((time.perf_counter_ns() - t0) / 1_000)
    return out


async def measure(loop: Loop, plan: Plan) -> dict[str, Any]:
    parts = pairs(loop)
    for native, adapter in parts.values():
        await sample(native, plan.warmup)
        await sample(adapter, plan.warmup)
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in parts}
    for _ in range(plan.rounds):
        for name, (native, adapter) in parts.items():
            samples[name][0].extend(await sample(native, plan.per_round))
            samples[name][1].extend(await sample(adapter, plan.per_round))
    out = {}
    for name, (native_us, adapter_us) in samples.items():
        n, a = summary(native_us), summary(adapter_us)
        ratio = round(float(a["p50"]) / float(n["p50"]), 2)
        out[name] = {"native_us": n, "adapter_us": a, "ratio": ratio, "goal": GOALS[name],
                     "verdict": verdict(ratio <= GOALS[name])}
    return out


def missing() -> str | None:
    for name in FRAMEWORKS:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            extras = "langgraph,pydantic-ai,openai-agents"
            return f"framework missing ({exc}); install the extras: pip install -e '.[{extras}]'"
    return None


def print_text(report: Mapping[str, Any]) -> None:
    print(f"environment: {report['environment']}")
    print(f"{'framework':32} {'native p50 us':>14} {'adapter p50 us':>15} {'ratio':>6}  goal")
    for name, row in report["adapters"].items():
        print(f"{name:32} {row['native_us']['p50']:>14} {row['adapter_us']['p50']:>15} {row['ratio']:>6}"
              f"  <= {row['goal']} {row['verdict']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    started = time.perf_counter_ns()
    reason = missing()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    with tempfile.TemporaryDirectory() as data, ActorSystem(data_dir=data, tracing=False) as system:
        system.register(rho_noop)
        loop = system.start_loop("bench")
        adapters = asyncio.run(measure(loop, QUICK if args.quick else FULL))
        report = {"environment": environment(args.quick), "adapters": adapters}
    return publish(report, started, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
