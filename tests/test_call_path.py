"""DESIGN §4 step 1-2 and 4: decoding, lookup, validation, ordering and concurrency of a turn."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest

from rho_actors import ActorSystem, DuplicateToolError, ErrorKind, ToolCall, tool

from .conftest import WAIT_S, Recorder, slack
from .helpers import make_tool


class Counter:
    """Counts how often each tool body ran."""

    def __init__(self) -> None:
        self.runs: list[str] = []


ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "times": {"type": "integer", "minimum": 1}},
    "required": ["text"],
    "additionalProperties": False,
}


def make_echo(counter: Counter, name: str = "echo", concurrency: str = "parallel") -> Any:
    def run(args: dict[str, Any], ctx: Any) -> str:
        counter.runs.append(args["text"])
        return str(args["text"] * args.get("times", 1))

    return make_tool(name, run, description="Echo the text back.", schema=ECHO_SCHEMA, concurrency=concurrency)


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def loop(system: ActorSystem, counter: Counter) -> Any:
    system.register(make_echo(counter))
    return system.start_loop("s1")


def one(loop: Any, arguments: Any, name: str = "echo") -> Any:
    [result] = loop.run_turn([ToolCall("c1", name, arguments)])
    return result


def test_a_valid_call_runs_and_returns_text(loop: Any, counter: Counter) -> None:
    result = one(loop, '{"text": "ab", "times": 2}')
    assert (result.ok, result.content, result.error_kind, result.call_id, result.name) == (
        True, "abab", None, "c1", "echo",
    )
    assert counter.runs == ["ab"]


def test_arguments_may_be_a_decoded_mapping(loop: Any) -> None:
    assert one(loop, {"text": "x"}).content == "x"


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ("[1, 2]", "must be a JSON object, got array"),
        ('"text"', "must be a JSON object, got string"),
        ("null", "must be a JSON object, got null"),
        ('{"text": "a"}{"text": "b"}', "Extra data"),
        ('{"text": "a"} trailing', "Extra data"),
        ('{"text": "a",}', "not valid JSON"),
        ("", "arguments were empty: send a JSON object, {}"),
        ('{"text": NaN}', "NaN is not JSON"),
        ('{"text": "a", "text": "b"}', "duplicate key 'text'"),
        ('{"text": "\\ud800"}', "lone surrogate"),
        ('{"text": "a", "x": ' + "[" * 100 + "]" * 100 + "}", "nested deeper than 64 levels"),
        ("[" * 200_000 + "]" * 200_000, "not valid JSON"),
    ],
)
def test_bad_json_is_refused_and_the_tool_never_runs(
    loop: Any, counter: Counter, arguments: str, fragment: str
) -> None:
    result = one(loop, arguments)
    assert result.error_kind is ErrorKind.INVALID_JSON
    assert fragment in result.content
    assert "'echo'" in result.content
    assert not result.ok and counter.runs == []


def test_validation_lists_every_violation_with_its_path(loop: Any, counter: Counter) -> None:
    result = one(loop, '{"times": 0, "extra": true}')
    assert result.error_kind is ErrorKind.INVALID_ARGUMENTS
    assert '$: "text" is a required property' in result.content
    assert "$.times: 0 fails minimum 1" in result.content
    assert '$: unexpected properties: "extra"' in result.content
    assert counter.runs == []


def test_unknown_withheld_and_unavailable_are_distinct(system: ActorSystem, counter: Counter) -> None:
    system.register(make_echo(counter))
    system.register(make_echo(counter, "gone"))
    loop = system.start_loop("s1", withheld=["gone"])
    assert system.unregister("gone") is True
    loop.set_withheld(["echo"])
    results = loop.run_turn([
        ToolCall("a", "nope", "{}"),
        ToolCall("b", "echo", '{"text": "x"}'),
        ToolCall("c", "gone", '{"text": "x"}'),
    ])
    assert [r.error_kind for r in results] == [ErrorKind.UNKNOWN_TOOL, ErrorKind.WITHHELD, ErrorKind.UNAVAILABLE]
    assert "unknown tool 'nope'" in results[0].content
    assert "'gone' was unregistered" in results[2].content
    assert counter.runs == []


def test_an_unregistered_tool_s_text_is_the_reason_given_and_can_be_replaced(system: ActorSystem,
                                                                            counter: Counter) -> None:
    echo = make_echo(counter)
    system.register(echo)
    assert system.unregister(echo, "tool 'echo' cannot be called: its server is restarting") is True
    loop = system.start_loop("s1")
    [restarting] = loop.run_turn([ToolCall("a", "echo", '{"text": "x"}')])
    assert restarting.error_kind is ErrorKind.UNAVAILABLE
    assert restarting.content == "tool 'echo' cannot be called: its server is restarting"
    # a name removed before, not registered again: only its text changes (nothing is removed)
    assert system.set_removed_reason("echo", "tool 'echo' cannot be called: its server was given up") is True
    [given_up] = loop.run_turn([ToolCall("b", "echo", '{"text": "x"}')])
    assert given_up.content == "tool 'echo' cannot be called: its server was given up"
    assert system.set_removed_reason("never", "not a tool") is False  # a name never registered gets no text
    [unknown] = loop.run_turn([ToolCall("c", "never", "{}")])
    assert unknown.error_kind is ErrorKind.UNKNOWN_TOOL
    system.register(make_echo(counter))  # registered again: offered, its old text gone
    assert system.set_removed_reason("echo", "given up") is False  # a registered tool is left as it is
    [back] = loop.run_turn([ToolCall("d", "echo", '{"text": "x"}')])
    assert back.ok and counter.runs == ["x"]


def test_unknown_tool_message_lists_what_is_offered(loop: Any) -> None:
    result = one(loop, "{}", name="ech")
    assert result.error_kind is ErrorKind.UNKNOWN_TOOL
    assert "the tools offered are: echo" in result.content


def test_a_tool_whose_declaration_failed_is_unavailable_and_logged_once(
    system: ActorSystem, logs: list[str]
) -> None:
    class Bad:
        @staticmethod
        def name() -> str:
            return "bad"

        @staticmethod
        def description() -> str:
            return "Bad schema."

        @staticmethod
        def parameter_schema() -> dict[str, Any]:
            return {"type": "array"}

        @staticmethod
        def run(args: Any, ctx: Any) -> str:
            raise AssertionError("never runs")

    registration = system.register(Bad)
    assert registration.info is None and not registration.offered
    assert registration.reason is not None and "top level must be an object schema" in registration.reason
    loop = system.start_loop("s1")
    assert loop.offered() == []
    for _ in range(3):
        result = one(loop, "{}", name="bad")
        assert result.error_kind is ErrorKind.UNAVAILABLE
        assert "declaration failed its checks" in result.content
    assert sum("left out" in m and "Bad" in m for m in logs) == 1


def test_duplicate_names_are_refused_naming_both_origins(system: ActorSystem, counter: Counter) -> None:
    first = make_echo(counter)
    system.register(first)
    system.register(first)  # the same tool again is a re-registration, not a duplicate
    with pytest.raises(DuplicateToolError) as err:
        system.register(make_echo(counter), origin="plugin second.py")
    assert "'echo' is already registered by" in str(err.value)
    assert "test_call_path" in str(err.value) and "refused plugin second.py" in str(err.value)
    assert [info.name for info in system.tools()] == ["echo"]


def test_registering_a_non_tool_names_the_missing_callbacks(system: ActorSystem) -> None:
    with pytest.raises(TypeError, match="lacks parameter_schema, run"):
        system.register(types.SimpleNamespace(name=lambda: "x", description=lambda: "y"))


def test_a_module_can_be_a_tool(system: ActorSystem) -> None:
    module = types.ModuleType("shout")
    module.name = lambda: "shout"  # type: ignore[attr-defined]
    module.description = lambda: "Upper-case the text."  # type: ignore[attr-defined]
    module.parameter_schema = lambda: {"type": "object", "properties": {"t": {"type": "string"}}}  # type: ignore[attr-defined]
    module.run = lambda args, ctx: args["t"].upper()  # type: ignore[attr-defined]
    assert system.register(module).offered
    assert one(system.start_loop(), '{"t": "hi"}', name="shout").content == "HI"


def test_results_come_back_in_the_models_order_one_per_call(loop: Any) -> None:
    calls = [ToolCall(f"c{i}", "echo" if i % 3 else "nope", f'{{"text": "{i}"}}') for i in range(30)]
    calls.append(ToolCall("c1", "echo", '{"text": "dup"}'))  # a repeated id still gets its own result
    results = loop.run_turn(calls)
    assert [r.call_id for r in results] == [c.id for c in calls]
    for i, r in enumerate(results[:30]):
        assert r.ok == bool(i % 3)
        assert r.content == str(i) if i % 3 else r.error_kind is ErrorKind.UNKNOWN_TOOL
    assert results[30].content == "dup"


def test_an_empty_turn_has_no_results(loop: Any) -> None:
    assert loop.run_turn([]) == []


def test_a_turn_rejects_items_that_are_not_tool_calls(loop: Any) -> None:
    with pytest.raises(TypeError, match="ToolCall"):
        loop.run_turn([{"id": "x", "name": "echo"}])


def test_parallel_calls_run_alongside_each_other(system: ActorSystem) -> None:
    barrier = threading.Barrier(4, timeout=WAIT_S)

    @tool
    def meet() -> str:
        """Wait for three other calls."""
        barrier.wait()
        return "met"

    system.register(meet)
    results = system.start_loop().run_turn([ToolCall(str(i), "meet", "{}") for i in range(4)])
    assert [r.content for r in results] == ["met"] * 4


def test_a_turn_with_an_exclusive_call_runs_one_at_a_time_in_order(system: ActorSystem) -> None:
    active: list[str] = []
    log: list[str] = []
    overlap = threading.Event()
    lock = threading.Lock()

    def body(label: str) -> str:
        with lock:
            if active:
                overlap.set()
            active.append(label)
            log.append(label)
        threading.Event().wait(0.02)  # give any wrongly concurrent call time to overlap
        with lock:
            active.remove(label)
        return label

    @tool(concurrency="exclusive")
    def screen(label: str) -> str:
        """Touch the one screen."""
        return body(label)

    @tool
    def read(label: str) -> str:
        """Read something."""
        return body(label)

    system.register(screen)
    system.register(read)
    calls = [ToolCall(str(i), "read" if i % 2 else "screen", f'{{"label": "L{i}"}}') for i in range(6)]
    results = system.start_loop().run_turn(calls)
    assert [r.content for r in results] == [f"L{i}" for i in range(6)]
    assert log == [f"L{i}" for i in range(6)]
    assert not overlap.is_set()


def _step(name: str, takes_s: float) -> Any:
    @tool(name=name, concurrency="exclusive", timeout_ms=int(2 * takes_s * 1000))
    def step() -> str:
        """Take a while."""
        threading.Event().wait(takes_s)
        return "ok"

    return step


def test_an_exclusive_calls_deadline_counts_from_its_own_start(system: ActorSystem) -> None:
    """Each step takes ``takes_s``, its deadline twice that: three steps in a row pass one
    deadline, each within its own. A step's thread late to wake on a loaded machine can
    overrun its own deadline: then again with longer steps (from the turn's start, the
    third step would still pass its deadline at any length)."""
    for scale in (0.25, 1.0, 4.0):
        system.register(_step(f"step_{round(scale * 100)}", slack(scale)))
        results = system.start_loop().run_turn([ToolCall(str(i), f"step_{round(scale * 100)}", "{}") for i in range(3)])
        if all(r.error_kind is not ErrorKind.TIMEOUT for r in results):
            break
    assert [r.content for r in results] == ["ok", "ok", "ok"]


def test_refused_calls_emit_only_finished_events(system: ActorSystem, counter: Counter) -> None:
    recorder = Recorder()
    system.subscribe(recorder)
    system.register(make_echo(counter))
    system.start_loop("ev").run_turn([ToolCall("good", "echo", '{"text": "x"}'), ToolCall("bad", "echo", "[]")])
    assert recorder.kinds("good") == ["started", "finished"]
    assert recorder.kinds("bad") == ["finished"]
    finished = {e.call_id: e for e in recorder.events if e.kind == "finished"}
    assert finished["good"].outcome == "ok" and finished["bad"].outcome == "invalid_json"
    assert finished["good"].session_id == "ev" and finished["good"].tool == "echo"


def test_withheld_changes_what_is_offered(system: ActorSystem, counter: Counter) -> None:
    system.register(make_echo(counter))
    system.register(make_echo(counter, "other"))
    loop = system.start_loop(withheld=["other"])
    assert [i.name for i in loop.offered()] == ["echo"]
    loop.set_withheld([])
    assert [d["function"]["name"] for d in loop.declarations("openai")] == ["echo", "other"]
    assert [d["name"] for d in loop.declarations("anthropic")] == ["echo", "other"]
    assert "inputSchema" in loop.declarations("mcp")[0]
