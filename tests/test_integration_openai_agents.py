"""The OpenAI Agents SDK's own ``Runner.run`` with rho's ``function_tools``: a scripted
model (the SDK's ``Model`` interface) asks for every case in one reply, then answers."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

pytest.importorskip("agents")

from agents import Agent, FunctionTool, RunConfig, RunContextWrapper, RunHooks, Runner, function_tool
from agents.exceptions import ModelBehaviorError
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.tool import default_tool_error_function
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from rho_actors import ActorSystem, CallEvent, ToolCall
from rho_actors.integrations.openai_agents import function_tools
from tests import adapter_tools
from tests.adapter_tools import later, set_up
from tests.conftest import WAIT_S, wait_for

Call = tuple[str, str, Any]


class ScriptedModel(Model):
    """Replies ``script[i]`` at step ``i`` (tool calls, or a final text), recording the
    tool names and the function outputs it was given."""

    def __init__(self, script: list[list[Call] | str], between: Callable[[int], None] = lambda step: None) -> None:
        self.script = script
        self.between = between
        self.offered: list[list[str]] = []
        self.outputs: dict[str, str] = {}

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
                           *args: Any, **kwargs: Any) -> ModelResponse:
        step = len(self.offered)
        self.offered.append([t.name for t in tools])
        for item in input if isinstance(input, list) else []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                self.outputs[item["call_id"]] = str(item["output"])
        self.between(step)
        reply = self.script[step]
        output: list[Any]
        if isinstance(reply, str):
            text = ResponseOutputText(annotations=[], text=reply, type="output_text")
            output = [ResponseOutputMessage(id=f"m{step}", content=[text], role="assistant", status="completed",
                                            type="message")]
        else:
            output = [ResponseFunctionToolCall(arguments=a if isinstance(a, str) else _json(a), call_id=cid,
                                               name=name, type="function_call", id=f"fc_{cid}", status="completed")
                      for cid, name, a in reply]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def run(agent: Agent[Any]) -> Any:
    import asyncio

    return asyncio.run(Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True)))


def test_a_run_gets_every_result_as_rho_text_and_a_hung_call_back_at_its_deadline(
    system: ActorSystem, tmp_path: Path
) -> None:
    setup = set_up(system, tmp_path)
    model = ScriptedModel([setup.calls(), "all done"])
    agent = Agent(name="helper", model=model, tools=function_tools(setup.loop))
    t0 = time.monotonic()
    result = run(agent)
    elapsed = time.monotonic() - t0
    assert result.final_output == "all done"
    assert "An error occurred" not in " ".join(model.outputs.values())
    adapter_tools.check_outputs(model.outputs, setup, elapsed)


def test_the_framework_call_id_is_the_rho_call_id(system: ActorSystem, tmp_path: Path) -> None:
    setup = set_up(system, tmp_path, processes=False)
    seen: list[str] = []
    system.subscribe(lambda event: seen.append(event.call_id) if hasattr(event, "call_id") else None)
    model = ScriptedModel([[("call_XYZ", "add", {"a": 2, "b": 2})], "four"])
    assert run(Agent(name="a", model=model, tools=function_tools(setup.loop))).final_output == "four"
    assert model.outputs == {"call_XYZ": "4"}
    assert "call_XYZ" in seen


def test_the_tools_follow_the_loop_from_one_step_to_the_next(system: ActorSystem, tmp_path: Path) -> None:
    setup = set_up(system, tmp_path, processes=False)

    def between(step: int) -> None:
        if step == 0:
            setup.loop.set_withheld({"boom"})
            system.register(later)

    model = ScriptedModel([[("c1", "add", {"a": 1, "b": 1})], [("c2", "later", {})], "ok"], between)
    assert run(Agent(name="a", model=model, tools=function_tools(setup.loop))).final_output == "ok"
    assert model.offered[0] == ["add", "boom", "meet"]
    assert model.offered[1] == ["add", "meet", "later"]
    assert model.outputs == {"c1": "2", "c2": "later"}


def test_function_tools_takes_a_loop() -> None:
    with pytest.raises(TypeError, match=r"function_tools takes a rho_actors\.Loop, got str"):
        function_tools("s1")  # type: ignore[arg-type]


def test_an_unchanged_declaration_keeps_its_function_tool(system: ActorSystem, tmp_path: Path) -> None:
    setup = set_up(system, tmp_path, processes=False)
    tools = function_tools(setup.loop)
    first = {t.name: t for t in tools}
    system.register(later)
    second = {t.name: t for t in tools}
    assert set(second) == set(first) | {"later"}
    assert all(second[name] is tool for name, tool in first.items())  # the same objects: nothing rebuilt


def test_a_call_rho_holds_for_approval_is_an_sdk_interruption_approved_or_rejected(system: ActorSystem) -> None:
    from rho_actors import ToolCall as RhoCall
    from rho_actors import tool

    ran: list[str] = []

    @tool(requires_approval=True)
    def wipe(path: str) -> str:
        """Wipe a folder."""
        ran.append(path)
        return f"wiped {path}"

    system.register(wipe)
    loop = system.start_loop("agents-approval")
    assert loop.requires_approval(RhoCall("x", "wipe", '{"path": "/a"}'))
    model = ScriptedModel([[("c1", "wipe", {"path": "/a"}), ("c2", "wipe", {"path": "/b"})], "done"])
    agent = Agent(name="helper", model=model, tools=function_tools(loop))
    first = run(agent)
    assert sorted(item.call_id for item in first.interruptions) == ["c1", "c2"] and ran == []
    state = first.to_state()
    approve, reject = sorted(first.interruptions, key=lambda item: item.call_id)
    state.approve(approve)
    state.reject(reject)
    import asyncio

    second = asyncio.run(Runner.run(agent, state, run_config=RunConfig(tracing_disabled=True)))
    assert second.final_output == "done" and ran == ["/a"]
    assert model.outputs["c1"] == "wiped /a" and "c2" in model.outputs and "wiped" not in model.outputs["c2"]
    assert loop.pending() == []


def test_an_sdk_tool_registered_in_rho_is_the_sdks_own_with_its_calls_run_through_rho(system: ActorSystem) -> None:
    """``system.register(sdk_tool)`` adopts an Agents SDK ``FunctionTool``; ``function_tools``
    hands the SDK its own tool back (name, schema, failure handling), each call a rho turn
    that gets the SDK's ``ToolContext`` (the run context too)."""
    @function_tool
    def greet(ctx: RunContextWrapper[dict[str, str]], name: str, punctuation: str = "!") -> str:
        """Greet someone on behalf of the run's user."""
        return f"hello {name} from {ctx.context['user']}{punctuation}"

    assert system.register(greet).reason is None
    seen: list[str] = []
    system.subscribe(lambda event: seen.append(event.call_id) if isinstance(event, CallEvent) else None)
    loop = system.start_loop("sdk-adopted")
    [adapted] = [t for t in function_tools(loop) if isinstance(t, FunctionTool) and t.name == "greet"]
    assert adapted.params_json_schema == greet.params_json_schema and adapted.description == greet.description

    def call(call_id: str, arguments: str) -> Any:
        ctx = ToolContext({"user": "ann"}, tool_name="greet", tool_call_id=call_id, tool_arguments=arguments)
        async def invoked() -> Any:
            return await adapted.on_invoke_tool(ctx, arguments)

        return asyncio.run(invoked())

    assert call("c1", '{"name": "bob"}') == "hello bob from ann!"  # a default left out, as the SDK allows
    sdk_words = default_tool_error_function(RunContextWrapper({}), ValueError("any"))  # the SDK's own words (its
    # default failure_error_function: they change between releases, 0.25 dropped "Please try again.")
    assert call("c2", '{"name": ') == sdk_words  # JSON it cannot parse
    assert call("c3", "{}") == sdk_words  # arguments rho's check refuses: the SDK's ModelBehaviorError
    assert "c1" in seen  # run as a rho call


def _finished(system: ActorSystem) -> list[tuple[str, str | None]]:
    """(call id, outcome) of each call rho finishes from now on."""
    seen: list[tuple[str, str | None]] = []
    system.subscribe(lambda e: seen.append((e.call_id, e.outcome))
                     if isinstance(e, CallEvent) and e.kind == "finished" else None)
    return seen


class ToolAborted(BaseException):
    """A tool's own ``BaseException`` (not an ``Exception``)."""


def test_a_tools_own_cancelled_error_and_base_exceptions_reach_the_sdk_as_from_its_own_executor(
    system: ActorSystem,
) -> None:
    """The SDK hands a ``CancelledError`` its tool raises to the tool's
    ``failure_error_function`` (as an ``Exception``) and lets it, or any other
    ``BaseException``, end the run when there is none; rho's core gives each call its one
    ``exited`` result all the same."""
    async def stops() -> str:
        raise asyncio.CancelledError("tool-cancelled")

    async def aborts() -> str:
        raise ToolAborted("fatal")

    handled = function_tool(stops, name_override="handled",
                            failure_error_function=lambda ctx, error: f"handled: {type(error).__name__}: {error}")
    raising = function_tool(stops, name_override="raising", failure_error_function=None)
    fatal = function_tool(aborts, name_override="fatal", failure_error_function=None)
    for sdk_tool in (handled, raising, fatal):
        assert system.register(sdk_tool).reason is None
    finished = _finished(system)
    loop = system.start_loop("sdk-cancelled")
    tools = {t.name: t for t in function_tools(loop)}

    model = ScriptedModel([[("c1", "handled", {})], "done"])
    assert run(Agent(name="a", model=model, tools=[tools["handled"]])).final_output == "done"
    assert model.outputs == {"c1": "handled: _FunctionToolCancelledError: tool-cancelled"}
    with pytest.raises(asyncio.CancelledError):
        run(Agent(name="a", model=ScriptedModel([[("c2", "raising", {})], "never"]), tools=[tools["raising"]]))
    with pytest.raises(ToolAborted, match="fatal"):
        run(Agent(name="a", model=ScriptedModel([[("c3", "fatal", {})], "never"]), tools=[tools["fatal"]]))
    wait_for(lambda: len(finished) == 3)
    assert sorted(finished) == [("c1", "exited"), ("c2", "exited"), ("c3", "exited")]


def test_cancelling_the_task_that_runs_a_tool_cancels_the_tool_at_once_and_ends_as_the_tool_ends(
    system: ActorSystem,
) -> None:
    """As in the SDK's own executor, whose task runs the tool: the tool sees the cancel in
    the step that cancels its task (before the canceller's next step), and the call ends
    as the tool's cleanup ends it (here with its error); rho's result is one ``cancelled``."""
    seen: list[str] = []

    events: dict[str, asyncio.Event] = {}

    async def slow() -> str:
        events["started"].set()
        try:
            await asyncio.Future()
        except asyncio.CancelledError:
            seen.append("cancelled")
            await events["release"].wait()
            raise ValueError("cleanup failed") from None
        return "never"

    sdk_tool = function_tool(slow, failure_error_function=None)
    assert system.register(sdk_tool).reason is None
    finished = _finished(system)
    [adapted] = [t for t in function_tools(system.start_loop("sdk-cancel-run")) if isinstance(t, FunctionTool)]

    async def main() -> None:
        events.update(started=asyncio.Event(), release=asyncio.Event())
        ctx = ToolContext(None, tool_name="slow", tool_call_id="c1", tool_arguments="{}")
        invocation = asyncio.ensure_future(adapted.on_invoke_tool(ctx, "{}"))
        await asyncio.wait_for(events["started"].wait(), WAIT_S)
        invocation.cancel()
        try:
            await asyncio.sleep(0)
            assert seen == ["cancelled"]  # in the cancelling step, as its own coroutine would be
            assert not invocation.done()  # the call waits for the tool's cleanup
        finally:
            events["release"].set()
        with pytest.raises(ValueError, match="cleanup failed"):
            await asyncio.wait_for(invocation, WAIT_S)

    asyncio.run(main())
    wait_for(lambda: finished != [])
    assert finished == [("c1", "cancelled")]


def test_the_context_variables_a_tool_sets_are_seen_by_the_sdks_hooks_after_it(system: ActorSystem) -> None:
    """The SDK runs a tool in the task that then runs its output guardrails and
    ``on_tool_end`` hooks, which see what the tool set; rho runs it in a task of its own
    (a copy of the caller's context) and sets the same values back for them."""
    state: contextvars.ContextVar[str] = contextvars.ContextVar("state", default="unset")
    seen: list[str] = []

    async def sets_state() -> str:
        state.set("from-tool")
        return "ok"

    class Hooks(RunHooks[Any]):
        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
            seen.append(state.get())

    assert system.register(function_tool(sets_state, name_override="sets_state")).reason is None
    agent = Agent(name="a", model=ScriptedModel([[("c1", "sets_state", {})], "done"]),
                  tools=function_tools(system.start_loop("sdk-context")))
    result = asyncio.run(Runner.run(agent, "go", hooks=Hooks(), run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == "done" and seen == ["from-tool"] and state.get() == "unset"


def test_an_sdk_tools_variadic_arguments_may_be_left_out_as_its_own_validation_allows(system: ActorSystem) -> None:
    """The SDK's strict schema requires a function's ``*args`` (an array) and its
    ``**kwargs`` (an object), but its own validation gives each an empty default: rho's
    check lets them be left out too, and still checks what is sent against the schema."""
    def total(*scores: Annotated[int, Field(ge=0, le=10)]) -> int:
        return sum(scores)

    sdk_tool = function_tool(total, failure_error_function=None)
    assert sdk_tool.params_json_schema["required"] == ["scores"]  # what the model is told
    assert system.register(sdk_tool).reason is None
    loop = system.start_loop("sdk-variadic")
    [adapted] = [t for t in function_tools(loop) if isinstance(t, FunctionTool)]

    def call(call_id: str, arguments: str) -> Any:
        ctx = ToolContext(None, tool_name="total", tool_call_id=call_id, tool_arguments=arguments)

        async def invoked() -> Any:
            return await adapted.on_invoke_tool(ctx, arguments)

        return asyncio.run(invoked())

    assert call("v1", "{}") == 0
    assert call("v2", '{"scores": [3, 4]}') == 7
    with pytest.raises(ModelBehaviorError, match="maximum"):  # rho's check, as the SDK raises for its own
        call("v3", '{"scores": [11]}')
    [result] = loop.run_turn([ToolCall("v4", "total", "{}")])  # rho's own loop takes it the same way
    assert result.ok and result.content == "0"
