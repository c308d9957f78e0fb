"""rho_actors against what users would pick instead, side by side in one run (issues #12, #26, #42).

Every variant runs in this one process, interleaved round by round so a noisy neighbour
slows all of them alike; each part warms up first and reports the median (p50) and p99
(nearest rank) of its samples. Nothing here asserts a timing: the targets are
printed as PASS/FAIL and the exit code is 0 unless a measurement could not be made.

1. **No-op tool, one call.** Per-call cost (us) of: a direct call; pykka ``ask`` of a
   running actor; pykka start + ask + stop; rho_actors ``loop.run_turn`` of one call in
   ``thread`` and ``process`` isolation, each for an ``@tool`` function and a static
   class tool; LangGraph ``ToolNode.invoke`` / ``.ainvoke``; OpenAI Agents SDK
   ``FunctionTool.on_invoke_tool`` (and its async tool inside ``asyncio.timeout``, the
   same guarantee as rho's: a deadline); the floor of any async call whose deadline holds
   against a tool that swallows its cancellation (the tool as its own asyncio task, a
   timer and a future; the SDK's async path has none of them); and the cost of one
   tool call inside an OpenAI Agents ``Runner.run`` and a pydantic-ai ``Agent.run`` (a
   run whose scripted model calls the tool once, minus a run whose model answers at
   once; no network).
2. **16 parallel 100 ms calls.** Wall time of one batch of 16 sleeping calls through
   each path, against the ideal 100 ms (untrusted rho tools use the default worker pool).
3. **A hung tool, 200 ms timeout.** A tool that appends a byte to a file every 10 ms
   (for at most 1.5 s): the time until the caller has its result (or its timeout
   error), and whether the work was really stopped (did the file keep growing after?).
4. **BFCL multi_turn_base, whole sessions.** Backends built, session started, every
   ground-truth turn run, session stopped: through rho_actors (a loop per session,
   ``exclusive`` tools, withheld names per turn) and through a LangGraph ``ToolNode``
   (tools built once, the session's backends passed in ``config``, one ``invoke`` per
   turn with ``max_concurrency=1`` so calls keep their order), next to direct calls.
5. **Throughput under concurrency.** 200 sessions x 25 turns x 8 no-op calls from 8
   host threads (each thread runs its share of sessions one after another: start,
   25 turns, stop): calls per second through rho_actors (a loop per session) and
   through a LangGraph ``ToolNode.invoke`` (8 calls per invoke), one after the other.

Every goal (issues #12, #26, #42: the strictest standing) is printed with its ratio, the
load average beside it.

Peers come from the optional extra: ``pip install -e '.[peers]'``; without them the
script prints ``skipped: <reason>`` and exits 0.

Usage::

    .venv/bin/python benchmarks/bench_peers.py            # full run, a few minutes
    .venv/bin/python benchmarks/bench_peers.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_peers.py --json     # one JSON object on stdout
    .venv/bin/python benchmarks/bench_peers.py --only bfcl --bfcl-runs 5   # part 4 alone
    .venv/bin/python benchmarks/bench_peers.py --only calls   # part 1 alone, with its goals
    .venv/bin/python benchmarks/bench_peers.py --only throughput   # part 5 alone, with its goal
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

import pykka
from stats import BenchmarkError, environment, percentile, publish, summary, verdict

from rho_actors import ActorSystem, Loop, ToolCall, tool

PEER_MODULES = ("langgraph.prebuilt", "langchain_core.tools", "agents", "pydantic_ai")
PEER_DISTRIBUTIONS = ("pykka", "langgraph", "langchain-core", "openai-agents", "pydantic-ai-slim")

PARALLEL_CALLS = 16
SLEEP_S = 0.1
HUNG_TIMEOUT_S = 0.2
HUNG_TICK_S = 0.01
HUNG_MAX_S = 1.5
AFTER_S = 0.3  # how long after the result the hung tool's file is watched for growth
DIRECT_BATCH = 1_000


@dataclass(frozen=True)
class Plan:
    """How much to repeat each part (``--quick`` or a full run)."""

    warmup: int
    rounds: int
    calls_per_round: int
    run_calls_per_round: int
    parallel_warmup: int
    parallel_turns: int
    bfcl_limit: int | None
    bfcl_runs: int
    throughput_sessions: int = 200
    throughput_turns: int = 25


FULL = Plan(warmup=100, rounds=12, calls_per_round=100, run_calls_per_round=25, parallel_warmup=1, parallel_turns=8,
            bfcl_limit=None, bfcl_runs=3)
QUICK = Plan(warmup=5, rounds=2, calls_per_round=10, run_calls_per_round=3, parallel_warmup=0, parallel_turns=1,
             bfcl_limit=3, bfcl_runs=1, throughput_sessions=8, throughput_turns=3)
THROUGHPUT_THREADS = 8
THROUGHPUT_CALLS = 8  # per turn


def bfcl_module() -> ModuleType:
    """rho_actors' BFCL integration (its data loading and backends), wherever it lives."""
    for name in ("rho_actors.integrations.bfcl", "rho_actors.bfcl"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
    raise ModuleNotFoundError("no rho_actors BFCL integration module")


def missing_peers() -> str | None:
    """Why the peers cannot be measured (a missing module), or None."""
    for name in PEER_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"peer package missing ({exc}); install them with: pip install -e '.[peers]'"
    return None


def versions() -> dict[str, str]:
    out = {}
    for dist in PEER_DISTRIBUTIONS:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "absent"
    return out


# --- the work every path runs ----------------------------------------------------------


def noop_work() -> str:
    """Do nothing."""
    return "ok"


def sleep_work() -> str:
    """Sleep 100 ms."""
    time.sleep(SLEEP_S)
    return "slept"


def hung_work(path: str) -> str:
    """Append a byte to ``path`` every 10 ms for at most ``HUNG_MAX_S`` seconds."""
    end = time.monotonic() + HUNG_MAX_S
    with open(path, "ab", buffering=0) as f:
        while time.monotonic() < end:
            f.write(b".")
            time.sleep(HUNG_TICK_S)
    return "finished"


@tool(name="noop")
def rho_noop() -> str:
    """Do nothing."""
    return noop_work()


@tool(name="anoop")
async def rho_anoop() -> str:
    """Do nothing (async)."""
    return noop_work()


async def anoop_work() -> str:
    """Do nothing (async)."""
    return "ok"


@tool(name="noop_p")
def rho_noop_p() -> str:
    """Do nothing (process isolation)."""
    return noop_work()


@tool(name="sleep")
def rho_sleep() -> str:
    """Sleep 100 ms."""
    return sleep_work()


@tool(name="sleep_untrusted")
def rho_sleep_untrusted() -> str:
    """Sleep 100 ms (untrusted: process isolation)."""
    return sleep_work()


@tool(name="hung", timeout_ms=int(HUNG_TIMEOUT_S * 1000))
def rho_hung(path: str) -> str:
    """Append to a file every 10 ms."""
    return hung_work(path)


@tool(name="hung_p", timeout_ms=int(HUNG_TIMEOUT_S * 1000))
def rho_hung_p(path: str) -> str:
    """Append to a file every 10 ms (process isolation)."""
    return hung_work(path)


def static_tool(tool_name: str) -> type:
    """A class tool with static callbacks (no pydantic) running the no-op."""

    class Static:
        @staticmethod
        def name() -> str:
            return tool_name

        @staticmethod
        def description() -> str:
            return "Do nothing."

        @staticmethod
        def parameter_schema() -> dict[str, Any]:
            return {"type": "object", "properties": {}, "additionalProperties": False}

        @staticmethod
        def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
            return noop_work()

    Static.__qualname__ = Static.__name__ = f"Static_{tool_name}"
    return Static


StaticNoop = static_tool("snoop")
StaticNoopP = static_tool("snoop_p")


class Echo(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return noop_work()


class Sleeper(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return sleep_work()


class Hung(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return hung_work(message)


# --- peers ------------------------------------------------------------------------------


class Peers:
    """The peer frameworks' objects under test, built once."""

    def __init__(self) -> None:
        from agents import Agent, RunConfig, function_tool
        from langchain_core.tools import tool as lc_tool
        from langgraph.prebuilt import ToolNode
        from pydantic_ai import Agent as PAgent
        from pydantic_ai.models.function import FunctionModel

        self.lc_noop = lc_tool("noop")(noop_work)
        self.lc_sleep = lc_tool("sleep")(sleep_work)
        self.lc_hung = lc_tool("hung")(hung_work)
        self.tool_node = ToolNode([self.lc_noop, self.lc_sleep, self.lc_hung])
        self.node_config: Any = node_config()  # a RunnableConfig (a TypedDict) when LangGraph is typed

        self.oa_noop = function_tool(noop_work, name_override="noop")
        self.oa_anoop = function_tool(anoop_work, name_override="anoop")
        self.oa_sleep = function_tool(sleep_work, name_override="sleep")

        async def oa_hung_async(path: str) -> str:
            return await asyncio.to_thread(hung_work, path)

        self.oa_hung = function_tool(oa_hung_async, name_override="hung", timeout=HUNG_TIMEOUT_S)
        self.run_config = RunConfig(tracing_disabled=True)
        self.oa_agent_tool = Agent(name="a", model=ScriptedAgentsModel(["noop"]), tools=[self.oa_noop])
        self.oa_agent_none = Agent(name="a", model=ScriptedAgentsModel([]), tools=[self.oa_noop])
        self.oa_agent_parallel = Agent(name="a", model=ScriptedAgentsModel(["sleep"] * PARALLEL_CALLS),
                                       tools=[self.oa_sleep])

        def pa_agent(
            calls: list[tuple[str, dict[str, Any]]], tools: list[tuple[Callable[..., Any], float | None]]
        ) -> Any:
            agent = PAgent(FunctionModel(pydantic_ai_script(calls)))
            for fn, timeout in tools:
                agent.tool_plain(name=fn.__name__.removesuffix("_work"), timeout=timeout)(fn)
            return agent

        self.pa_tool = pa_agent([("noop", {})], [(noop_work, None)])
        self.pa_none = pa_agent([], [(noop_work, None)])
        self.pa_parallel = pa_agent([("sleep", {})] * PARALLEL_CALLS, [(sleep_work, None)])
        self.pa_hung_calls: list[tuple[str, dict[str, Any]]] = []
        self.pa_hung = pa_agent(self.pa_hung_calls, [(hung_work, HUNG_TIMEOUT_S)])

    @staticmethod
    def ai_message(calls: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        from langchain_core.messages import AIMessage

        tool_calls = [{"name": n, "args": a, "id": f"c{i}", "type": "tool_call"} for i, (n, a) in enumerate(calls)]
        return {"messages": [AIMessage("", tool_calls=tool_calls)]}


def node_config(**extra: Any) -> dict[str, Any]:
    """The config a ``ToolNode`` needs when invoked outside a graph: the default
    LangGraph runtime (a graph's Pregel loop passes its own), plus ``extra``."""
    from langgraph.runtime import DEFAULT_RUNTIME

    configurable = {"__pregel_runtime": DEFAULT_RUNTIME} | extra.pop("configurable", {})
    return {"configurable": configurable, **extra}


class ScriptedAgentsModel:
    """An OpenAI Agents SDK model that first asks for ``calls`` (tool names, ``{}``
    arguments), then, once tool outputs are in its input, answers ``done``."""

    def __new__(cls, calls: list[str]) -> Any:
        from agents.items import ModelResponse
        from agents.models.interface import Model
        from agents.usage import Usage
        from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

        class _Model(Model):
            async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
                answered = isinstance(input, list) and any(
                    isinstance(i, dict) and i.get("type") == "function_call_output" for i in input
                )
                if calls and not answered:
                    output: list[Any] = [
                        ResponseFunctionToolCall(arguments="{}", call_id=f"c{i}", name=name, type="function_call",
                                                 id=f"fc{i}", status="completed")
                        for i, name in enumerate(calls)
                    ]
                else:
                    text = ResponseOutputText(annotations=[], text="done", type="output_text")
                    output = [ResponseOutputMessage(id="m1", content=[text], role="assistant", status="completed",
                                                    type="message")]
                return ModelResponse(output=output, usage=Usage(), response_id=None)

            def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError("not streamed here")

        return _Model()


def pydantic_ai_script(calls: list[tuple[str, dict[str, Any]]]) -> Callable[..., Any]:
    """A pydantic-ai ``FunctionModel`` function: ask for ``calls`` (read when called, so
    the list can be filled later), then answer ``done`` once tool returns or retries
    are in the last request."""
    from pydantic_ai.messages import ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart

    def respond(messages: list[Any], info: Any) -> Any:
        last = messages[-1].parts if messages else []
        if calls and not any(isinstance(p, ToolReturnPart | RetryPromptPart) for p in last):
            return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=f"c{i}") for i, (n, a) in enumerate(calls)])
        return ModelResponse(parts=[TextPart("done")])

    return respond


# --- part 1: no-op call ------------------------------------------------------------------


Sync = Callable[[], Any]
Async = Callable[[], Awaitable[Any]]


def check_rho(results: Sequence[Any], what: str) -> None:
    for r in results:
        if not r.ok:
            raise BenchmarkError(f"{what}: call failed: {r.error_kind}: {r.content}")


def sample_sync(fn: Sync, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1_000)
    return out


async def sample_async(fn: Async, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await fn()
        out.append((time.perf_counter_ns() - t0) / 1_000)
    return out


def direct_batch() -> list[float]:
    t0 = time.perf_counter_ns()
    for _ in range(DIRECT_BATCH):
        noop_work()
    return [(time.perf_counter_ns() - t0) / 1_000 / DIRECT_BATCH]


def per_call_variants(loop: Loop, peers: Peers, echo: pykka.ActorRef[Any]) -> dict[str, tuple[str, Any]]:
    """label -> ("sync" | "async" | "run", function doing one call)."""
    from agents import Runner
    from agents.tool_context import ToolContext

    def rho(name: str) -> Sync:
        call = [ToolCall("c1", name, "{}")]
        return lambda: check_rho(loop.run_turn(call), name)

    def pykka_cycle() -> None:
        ref = Echo.start()
        ref.ask("ping")
        ref.stop()

    node_input = peers.ai_message([("noop", {})])
    oa_ctx = ToolContext(context=None, tool_name="noop", tool_call_id="c1", tool_arguments="{}")

    async def oa_invoke() -> None:
        await peers.oa_noop.on_invoke_tool(oa_ctx, "{}")

    async def rho_async() -> None:
        check_rho(await loop.arun_turn([ToolCall("c1", "noop", "{}")]), "noop")

    async def rho_async_tool() -> None:
        check_rho(await loop.arun_turn([ToolCall("c1", "anoop", "{}")]), "anoop")

    async def oa_invoke_async() -> None:
        await peers.oa_anoop.on_invoke_tool(oa_ctx, "{}")

    async def oa_invoke_async_bounded() -> None:
        """The SDK's async tool with the guarantee rho gives: a deadline (its own 30 s
        default, as rho's ``timeout_ms``)."""
        async with asyncio.timeout(30.0):
            await peers.oa_anoop.on_invoke_tool(oa_ctx, "{}")

    async def bounded_floor() -> None:
        """The least a deadline that holds costs an async call: the tool as its own task
        (its caller is not held by one that swallows its cancellation), a timer, a future."""
        aio = asyncio.get_running_loop()
        landed: asyncio.Future[str] = aio.create_future()

        async def run() -> None:
            value = await anoop_work()
            if not landed.done():
                landed.set_result(value)

        task = aio.create_task(run())
        timer = aio.call_later(30.0, task.cancel)
        try:
            await landed
        finally:
            timer.cancel()

    return {
        "rho run_turn @tool (thread)": ("sync", rho("noop")),
        "rho run_turn static (thread)": ("sync", rho("snoop")),
        "rho arun_turn @tool (thread)": ("async", rho_async),
        "rho arun_turn async @tool (thread)": ("async", rho_async_tool),
        "rho run_turn @tool (process)": ("sync", rho("noop_p")),
        "rho run_turn static (process)": ("sync", rho("snoop_p")),
        "pykka ask (running actor)": ("sync", lambda: echo.ask("ping")),
        "pykka start + ask + stop": ("sync", pykka_cycle),
        "LangGraph ToolNode.invoke": ("sync", lambda: peers.tool_node.invoke(node_input, peers.node_config)),
        "LangGraph ToolNode.ainvoke": ("async", lambda: peers.tool_node.ainvoke(node_input, peers.node_config)),
        "OpenAI Agents on_invoke_tool": ("async", oa_invoke),
        "OpenAI Agents on_invoke_tool (async tool)": ("async", oa_invoke_async),
        "OpenAI Agents on_invoke_tool (async tool) in asyncio.timeout": ("async", oa_invoke_async_bounded),
        "asyncio task + deadline timer (floor)": ("async", bounded_floor),
        "OpenAI Agents Runner.run, 1 tool call": (
            "run", lambda: Runner.run(peers.oa_agent_tool, "go", run_config=peers.run_config)),
        "OpenAI Agents Runner.run, no tool call": (
            "run", lambda: Runner.run(peers.oa_agent_none, "go", run_config=peers.run_config)),
        "pydantic-ai Agent.run, 1 tool call": ("run", lambda: peers.pa_tool.run("go")),
        "pydantic-ai Agent.run, no tool call": ("run", lambda: peers.pa_none.run("go")),
    }


def bench_per_call(loop: Loop, peers: Peers, aio: asyncio.AbstractEventLoop, plan: Plan) -> dict[str, Any]:
    echo = Echo.start()
    try:
        variants = per_call_variants(loop, peers, echo)
        samples: dict[str, list[float]] = {label: [] for label in variants}
        samples["direct call"] = []

        def one_round(n: int, n_run: int, keep: bool) -> None:
            for label, (kind, fn) in variants.items():
                gc.collect()
                if kind == "sync":
                    got = sample_sync(fn, n)
                else:
                    got = aio.run_until_complete(sample_async(fn, n if kind == "async" else n_run))
                if keep:
                    samples[label].extend(got)
            direct = [x for _ in range(max(1, n // 10)) for x in direct_batch()]
            if keep:
                samples["direct call"].extend(direct)

        one_round(plan.warmup, max(1, plan.warmup // 4), keep=False)
        for _ in range(plan.rounds):
            one_round(plan.calls_per_round, plan.run_calls_per_round, keep=True)
    finally:
        echo.stop()
    out: dict[str, Any] = {label: summary(s, 4 if label == "direct call" else 1) for label, s in samples.items()}
    for peer in ("OpenAI Agents Runner.run", "pydantic-ai Agent.run"):
        with_tool, without = samples[f"{peer}, 1 tool call"], samples[f"{peer}, no tool call"]
        cost = percentile(with_tool, 50) - percentile(without, 50)
        out[f"{peer}: cost of 1 tool call"] = {"n": len(with_tool), "p50": round(cost, 1),
                                               "p99": None, "min": None, "derived": True}
    return out


# --- part 2: 16 parallel 100 ms calls ---------------------------------------------------------


def bench_parallel(loop: Loop, peers: Peers, aio: asyncio.AbstractEventLoop, plan: Plan) -> dict[str, Any]:
    from agents import Runner
    from agents.tool_context import ToolContext

    def rho(name: str) -> Sync:
        calls = [ToolCall(f"c{i}", name, "{}") for i in range(PARALLEL_CALLS)]
        return lambda: check_rho(loop.run_turn(calls), name)

    def pykka_batch() -> None:
        refs = [Sleeper.start() for _ in range(PARALLEL_CALLS)]
        futures = [ref.ask("go", block=False) for ref in refs]
        for f in futures:
            f.get(timeout=10)
        for ref in refs:
            ref.stop(block=False)

    node_input = peers.ai_message([("sleep", {})] * PARALLEL_CALLS)

    async def oa_gather() -> None:
        ctxs = [ToolContext(context=None, tool_name="sleep", tool_call_id=f"c{i}", tool_arguments="{}")
                for i in range(PARALLEL_CALLS)]
        await asyncio.gather(*(peers.oa_sleep.on_invoke_tool(c, "{}") for c in ctxs))

    variants: dict[str, tuple[str, Any]] = {
        "rho run_turn (thread)": ("sync", rho("sleep")),
        "rho run_turn untrusted (process, default pool)": ("sync", rho("sleep_untrusted")),
        "pykka 16 actors, ask": ("sync", pykka_batch),
        "LangGraph ToolNode.invoke": ("sync", lambda: peers.tool_node.invoke(node_input, peers.node_config)),
        "LangGraph ToolNode.ainvoke": ("async", lambda: peers.tool_node.ainvoke(node_input, peers.node_config)),
        "OpenAI Agents on_invoke_tool x16 (gather)": ("async", oa_gather),
        "OpenAI Agents Runner.run (16 calls in one step)": (
            "async", lambda: Runner.run(peers.oa_agent_parallel, "go", run_config=peers.run_config)),
        "pydantic-ai Agent.run (16 calls in one step)": ("async", lambda: peers.pa_parallel.run("go")),
    }
    samples: dict[str, list[float]] = {label: [] for label in variants}
    for turn in range(plan.parallel_warmup + plan.parallel_turns):
        for label, (kind, fn) in variants.items():
            gc.collect()
            got = sample_sync(fn, 1) if kind == "sync" else aio.run_until_complete(sample_async(fn, 1))
            if turn >= plan.parallel_warmup:
                samples[label].extend(us / 1_000 for us in got)
    return {label: summary(s, 1) | {"ratio_to_ideal": round(percentile(s, 50) / (SLEEP_S * 1000), 2)}
            for label, s in samples.items()}


# --- part 3: a hung tool ------------------------------------------------------------------------


def watch(path: Path, t0: int, outcome: str) -> dict[str, Any]:
    """The time to the result (since ``t0``), then whether ``path`` still grows."""
    to_result_ms = (time.perf_counter_ns() - t0) / 1e6
    at_result = path.stat().st_size if path.exists() else 0
    time.sleep(AFTER_S)
    later = path.stat().st_size if path.exists() else 0
    return {
        "to_result_ms": round(to_result_ms, 1),
        "outcome": outcome,
        "ticks_at_result": at_result,
        "ticks_after": later,
        "stopped": later == at_result,
    }


def bench_hung(loop: Loop, peers: Peers, aio: asyncio.AbstractEventLoop, tmp: Path) -> dict[str, Any]:
    from agents.tool import invoke_function_tool
    from agents.tool_context import ToolContext

    out: dict[str, Any] = {}

    def rho(name: str) -> Callable[[Path], str]:
        def run(path: Path) -> str:
            [r] = loop.run_turn([ToolCall("h1", name, json.dumps({"path": str(path)}))])
            return f"{r.error_kind}: {r.content[:60]}"

        return run

    def pykka_ask(path: Path) -> str:
        ref = Hung.start()
        try:
            ref.ask(str(path), timeout=HUNG_TIMEOUT_S)
            return "returned"
        except pykka.Timeout:
            return "pykka.Timeout raised"
        finally:
            ref.stop(block=False)

    def langgraph(path: Path) -> str:
        node_input = peers.ai_message([("hung", {"path": str(path)})])
        try:
            pending = peers.tool_node.ainvoke(node_input, peers.node_config)
            aio.run_until_complete(asyncio.wait_for(pending, HUNG_TIMEOUT_S))
            return "returned"
        except TimeoutError:
            return "TimeoutError (asyncio.wait_for; ToolNode has no timeout)"

    def openai_agents(path: Path) -> str:
        args = json.dumps({"path": str(path)})
        ctx = ToolContext(context=None, tool_name="hung", tool_call_id="h1", tool_arguments=args)
        got = aio.run_until_complete(invoke_function_tool(function_tool=peers.oa_hung, context=ctx, arguments=args))
        return f"result: {str(got)[:60]}"

    def pydantic_ai(path: Path) -> str:
        peers.pa_hung_calls[:] = [("hung", {"path": str(path)})]
        result = aio.run_until_complete(peers.pa_hung.run("go"))
        returned = [p for m in result.all_messages() for p in getattr(m, "parts", ())
                    if type(p).__name__ in ("ToolReturnPart", "RetryPromptPart")]
        return f"tool result: {str(returned[0].content)[:60]}" if returned else f"output: {result.output}"

    variants: dict[str, Callable[[Path], str]] = {
        "rho @tool (thread)": rho("hung"),
        "rho @tool (process)": rho("hung_p"),
        "pykka ask(timeout=0.2)": pykka_ask,
        "LangGraph ToolNode.ainvoke": langgraph,
        "OpenAI Agents (async tool, timeout=0.2)": openai_agents,
        "pydantic-ai (tool timeout=0.2)": pydantic_ai,
    }
    for i, (label, fn) in enumerate(variants.items()):
        path = tmp / f"hung-{i}.ticks"
        t0 = time.perf_counter_ns()
        outcome = fn(path)
        out[label] = watch(path, t0, outcome)
    time.sleep(HUNG_MAX_S)  # let every abandoned thread end before the next part
    return out


# --- part 4: BFCL whole sessions -----------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    call_id: str
    name: str
    args: dict[str, Any]
    arguments_json: str


def register_bfcl(system: ActorSystem, bfcl: ModuleType, functions: Mapping[str, Any]) -> None:
    """Register BFCL's backend ``functions`` on ``system``, each tool's origin its class and name."""
    for tool_ in bfcl.make_tools(functions):
        system.register(tool_, origin=f"bfcl {tool_.function.class_name}.{tool_.function.name}")


def planned_sessions(bfcl: ModuleType, sessions: int | None,
                     functions: Mapping[str, Any]) -> tuple[list[Any], list[list[list[Planned]]], list[Any]]:
    """BFCL base's first ``sessions`` entries (``None``: all), each one's turns of planned
    calls and each turn's withheld names (:func:`planned_withheld`)."""
    entries = bfcl.load_entries("base", sessions)
    plans = [plan_entry(bfcl, e, functions) for e in entries]
    withheld = [planned_withheld(bfcl, e, len(p), functions) for e, p in zip(entries, plans, strict=True)]
    return entries, plans, withheld


def plan_entry(bfcl: ModuleType, entry: Any, functions: Mapping[str, Any]) -> list[list[Planned]]:
    """Each ground-truth turn's calls, parsed and bound once, outside the timings."""
    instances = bfcl.build_instances(entry)
    turns = []
    for t, turn in enumerate(entry.ground_truth):
        planned = []
        for j, source in enumerate(turn):
            parsed = bfcl.parse_call(source)
            method = getattr(instances[functions[parsed.name].class_name], parsed.name)
            args = bfcl.bind_arguments(method, parsed)
            planned.append(Planned(f"t{t}c{j}", parsed.name, args, json.dumps(args)))
        turns.append(planned)
    return turns


def planned_withheld(bfcl: ModuleType, entry: Any, turns: int, functions: Mapping[str, Any]) -> list[list[str] | None]:
    """The names a session withholds, sorted: at its start (index 0), then at each turn
    where they change (None where they stay as they were)."""
    planned: list[list[str] | None] = []
    before: set[str] | None = None
    for t in range(turns):
        now = bfcl.withheld_for_turn(entry, t, functions)
        planned.append(sorted(now) if t == 0 or now != before else None)
        before = now
    return planned


def langgraph_bfcl_node(bfcl: ModuleType, functions: Mapping[str, Any]) -> Any:
    """One ToolNode over every BFCL function, built once; each tool finds its session's
    backend in ``config["configurable"]["deps"]`` and returns BFCL's result text."""
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import StructuredTool
    from langgraph.prebuilt import ToolNode

    def make(function: Any) -> Any:
        def run(config: RunnableConfig, **kwargs: Any) -> str:
            instance = config["configurable"]["deps"][function.class_name]
            text, _ = bfcl.execute_direct(instance, function.name, kwargs)
            return str(text)

        run.__annotations__["config"] = RunnableConfig  # resolved here: this module's annotations are strings
        return StructuredTool.from_function(run, name=function.name, description=function.description,
                                            args_schema=bfcl.convert_schema(function.parameters))

    return ToolNode([make(f) for f in functions.values()], handle_tool_errors=True)


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """Wall and process CPU seconds (every thread's) of ``run()``."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def time_bfcl_runs(
    plan: Plan,
    data_dir: Path,
    bfcl: ModuleType,
    functions: Mapping[str, Any],
    rho_sessions: Callable[[ActorSystem, bool], None],
    langgraph_sessions: Callable[[bool], None],
    direct_sessions: Callable[[], None],
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The whole-session wall and process CPU times (s) of each path, interleaved run
    by run; run 0 warms up and checks every result against direct calls."""
    walls: dict[str, list[float]] = {"rho": [], "langgraph": [], "direct": []}
    cpus: dict[str, list[float]] = {"rho": [], "langgraph": [], "direct": []}
    with ActorSystem(data_dir=data_dir) as system:
        register_bfcl(system, bfcl, functions)
        for run in range(plan.bfcl_runs + 1):  # run 0 warms up and checks every result
            check = run == 0
            paths: dict[str, Callable[[], object]] = {
                "rho": functools.partial(rho_sessions, system, check),
                "langgraph": functools.partial(langgraph_sessions, check),
                "direct": direct_sessions,
            }
            for name, path in paths.items():
                wall_s, cpu_s = timed(path)
                if run:
                    walls[name].append(wall_s)
                    cpus[name].append(cpu_s)
    return walls, cpus


def bench_bfcl(plan: Plan, data_dir: Path) -> dict[str, Any]:
    from langchain_core.messages import AIMessage

    try:
        bfcl = bfcl_module()
        functions = bfcl.load_functions()
        # each turn's withheld names, sorted, or None where they do not change: the data set's
        # answer, worked out once outside the timings as the calls are
        entries, plans, withheld_plans = planned_sessions(bfcl, plan.bfcl_limit, functions)
    except Exception as exc:  # BfclUnavailableError, or bfcl_eval missing
        return {"skipped": True, "reason": f"BFCL is unavailable ({exc})"}
    calls = sum(len(t) for p in plans for t in p)
    node = langgraph_bfcl_node(bfcl, functions)
    mismatches = {"rho": 0, "langgraph": 0}

    def direct_texts(entry: Any, turns: list[list[Planned]]) -> list[list[str]]:
        instances = bfcl.build_instances(entry)
        return [[bfcl.execute_direct(instances[functions[p.name].class_name], p.name, p.args)[0] for p in t]
                for t in turns]

    expected = [direct_texts(e, p) for e, p in zip(entries, plans, strict=True)]

    def rho_sessions(system: ActorSystem, check: bool) -> None:
        for entry, turns, withheld, want in zip(entries, plans, withheld_plans, expected, strict=True):
            instances = bfcl.build_instances(entry)
            loop = system.start_loop(session_id=entry.id, withheld=withheld[0] or (), deps=instances)
            try:
                for t, turn in enumerate(turns):
                    changed = withheld[t] if t else None
                    if changed is not None:
                        loop.set_withheld(changed)
                    if turn:
                        results = loop.run_turn([ToolCall(p.call_id, p.name, p.arguments_json) for p in turn])
                        if check:
                            mismatches["rho"] += sum(r.content != w for r, w in zip(results, want[t], strict=True))
            finally:
                loop.stop()

    def langgraph_sessions(check: bool) -> None:
        for entry, turns, want in zip(entries, plans, expected, strict=True):
            config = node_config(configurable={"deps": bfcl.build_instances(entry)}, max_concurrency=1)
            for t, turn in enumerate(turns):
                if turn:
                    message = AIMessage("", tool_calls=[
                        {"name": p.name, "args": p.args, "id": p.call_id, "type": "tool_call"} for p in turn
                    ])
                    got = node.invoke({"messages": [message]}, config)["messages"]
                    if check:
                        mismatches["langgraph"] += sum(m.content != w for m, w in zip(got, want[t], strict=True))

    def direct_sessions() -> None:
        for entry, turns in zip(entries, plans, strict=True):
            instances = bfcl.build_instances(entry)
            for turn in turns:
                for p in turn:
                    bfcl.execute_direct(instances[functions[p.name].class_name], p.name, p.args)

    walls, cpus = time_bfcl_runs(plan, data_dir, bfcl, functions, rho_sessions, langgraph_sessions, direct_sessions)
    return {
        "skipped": False,
        "sessions": len(entries),
        "calls": calls,
        "runs": plan.bfcl_runs,
        "wall_s": {k: summary(v, 4) for k, v in walls.items()},
        "cpu_s": {k: summary(v, 4) for k, v in cpus.items()},
        "result_mismatches": mismatches,
    }


# --- part 5: throughput under concurrency ----------------------------------------------------------


def run_threads(work: Callable[[int], None], threads: int) -> float:
    """Wall time (s) of ``work(i)`` for i in 0..threads-1, each on its own thread;
    raises what a thread raised."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise BenchmarkError(f"a throughput thread failed: {errors[0]!r}")
    return wall


def bench_throughput(system: ActorSystem, peers: Peers, plan: Plan) -> dict[str, Any]:
    """Calls per second of ``throughput_sessions`` sessions x ``throughput_turns``
    turns x 8 no-op calls from 8 threads, through rho_actors and LangGraph."""
    sessions, turns = plan.throughput_sessions, plan.throughput_turns
    calls = [ToolCall(f"c{i}", "noop", "{}") for i in range(THROUGHPUT_CALLS)]
    node_input = peers.ai_message([("noop", {})] * THROUGHPUT_CALLS)

    def rho(thread: int) -> None:
        for s in range(thread, sessions, THROUGHPUT_THREADS):
            loop = system.start_loop(f"tp-{s}")
            try:
                for _ in range(turns):
                    check_rho(loop.run_turn(calls), "noop")
            finally:
                loop.stop()

    def langgraph(thread: int) -> None:
        for _ in range(thread, sessions, THROUGHPUT_THREADS):
            for _ in range(turns):
                got = peers.tool_node.invoke(node_input, peers.node_config)["messages"]
                if len(got) != THROUGHPUT_CALLS or any(m.content != "ok" for m in got):
                    raise BenchmarkError(f"LangGraph ToolNode answered {got!r}")

    total = sessions * turns * THROUGHPUT_CALLS
    gc.collect()
    cpu0 = time.process_time()
    rho_s = run_threads(rho, THROUGHPUT_THREADS)
    rho_cpu = time.process_time() - cpu0
    gc.collect()
    cpu0 = time.process_time()
    lg_s = run_threads(langgraph, THROUGHPUT_THREADS)
    lg_cpu = time.process_time() - cpu0
    return {
        "sessions": sessions, "turns": turns, "calls_per_turn": THROUGHPUT_CALLS, "threads": THROUGHPUT_THREADS,
        "calls": total,
        "rho": {"wall_s": round(rho_s, 3), "calls_per_s": round(total / rho_s, 1),
                "cpu_us_per_call": round(rho_cpu / total * 1e6, 1)},
        "langgraph": {"wall_s": round(lg_s, 3), "calls_per_s": round(total / lg_s, 1),
                      "cpu_us_per_call": round(lg_cpu / total * 1e6, 1)},
    }


# --- targets and report --------------------------------------------------------------------------


def targets(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every goal of #12, #26 and #42: ``ratio`` against ``limit``, ``at_most`` (a ratio
    that must stay below its limit) or not (one that must reach it)."""
    rows: list[tuple[str, float, float, bool]] = []
    if "per_call" in report:
        rows += per_call_targets(report)
    b = report.get("bfcl", {"skipped": True})
    if not b.get("skipped"):
        rows.append(("BFCL whole sessions rho / LangGraph ToolNode",
                     b["wall_s"]["rho"]["p50"] / b["wall_s"]["langgraph"]["p50"], 0.25, True))
        rows.append(("BFCL whole sessions, process CPU: rho / LangGraph",
                     b["cpu_s"]["rho"]["p50"] / b["cpu_s"]["langgraph"]["p50"], 0.25, True))
    if "throughput" in report:
        t = report["throughput"]
        rows.append((f"{t['sessions']}x{t['turns']}x{t['calls_per_turn']} calls/s from {t['threads']} threads: "
                     "rho / LangGraph", t["rho"]["calls_per_s"] / t["langgraph"]["calls_per_s"], 8.0, False))
    if "parallel" in report:
        rows.append(("16 x 100 ms untrusted (process) / ideal",
                     report["parallel"]["rho run_turn untrusted (process, default pool)"]["ratio_to_ideal"], 1.2, True))
    return [{"target": name, "ratio": round(r, 3), "limit": lim, "at_most": at_most,
             "pass": r <= lim if at_most else r >= lim} for name, r, lim, at_most in rows]


def per_call_targets(report: Mapping[str, Any]) -> list[tuple[str, float, float, bool]]:
    """The goals of part 1 (a no-op call)."""
    p = report["per_call"]

    def p50(label: str) -> float:
        return float(p[label]["p50"])

    rho = p50("rho run_turn @tool (thread)")
    oa = p50("OpenAI Agents on_invoke_tool")
    oa_bounded = p50("OpenAI Agents on_invoke_tool (async tool) in asyncio.timeout")
    rows = [
        ("no-op run_turn / OpenAI Agents on_invoke_tool", rho / oa, 0.5, True),
        ("no-op run_turn / pykka start+ask+stop", rho / p50("pykka start + ask + stop"), 0.6, True),
        ("no-op run_turn / LangGraph ToolNode.ainvoke", rho / p50("LangGraph ToolNode.ainvoke"), 0.35, True),
        ("async host: arun_turn sync tool / on_invoke_tool", p50("rho arun_turn @tool (thread)") / oa, 0.75, True),
        ("async host: arun_turn async tool / on_invoke_tool in asyncio.timeout",
         p50("rho arun_turn async @tool (thread)") / oa_bounded, 1.0, True),
        ("process isolation @tool / static", p50("rho run_turn @tool (process)") / p50("rho run_turn static (process)"),
         1.15, True),
    ]
    return rows


def print_text(report: Mapping[str, Any]) -> None:
    env = report["environment"]
    vs = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    print(f"rho_actors vs peers ({env['mode']} run; python {env['python']}, {env['cpus']} CPUs, "
          f"load {env['load_avg_1m']}; {vs})")
    if "per_call" in report:
        print_calls(report)
    if "bfcl" in report:
        print_bfcl(report["bfcl"])
    if "throughput" in report:
        t = report["throughput"]
        print(f"\n5. throughput: {t['sessions']} sessions x {t['turns']} turns x {t['calls_per_turn']} no-op calls "
              f"from {t['threads']} threads ({t['calls']} calls)")
        for k in ("rho", "langgraph"):
            print(f"   {k:<10} {t[k]['wall_s']:>8.3f} s  {t[k]['calls_per_s']:>10.1f} calls/s  "
                  f"process CPU {t[k]['cpu_us_per_call']:>6.1f} us a call")
    print(f"\n#12, #26 and #42 goals (load average {env['load_avg_1m']} at the start, "
          f"{report['environment'].get('load_avg_end')} at the end)")
    for t in report["targets"]:
        sign = "<=" if t["at_most"] else ">="
        print(f"   {t['target']:<70} {t['ratio']:>6.2f}x  {sign} {t['limit']:g}x  {verdict(t['pass'])}")


def print_calls(report: Mapping[str, Any]) -> None:
    """Parts 1 to 3 as text."""
    pc = report["per_call"]
    rho = pc["rho run_turn @tool (thread)"]["p50"]
    print("\n1. no-op tool, one call (us; ratio = p50 / rho run_turn @tool thread p50)")
    print(f"   {'path':<62} {'p50':>9} {'p99':>9}  {'ratio':>6}")
    for label, s in pc.items():
        p99 = "" if s["p99"] is None else f"{s['p99']:>9.1f}"
        print(f"   {label:<62} {s['p50']:>9.1f} {p99:>9}  {s['p50'] / rho:>6.2f}")
    if "parallel" not in report:  # --only calls
        return
    print(f"\n2. {PARALLEL_CALLS} parallel calls of a {SLEEP_S * 1000:.0f} ms tool (wall ms; ideal 100)")
    for label, s in report["parallel"].items():
        print(f"   {label:<50} {s['p50']:>7.1f} {s['p99']:>7.1f}  {s['ratio_to_ideal']:>5.2f}x ideal")
    print(f"\n3. a hung tool, {HUNG_TIMEOUT_S * 1000:.0f} ms timeout: time to result; ticks (10 ms) "
          f"at the result and {AFTER_S * 1000:.0f} ms later")
    for label, h in report["hung"].items():
        state = "stopped" if h["stopped"] else "STILL RUNNING"
        print(f"   {label:<42} {h['to_result_ms']:>7.1f} ms  {h['ticks_at_result']:>3} -> {h['ticks_after']:>3} "
              f"{state:<13}  {h['outcome']}")


def print_bfcl(b: Mapping[str, Any]) -> None:
    """Part 4 as text."""
    print("\n4. BFCL multi_turn_base, whole sessions (s)")
    if b.get("skipped"):
        print(f"   skipped: {b['reason']}")
    else:
        w, c = b["wall_s"], b["cpu_s"]
        print(f"   {b['sessions']} sessions, {b['calls']} calls, {b['runs']} run(s) after a warm-up; "
              f"results differing from direct calls: {b['result_mismatches']}")
        for k in ("rho", "langgraph", "direct"):
            print(f"   {k:<10} p50 {w[k]['p50']:.4f}  min {w[k]['min']:.4f}  ratio to rho "
                  f"{w[k]['p50'] / w['rho']['p50']:.2f}   process CPU p50 {c[k]['p50']:.4f}  ratio to rho "
                  f"{c[k]['p50'] / c['rho']['p50']:.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke run")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every number, nothing else")
    parser.add_argument("--only", choices=("bfcl", "calls", "throughput"),
                        help="run this part alone (bfcl: part 4, BFCL whole sessions; calls: part 1, a no-op call; "
                             "throughput: part 5, calls from 8 threads)")
    parser.add_argument("--bfcl-runs", type=int, metavar="N", help="timed runs of part 4 (default: 3, --quick 1)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.bfcl_runs is not None:
        if args.bfcl_runs < 1:
            parser.error(f"--bfcl-runs must be at least 1, got {args.bfcl_runs}")
        plan = dataclasses.replace(plan, bfcl_runs=args.bfcl_runs)
    started = time.perf_counter_ns()
    reason = missing_peers()
    if reason is not None:
        if args.json:
            print(json.dumps({"skipped": True, "reason": reason}))
        else:
            print(f"skipped: {reason}")
        return 0
    report: dict[str, Any] = {"environment": environment(args.quick, versions=versions())}
    aio = asyncio.new_event_loop()
    try:
        if args.only is None:
            measure_calls(report, aio, plan)
        elif args.only == "calls":
            measure_calls(report, aio, plan, calls_only=True)
        elif args.only == "throughput":
            measure_throughput(report, plan)
        if args.only is None or args.only == "bfcl":
            with tempfile.TemporaryDirectory(prefix="rho-peers-bfcl-") as tmp:
                report["bfcl"] = bench_bfcl(plan, Path(tmp))
        report["targets"] = targets(report)
    except BenchmarkError as exc:
        print(f"benchmark error: {exc}", file=sys.stderr)
        return 1
    finally:
        aio.close()
    report["environment"]["threads_at_end"] = threading.active_count()
    report["environment"]["load_avg_end"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    report["environment"]["pid"] = os.getpid()
    return publish(report, started, args.json, print_text)


def measure_calls(report: dict[str, Any], aio: asyncio.AbstractEventLoop, plan: Plan, calls_only: bool = False) -> None:
    """Parts 1, 2, 3 and 5 into ``report`` (part 1 alone with ``calls_only``)."""
    peers = Peers()
    with tempfile.TemporaryDirectory(prefix="rho-peers-") as tmp, ActorSystem(data_dir=tmp) as system:
        for t in (rho_noop, rho_anoop, StaticNoop, rho_sleep, rho_hung):
            system.register(t)
        for t in (rho_noop_p, StaticNoopP, rho_hung_p):
            system.register(t, isolation="process")
        system.register(rho_sleep_untrusted, untrusted=True)
        loop = system.start_loop("bench-peers")
        try:
            report["per_call"] = bench_per_call(loop, peers, aio, plan)
            if calls_only:
                return
            report["parallel"] = bench_parallel(loop, peers, aio, plan)
            report["hung"] = bench_hung(loop, peers, aio, Path(tmp))
        finally:
            loop.stop()
        report["throughput"] = bench_throughput(system, peers, plan)


def measure_throughput(report: dict[str, Any], plan: Plan) -> None:
    """Part 5 alone into ``report``."""
    peers = Peers()
    with tempfile.TemporaryDirectory(prefix="rho-peers-") as tmp, ActorSystem(data_dir=tmp) as system:
        system.register(rho_noop)
        bench_throughput(system, peers, dataclasses.replace(plan, throughput_sessions=8, throughput_turns=3))  # warm-up
        report["throughput"] = bench_throughput(system, peers, plan)


if __name__ == "__main__":
    sys.exit(main())
