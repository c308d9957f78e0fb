"""The model choosing to run a call of a ``background="optional"`` tool in the
background (DESIGN §4 "Background calls"): the ``run_in_background`` argument its
declaration gains, taken out before the tool's own arguments are validated, through
``run_turn`` and through the agent loop with a scripted model."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, TaskFinished, TaskSettings, ToolCall, tool
from rho_actors.agent.model import Reply, ScriptedModel
from rho_actors.declarations.formats import Dialect

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(120)

seen: list[dict[str, Any]] = []
release = threading.Event()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    seen.clear()
    release.clear()


@tool(background="optional")
def report(topic: str) -> str:
    """Write a report on a topic."""
    seen.append({"topic": topic, "thread": threading.current_thread().name})
    release.wait(WAIT_S)
    return f"report on {topic}"


@tool(background="optional")
def own_flag(run_in_background: str) -> str:
    """A tool whose own argument happens to have the standard name."""
    return f"mine: {run_in_background}"


@tool
def plain(topic: str) -> str:
    """A tool that never runs in the background."""
    return f"plain {topic}"


def _schema(declarations: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [declared] = [d for d in declarations if d["name"] == name]
    schema: dict[str, Any] = declared["parameters"]
    return schema


def test_the_declaration_shown_to_the_model_gains_run_in_background_only_for_optional_tools(
        system: ActorSystem) -> None:
    for t in (report, own_flag, plain):
        system.register(t)
    loop = system.start_loop("s1")
    declarations = loop.declarations()
    flag = _schema(declarations, "report")["properties"]["run_in_background"]
    assert flag["type"] == "boolean" and "background" in flag["description"]
    assert "run_in_background" not in _schema(declarations, "report").get("required", [])
    assert "run_in_background" not in _schema(declarations, "plain")["properties"]
    assert _schema(declarations, "own_flag")["properties"]["run_in_background"]["type"] == "string"
    [info] = [i for i in loop.offered() if i.name == "report"]  # the tool's own declaration is unchanged
    assert "run_in_background" not in info.parameter_schema["properties"]
    dialects: tuple[tuple[Dialect, str], ...] = (("openai", "function"), ("anthropic", "input_schema"))
    for dialect, key in dialects:
        [declared] = [d for d in loop.declarations(dialect) if (d.get("name") or d[key]["name"]) == "report"]
        schema = declared[key]["parameters"] if dialect == "openai" else declared[key]
        assert "run_in_background" in schema["properties"]


def test_run_turn_runs_a_call_asking_for_it_as_a_task_and_the_tool_never_sees_the_argument(
        system: ActorSystem) -> None:
    system.register(report)
    loop = system.start_loop("s1")
    release.set()
    later, now, no = loop.run_turn([
        ToolCall("c1", "report", '{"topic": "rain", "run_in_background": true}'),
        ToolCall("c2", "report", '{"topic": "snow"}'),
        ToolCall("c3", "report", '{"topic": "hail", "run_in_background": false}'),
    ])
    assert later.ok and later.details is not None and "runs in the background as task" in later.content
    assert (now.content, no.content) == ("report on snow", "report on hail")
    done = loop.task_result(later.details["task_id"], timeout_s=WAIT_S)
    assert done.status == "completed" and done.result is not None and done.result.content == "report on rain"
    assert sorted(s["topic"] for s in seen) == ["hail", "rain", "snow"]  # the tool got its own arguments only
    [again] = loop.run_turn([ToolCall("c4", "report", '{"topic": "rain", "run_in_background": true}')])
    assert again.details is not None and "task_id" in again.details  # the same text chooses again (not cached)


@pytest.mark.parametrize("value", ['"yes"', "1", "null", '{"a": 1}'])
def test_a_run_in_background_that_is_not_a_boolean_is_invalid_arguments_naming_it(
        system: ActorSystem, value: str) -> None:
    system.register(report)
    loop = system.start_loop("s1")
    [refused] = loop.run_turn([ToolCall("c1", "report", f'{{"topic": "rain", "run_in_background": {value}}}')])
    assert refused.error_kind is ErrorKind.INVALID_ARGUMENTS
    assert "run_in_background" in refused.content and "true or false" in refused.content
    assert seen == [] and loop.tasks() == []


def test_the_tools_own_argument_of_that_name_reaches_it_and_chooses_nothing(system: ActorSystem) -> None:
    system.register(own_flag)
    loop = system.start_loop("s1")
    [result] = loop.run_turn([ToolCall("c1", "own_flag", '{"run_in_background": "yes"}')])
    assert result.ok and result.content == "mine: yes" and loop.tasks() == []


def test_a_host_that_forbids_the_choice_offers_no_argument_and_refuses_it_naming_it(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, tasks=TaskSettings(model_chooses=False)) as system:
        system.register(report)
        loop = system.start_loop("s1")
        assert "run_in_background" not in _schema(loop.declarations(), "report")["properties"]
        [refused] = loop.run_turn([ToolCall("c1", "report", '{"topic": "rain", "run_in_background": true}')])
        assert refused.error_kind is ErrorKind.INVALID_ARGUMENTS and "run_in_background" in refused.content
        assert "not allowed" in refused.content and seen == [] and loop.tasks() == []
        release.set()
        [chosen] = loop.run_turn([ToolCall("c2", "report", '{"topic": "rain"}')], background=True)  # the caller may
        assert chosen.details is not None and "task_id" in chosen.details


def test_bad_model_chooses_setting_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="model_chooses"):
        TaskSettings(model_chooses="yes")  # type: ignore[arg-type]


def test_the_agent_loops_model_chooses_background_and_gets_the_result_at_a_later_step(system: ActorSystem) -> None:
    system.register(report)
    loop = system.start_loop("s1")

    class ReleasingModel(ScriptedModel):  # the task ends once the model has had its acknowledgement
        def complete(self, messages: Any, tools: Any, **options: Any) -> Reply:
            reply = super().complete(messages, tools, **options)
            if len(self.requests) == 2:
                release.set()
            return reply

    model = ReleasingModel([
        Reply("", (ToolCall("c1", "report", '{"topic": "rain", "run_in_background": true}'),)),
        Reply("The report is being written."),
        Reply("Here is the report on rain."),
    ])
    events = list(loop.stream("Write a report on rain", model=model, wait_for_tasks=True))
    first_tools = model.requests[0][1]
    assert "run_in_background" in _schema(first_tools, "report")["properties"]
    acknowledged = model.requests[1][0][-1]  # the tool result the model got at its second step
    assert acknowledged.role == "tool" and "runs in the background as task" in acknowledged.text
    finished = [e for e in events if isinstance(e, TaskFinished)]
    assert len(finished) == 1 and finished[0].task.result is not None
    assert finished[0].task.result.content == "report on rain"
    delivered = model.requests[2][0][-1]
    assert delivered.role == "user" and "report on rain" in delivered.text
    assert seen[0]["topic"] == "rain"


@tool(background="optional", requires_approval=True)
def publish(topic: str) -> str:
    """Publish a report (a person approves each call first)."""
    return f"published {topic}"


@pytest.mark.parametrize("chosen_by", ["model", "caller"])
def test_an_optional_call_chosen_for_the_background_and_held_for_approval_runs_as_that_task(
        system: ActorSystem, chosen_by: str) -> None:
    system.register(publish)
    loop = system.start_loop("s1")
    flag = ', "run_in_background": true' if chosen_by == "model" else ""
    [held] = loop.run_turn([ToolCall("c1", "publish", f'{{"topic": "rain"{flag}}}')],
                           background=chosen_by == "caller")
    assert held.details is not None and "task_id" in held.details
    [info] = loop.tasks()
    assert info.status == "input_required" and [p.call_id for p in loop.pending()] == ["c1"]
    loop.approve("c1", decided_by="ada")
    done = loop.task_result(held.details["task_id"], timeout_s=WAIT_S)
    assert done.status == "completed" and done.result is not None and done.result.content == "published rain"


def test_an_mcp_client_passing_run_in_background_gets_invalid_arguments_and_no_task(system: ActorSystem) -> None:
    """An MCP client asks for a task its own way (the tasks extension, bounded per client):
    a served session's model choice is off, so the argument opens no task past those bounds."""
    import anyio

    from tests.test_mcp_protocol_eras import _http_client, _served_http

    system.register(report)
    release.set()
    with _served_http(system) as (url, _guard):
        async def main() -> tuple[Any, Any]:
            async with _http_client(url, "2026-07-28") as client:
                listed = await client.list_tools()
                called = await client.call_tool("report", {"topic": "x", "run_in_background": True})
                return listed, called

        listed, called = anyio.run(main)
    [served] = [t for t in listed.tools if t.name == "report"]
    assert "run_in_background" not in served.input_schema["properties"]
    assert called.is_error and "run_in_background is not allowed here" in called.content[0].text
    assert system.stats()["tasks"]["started"] == 0 and seen == []


def test_a_held_task_cancelled_is_a_call_no_approval_runs(system: ActorSystem) -> None:
    """Cancelling the task of a call that waits for its approval ends the call: it leaves
    ``loop.pending()``, and approving it afterwards is refused (it never runs as a task
    nobody follows)."""
    from rho_actors import ApprovalError

    system.register(publish)
    loop = system.start_loop("s1")
    [held] = loop.run_turn([ToolCall("c1", "publish", '{"topic": "rain"}')], background=True)
    task_id = held.details["task_id"]
    assert loop.cancel_task(task_id).status == "cancelled"
    assert [p.call_id for p in loop.pending()] == []
    with pytest.raises(ApprovalError):
        loop.approve("c1", decided_by="ada")
    assert [t.task_id for t in loop.tasks()] == [task_id]


def test_an_approval_that_comes_after_its_task_was_cancelled_runs_nothing(system: ActorSystem) -> None:
    """An approval that races the cancel of its call's task (claimed before the cancel's
    rejection could take the call) does not run the call as a new task nobody follows:
    its result is ``cancelled`` and the session has still its one task."""
    system.register(publish)
    loop = system.start_loop("s1")
    [held] = loop.run_turn([ToolCall("c1", "publish", '{"topic": "rain"}')], background=True)
    task_id = held.details["task_id"]
    system.task_registry.cancel("s1", loop.data_dir, task_id)  # the cancel, its rejection not there yet
    result = loop.approve("c1", decided_by="ada")
    assert result.error_kind == ErrorKind.CANCELLED, result
    assert [(t.task_id, t.status) for t in loop.tasks()] == [(task_id, "cancelled")]
