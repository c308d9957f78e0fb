"""pydantic-ai's own ``Agent.run`` with rho's ``RhoToolset``: a ``FunctionModel`` asks
for every case in one reply, then answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, ModelRetry, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from rho_actors import ActorSystem
from rho_actors.integrations.pydantic_ai import RhoToolset
from tests import adapter_tools
from tests.adapter_tools import later, set_up
from tests.conftest import WAIT_S, wait_for

Call = tuple[str, str, Any]


class Script:
    """A ``FunctionModel`` function replying ``script[i]`` at step ``i``, recording the
    tools offered and what came back for each call id."""

    def __init__(self, script: list[list[Call] | str], between: Callable[[int], None] = lambda step: None) -> None:
        self.script = script
        self.between = between
        self.offered: list[list[str]] = []
        self.outputs: dict[str, str] = {}
        self.outcomes: dict[str, str] = {}

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = len(self.offered)
        self.offered.append([t.name for t in info.function_tools])
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                self.outputs[part.tool_call_id] = str(part.content)
                self.outcomes[part.tool_call_id] = part.outcome
        self.between(step)
        reply = self.script[step]
        if isinstance(reply, str):
            return ModelResponse(parts=[TextPart(reply)])
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=cid) for cid, name, args in reply])


def test_a_run_gets_every_result_and_a_retry_prompt_for_invalid_arguments(
    system: ActorSystem, tmp_path: Path
) -> None:
    setup = set_up(system, tmp_path)
    script = Script([setup.calls(), "all done"])
    agent = Agent(FunctionModel(script), toolsets=[RhoToolset(setup.loop)])
    t0 = time.monotonic()
    result = asyncio.run(agent.run("go"))
    elapsed = time.monotonic() - t0
    assert result.output == "all done"
    # invalid arguments ask the model to retry; the other errors are failed results
    assert script.outcomes == {"c_add": "success", "c_boom": "failed", "c_hang": "failed", "c_bad": "retried",
                               "c_meet1": "success", "c_meet2": "success"}
    assert "$.a: \"one\" is not of type \"integer\"" in script.outputs["c_bad"]
    adapter_tools.check_outputs(script.outputs, setup, elapsed)


def test_the_tools_follow_the_loop_and_the_call_id_is_pydantic_ais(system: ActorSystem, tmp_path: Path) -> None:
    setup = set_up(system, tmp_path, processes=False)
    seen: list[str] = []
    system.subscribe(lambda event: seen.append(event.call_id) if hasattr(event, "call_id") else None)

    def between(step: int) -> None:
        if step == 0:
            setup.loop.set_withheld({"boom"})
            system.register(later)

    script = Script([[("pa_1", "add", {"a": 1, "b": 1})], [("pa_2", "later", {})], "ok"], between)
    result = Agent(FunctionModel(script), toolsets=[RhoToolset(setup.loop)]).run_sync("go")
    assert result.output == "ok"
    assert script.offered == [["add", "boom", "meet"], ["add", "meet", "later"], ["add", "meet", "later"]]
    assert script.outputs == {"pa_1": "2", "pa_2": "later"}
    assert {"pa_1", "pa_2"} <= set(seen)


def test_given_a_system_each_conversation_is_a_rho_session(system: ActorSystem, tmp_path: Path) -> None:
    set_up(system, tmp_path, processes=False)
    toolset = RhoToolset(system)
    agent = Agent(FunctionModel(Script([[("c1", "add", {"a": 2, "b": 3})], "five"])), toolsets=[toolset])
    try:
        assert agent.run_sync("go", conversation_id="conv-7").output == "five"
        assert system.whereis("loop:conv-7") is not None
        assert (system.data_dir / "sessions" / "conv-7").is_dir()
    finally:
        toolset.close()
    assert system.whereis("loop:conv-7") is None


def test_rho_toolset_takes_a_loop_or_a_system() -> None:
    with pytest.raises(TypeError, match=r"RhoToolset takes a rho_actors\.Loop or ActorSystem, got dict"):
        RhoToolset({})  # type: ignore[arg-type]


def test_a_call_rho_holds_is_a_deferred_approval_run_once_approved_never_when_denied(system: ActorSystem) -> None:
    from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied

    from rho_actors import tool

    ran: list[str] = []

    @tool(requires_approval=True)
    def wipe(path: str) -> str:
        """Wipe a folder."""
        ran.append(path)
        return f"wiped {path}"

    system.register(wipe)
    loop = system.start_loop("pai-approval")
    script = Script([[("c1", "wipe", {"path": "/a"}), ("c2", "wipe", {"path": "/b"})], "done"])
    agent = Agent(FunctionModel(script), toolsets=[RhoToolset(loop)], output_type=[str, DeferredToolRequests])
    first = asyncio.run(agent.run("go"))
    assert isinstance(first.output, DeferredToolRequests)
    assert sorted(c.tool_call_id for c in first.output.approvals) == ["c1", "c2"] and ran == []
    results = DeferredToolResults(approvals={"c1": True, "c2": ToolDenied("keep /b")})
    second = asyncio.run(agent.run(message_history=first.all_messages(), deferred_tool_results=results))
    assert second.output == "done" and ran == ["/a"]
    assert script.outputs["c1"] == "wiped /a" and script.outputs["c2"] == "keep /b"
    assert loop.pending() == []


def test_a_tool_claiming_pending_approval_is_its_own_failure_never_a_held_call(system: ActorSystem) -> None:
    """A (malicious) untrusted tool's worker answers with the kind only a held call has,
    ``pending_approval``: the run goes on with the tool's failure as the model's text,
    nothing is approved, and the adapter never raises."""
    from rho_actors import ToolCall

    system.register(adapter_tools.ForgesApproval, untrusted=True)
    loop = system.start_loop("pai-forged")
    [direct] = loop.run_turn([ToolCall("c0", "forges_approval", "{}")])
    assert direct.error_kind == "pending_approval" and loop.pending() == []  # what the worker sent
    script = Script([[("c1", "forges_approval", {})], "done"])
    result = asyncio.run(Agent(FunctionModel(script), toolsets=[RhoToolset(loop)]).run("go"))
    assert result.output == "done"
    assert "requires approval" in script.outputs["c1"] and loop.pending() == []


def _balance_tool(seen: list[tuple[int, Any]]) -> Any:
    def balance(ctx: RunContext[dict[str, int]], account: str) -> int:
        """An account's balance."""
        seen.append((ctx.retry, ctx.deps))
        if ctx.retry == 0:
            raise ModelRetry("the ledger is busy, try again")
        return ctx.deps[account]

    return Tool(balance, max_retries=2)


def test_a_pydantic_ai_tool_registered_in_rho_gets_the_run_context_and_its_model_retry_is_a_retry(
    system: ActorSystem,
) -> None:
    seen: list[tuple[int, Any]] = []
    system.register(_balance_tool(seen))
    loop = system.start_loop("pai-own")
    script = Script([[("c1", "balance", {"account": "a"})], [("c2", "balance", {"account": "a"})], "done"])
    agent = Agent(FunctionModel(script), deps_type=dict[str, int], toolsets=[RhoToolset(loop)])
    result = asyncio.run(agent.run("go", deps={"a": 12}))
    assert result.output == "done"
    assert seen == [(0, {"a": 12}), (1, {"a": 12})]  # pydantic-ai's retry count and the run's deps
    assert (script.outcomes["c1"], script.outputs["c1"]) == ("retried", "the ledger is busy, try again")
    assert script.outputs["c2"] == "12"


def test_a_call_rho_makes_on_its_own_of_a_run_context_tool_says_it_needs_one(system: ActorSystem) -> None:
    from rho_actors import ToolCall

    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    system.register(_balance_tool([]))
    system.register(Tool(double))
    loop = system.start_loop("pai-rho-alone")
    calls = [ToolCall("c1", "balance", '{"account": "a"}'), ToolCall("c2", "double", '{"x": 4}')]
    ctx_call, plain = loop.run_turn(calls)
    assert ctx_call.error_kind == "raised" and "takes a RunContext, which only pydantic-ai gives" in ctx_call.content
    assert plain.ok and plain.content == "8"


async def overruns() -> str:
    """Sleep far past the tool's timeout."""
    await asyncio.sleep(30)
    return "late"


def overruns_in_a_worker() -> str:
    """Sleep far past the tool's timeout (sync: pydantic-ai alone could only abandon its thread)."""
    time.sleep(30)
    return "late"


def test_a_pydantic_ai_tools_timeout_is_rhos_deadline_and_a_call_past_it_pydantic_ais_retry_prompt(
    system: ActorSystem,
) -> None:
    """``Tool(timeout=...)`` is the tool's rho deadline, in ``thread`` and ``process``
    isolation alike; the model gets pydantic-ai's own retry prompt for a call past it,
    as from pydantic-ai's toolset, and the worker process is stopped there."""
    from rho_actors import CallEvent

    system.register(Tool(overruns, timeout=0.3, max_retries=1))
    system.register(Tool(overruns_in_a_worker, timeout=0.3, max_retries=1), isolation="process")
    entries = system.tool_set().entries
    assert entries["overruns"].info.timeout_ms == entries["overruns_in_a_worker"].info.timeout_ms == 300
    finished: list[tuple[str, str | None]] = []
    system.subscribe(lambda e: finished.append((e.call_id, e.outcome))
                     if isinstance(e, CallEvent) and e.kind == "timed_out" else None)
    loop = system.start_loop("pai-timeout")
    script = Script([[("c1", "overruns", {}), ("c2", "overruns_in_a_worker", {})], "done"])
    agent = Agent(FunctionModel(script), toolsets=[RhoToolset(loop)])
    t0 = time.monotonic()
    result = asyncio.run(agent.run("go"))
    elapsed = time.monotonic() - t0
    assert result.output == "done"
    assert script.outcomes == {"c1": "retried", "c2": "retried"}
    assert script.outputs == {"c1": "Timed out after 0.3 seconds.", "c2": "Timed out after 0.3 seconds."}
    assert elapsed < 0.3 + WAIT_S  # back at the deadline, not after the tools' 30 s
    wait_for(lambda: len(finished) == 2)
    assert sorted(finished) == [("c1", "timeout"), ("c2", "timeout")]


def test_a_run_context_tool_is_refused_in_process_isolation_saying_what_to_do(system: ActorSystem) -> None:
    """A ``RunContext`` lives in the run's process: a tool taking one cannot run in a
    worker process, and registering it there raises, naming the tool and the remedies;
    nothing is registered."""
    what = r"pydantic-ai tool 'balance' takes a RunContext, which cannot reach 'process' isolation .*isolation='thread'"
    with pytest.raises(ValueError, match=what):
        system.register(_balance_tool([]), isolation="process")
    with pytest.raises(ValueError, match=what):
        system.register_many([Tool(overruns), _balance_tool([])], isolation="process")
    assert "balance" not in system.tool_set().entries and "overruns" not in system.tool_set().entries
    assert system.register(_balance_tool([])).reason is None  # in thread isolation, the default
