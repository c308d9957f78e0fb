"""The BFCL multi-turn replay: conversion, parsing, direct execution, and replays."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

pytest.importorskip("bfcl_eval", reason="needs pip install --no-deps bfcl-eval==2026.3.23 mpmath")
pytest.importorskip("mpmath")

from rho_actors.integrations import bfcl
from rho_actors.integrations.bfcl import (
    BfclEntry,
    BfclTool,
    CallParseError,
    bind_arguments,
    build_instances,
    convert_schema,
    execute_direct,
    format_result,
    load_entries,
    load_functions,
    parse_call,
    state_differences,
    withheld_for_turn,
)
from rho_actors.tool import Error

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------- conversion


@pytest.mark.parametrize(
    ("bfcl_type", "expected"),
    [
        ("dict", "object"),
        ("float", "number"),
        ("tuple", "array"),
        ("integer", "integer"),
        ("string", "string"),
        ("boolean", "boolean"),
        ("array", "array"),
        ("bool", "boolean"),
        ("list", "array"),
        ("double", "number"),
        ("long", "integer"),
    ],
)
def test_type_names_are_mapped(bfcl_type: str, expected: str) -> None:
    assert convert_schema({"type": bfcl_type}) == {"type": expected}


def test_any_means_no_type_constraint() -> None:
    converted = convert_schema({"type": "any", "description": "whatever"})
    assert converted == {"description": "whatever"}
    validator = Draft202012Validator(converted)
    for value in (1, "x", None, [1], {"a": 1}, 2.5, True):
        assert validator.is_valid(value)


def test_conversion_recurses_into_properties_and_items() -> None:
    raw = {
        "type": "dict",
        "properties": {
            "point": {"type": "tuple", "items": {"type": "float"}, "description": "x, y"},
            "meta": {
                "type": "dict",
                "properties": {
                    "tags": {"type": "array", "items": {"type": "dict", "properties": {"v": {"type": "any"}}}},
                },
            },
            "n": {"type": "integer", "default": 3},
        },
        "required": ["point"],
    }
    out = convert_schema(raw)
    assert out == {
        "type": "object",
        "properties": {
            "point": {"type": "array", "items": {"type": "number"}, "description": "x, y"},
            "meta": {
                "type": "object",
                "properties": {
                    "tags": {"type": "array", "items": {"type": "object", "properties": {"v": {}}}},
                },
            },
            "n": {"type": "integer", "default": 3},
        },
        "required": ["point"],
    }
    assert raw["type"] == "dict", "the input is not modified"
    Draft202012Validator.check_schema(out)


def test_tuple_items_list_becomes_prefix_items() -> None:
    out = convert_schema({"type": "tuple", "items": [{"type": "float"}, {"type": "string"}]})
    assert out == {"type": "array", "prefixItems": [{"type": "number"}, {"type": "string"}]}
    Draft202012Validator.check_schema(out)


def test_unknown_type_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown BFCL type name 'frobnicate'"):
        convert_schema({"type": "dict", "properties": {"x": {"type": "frobnicate"}}})


def test_every_multi_turn_declaration_passes_the_checks() -> None:
    from rho_actors.declarations.checks import NAME_PATTERN, check_declaration, read_declaration

    functions = load_functions()
    assert len(functions) == 128
    assert {f.class_name for f in functions.values()} == set(bfcl.MULTI_TURN_CLASSES)
    for tool in bfcl.make_tools(functions):
        schema = tool.parameter_schema()
        Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object"
        assert NAME_PATTERN.fullmatch(tool.name())
        assert "dict" not in json.dumps(schema).replace('"description"', "")  # no BFCL type names left
        info = check_declaration(read_declaration(tool))
        assert info.name == tool.name()
        assert info.concurrency == "exclusive"


# --------------------------------------------------------------------------- parsing


def test_parse_keyword_call() -> None:
    call = parse_call("cd(folder='document')")
    assert (call.name, call.positional, call.keywords) == ("cd", (), {"folder": "document"})


def test_positional_arguments_are_bound_by_signature() -> None:
    fs = bfcl.backend_class("GorillaFileSystem")()
    assert bind_arguments(fs.sort, parse_call("sort('final_report.pdf')")) == {"file_name": "final_report.pdf"}
    fs_call = parse_call("diff('a.txt', file_name2='b.txt')")
    assert bind_arguments(fs.diff, fs_call) == {"file_name1": "a.txt", "file_name2": "b.txt"}
    vehicle = bfcl.backend_class("VehicleControlAPI")()
    assert bind_arguments(vehicle.fillFuelTank, parse_call("fillFuelTank(15.0)")) == {"fuelAmount": 15.0}


def test_defaults_are_not_filled_in() -> None:
    fs = bfcl.backend_class("GorillaFileSystem")()
    assert bind_arguments(fs.ls, parse_call("ls()")) == {}


def test_nested_literals() -> None:
    call = parse_call("f(a=[1, -2.5, {'k': (True, None)}], b={'x': [[]]}, c=\"it's\")")
    assert call.keywords == {"a": [1, -2.5, {"k": (True, None)}], "b": {"x": [[]]}, "c": "it's"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x = 1", "not a function call"),
        ("1 + 2", "not a function call"),
        ("cd", "not a function call"),
        ("os.system('ls')", "not a plain function name"),
        ("f(x=g())", "not a literal"),
        ("f(__import__('os'))", "not a literal"),
        ("f(*a)", r"\*args"),
        ("f(**a)", r"\*\*kwargs"),
        ("f(", "syntax error"),
    ],
)
def test_not_a_call_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(CallParseError, match=message):
        parse_call(text)


def test_arguments_that_do_not_fit_are_an_error() -> None:
    fs = bfcl.backend_class("GorillaFileSystem")()
    with pytest.raises(CallParseError, match="do not fit"):
        bind_arguments(fs.cd, parse_call("cd('a', 'b')"))
    with pytest.raises(CallParseError, match="do not fit"):
        bind_arguments(fs.cd, parse_call("cd(nope='a')"))


# --------------------------------------------------------------------------- direct execution


class _Dummy:
    def text(self) -> str:
        return "plain"

    def mapping(self) -> dict[str, Any]:
        return {"a": 1, "b": [True, None]}

    def unserializable(self) -> dict[str, Any]:
        return {"s": {1, 2}}

    def number(self, x: float) -> float:
        return x * 2

    def nothing(self) -> None:
        return None

    def boom(self) -> None:
        raise ValueError("bad value")


def test_format_result_follows_bfcl() -> None:
    assert format_result("as is") == "as is"
    assert format_result({"a": 1}) == '{"a": 1}'
    assert format_result({"s": {1}}) == "{'s': {1}}"
    assert format_result([1, "a"]) == "[1, 'a']"
    assert format_result(None) == "None"
    assert format_result(2.5) == "2.5"


def test_execute_direct() -> None:
    d = _Dummy()
    assert execute_direct(d, "text", {}) == ("plain", False)
    assert execute_direct(d, "mapping", {}) == ('{"a": 1, "b": [true, null]}', False)
    assert execute_direct(d, "unserializable", {}) == ("{'s': {1, 2}}", False)
    assert execute_direct(d, "number", {"x": 2}) == ("4", False)
    assert execute_direct(d, "nothing", {}) == ("None", False)
    assert execute_direct(d, "boom", {}) == ("Error during execution: bad value", True)
    text, raised = execute_direct(d, "number", {"y": 1})
    assert raised and text.startswith("Error during execution: ") and "unexpected keyword" in text


def test_tool_run_uses_the_session_instance() -> None:
    functions = load_functions(["MathAPI"])
    tool = BfclTool(functions["add"])
    math_api = bfcl.backend_class("MathAPI")()
    assert tool.run({"a": 1, "b": 2}, {"deps": {"MathAPI": math_api}}) == '{"result": 3}'
    assert tool.concurrency() == "exclusive"
    missing = tool.run({"a": 1, "b": 2}, {"deps": {}})
    assert isinstance(missing, Error)


def test_tool_run_returns_bfcl_error_text_for_a_raise() -> None:
    functions = load_functions(["GorillaFileSystem"])
    tool = BfclTool(functions["cd"])
    deps = {"GorillaFileSystem": bfcl.backend_class("GorillaFileSystem")()}
    result = tool.run({"folder": "x", "extra": 1}, {"deps": deps})
    assert isinstance(result, Error)
    assert result.reason.startswith("Error during execution: ") and "extra" in result.reason


# --------------------------------------------------------------------------- sessions


def test_entries_and_fresh_instances() -> None:
    (entry,) = load_entries("base", limit=1)
    assert entry.id == "multi_turn_base_0"
    assert entry.involved_classes == ("TwitterAPI", "GorillaFileSystem")
    assert entry.ground_truth[0][0] == "cd(folder='document')"
    a, b = build_instances(entry), build_instances(entry)
    assert set(a) == {"TwitterAPI", "GorillaFileSystem"}
    for name in a:
        assert a[name] is not b[name]
        assert state_differences(a[name], b[name]) == []
    fs = a["GorillaFileSystem"]
    execute_direct(fs, "mkdir", {"dir_name": "new_dir"})
    assert state_differences(fs, b["GorillaFileSystem"]) == ["root"]


def test_long_context_and_stateless_classes() -> None:
    (entry,) = load_entries("long_context", limit=1)
    assert entry.long_context
    fs = build_instances(entry)["GorillaFileSystem"]
    assert fs.long_context is True  # type: ignore[attr-defined]
    stateless = BfclEntry("x", "base", ("MathAPI",), {"MathAPI": {"ignored": 1}}, ())
    assert set(build_instances(stateless)) == {"MathAPI"}


def test_load_entries_rejects_unknown_category_and_id() -> None:
    with pytest.raises(ValueError, match="unknown category"):
        load_entries("simple")
    with pytest.raises(ValueError, match="no entry nope"):
        load_entries("base", ids=["nope"])


def test_withheld_for_turn() -> None:
    functions = load_functions()
    (entry,) = load_entries("miss_func", limit=1)  # involves TwitterAPI, GorillaFileSystem; sort at turn 3; cp excluded
    assert entry.missed == {3: ("sort",)} and entry.excluded == ("cp",)
    other = {n for n, f in functions.items() if f.class_name not in entry.involved_classes}
    assert "add" in other and "cd" not in other
    for turn in range(3):
        assert withheld_for_turn(entry, turn, functions) == other | {"cp", "sort"}
    assert withheld_for_turn(entry, 3, functions) == other | {"cp"}
    assert withheld_for_turn(entry, 3, functions, withhold_excluded=False) == other


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> Any:
        if name == "bfcl_eval":
            raise ModuleNotFoundError("No module named 'bfcl_eval'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(bfcl.BfclUnavailableError, match=r"pip install --no-deps bfcl-eval==2026\.3\.23 mpmath"):
        load_entries("base", limit=1)


# --------------------------------------------------------------------------- replays


@pytest.mark.parametrize(
    ("category", "limit"),
    [("base", 3), ("miss_func", 3), ("miss_param", 3), ("long_context", 2)],
)
def test_replay_is_identical(category: str, limit: int) -> None:
    report = bfcl.replay(category=category, limit=limit)
    assert report.sessions == limit
    assert report.tools_registered == 128 and not report.declaration_failures
    assert report.calls > 0 and report.turns >= limit
    assert report.differences == []
    assert report.rejections == []
    assert report.identical == report.calls
    assert report.sessions_identical_state == limit
    assert report.state_differences == []
    assert report.exit_code == 0
    assert report.overhead_us["n"] == report.calls
    data = json.loads(report.to_json())
    assert data["identical"] == report.calls and data["exit_code"] == 0


def test_known_validation_rejection_is_listed() -> None:
    # Found by the full base replay: the ground truth passes ticket ids as strings to
    # close_ticket(ticket_id: integer); the runtime refuses the call, direct execution
    # closes the ticket, so TicketAPI's state parts (attributed to the rejection).
    report = bfcl.replay(category="base", ids=["multi_turn_base_173"])
    assert len(report.rejections) == 1
    (rejection,) = report.rejections
    assert rejection.entry_id == "multi_turn_base_173"
    assert rejection.call == "close_ticket(ticket_id='ticket_001')"
    assert rejection.kind == "invalid_arguments"
    assert "ticket_id" in rejection.reason and "integer" in rejection.reason
    assert report.differences == []
    assert report.identical == report.calls - 1
    assert [(d.class_name, d.attributed_to_rejection) for d in report.state_differences] == [("TicketAPI", True)]
    assert report.sessions_identical_state == 0
    assert report.exit_code == 0
    assert "multi_turn_base_173" in report.to_json()


def test_ground_truth_call_of_a_held_out_function_is_listed() -> None:
    # BFCL's miss_func_49 holds out tail until turn 3 but its ground truth calls it in turn 1.
    report = bfcl.replay(category="miss_func", ids=["multi_turn_miss_func_49"])
    assert [(r.turn, r.call, r.kind) for r in report.rejections] == [(1, "tail(file_name='file3.txt')", "withheld")]
    assert report.differences == [] and report.exit_code == 0


def test_report_renders() -> None:
    from rich.console import Console

    report = bfcl.replay(category="base", ids=["multi_turn_base_173"])
    console = Console(record=True, width=120)
    console.print(report.render())
    text = console.export_text()
    assert "sessions" in text and "close_ticket(ticket_id='ticket_001')" in text and "exit code 0" in text


def test_full_base_replay_has_only_the_known_rejection() -> None:
    report = bfcl.replay(category="base")
    assert (report.sessions, report.turns, report.calls) == (200, 734, 1142)
    assert [(r.entry_id, r.kind) for r in report.rejections] == [("multi_turn_base_173", "invalid_arguments")]
    assert report.differences == []
    assert report.identical == report.calls - 1
    assert report.sessions_identical_state == 199
    assert report.unexplained_state_differences == []
    assert report.exit_code == 0


def test_exit_code_rules() -> None:
    clean = bfcl.ReplayReport(category="base")
    assert clean.exit_code == 0
    attributed = bfcl.ReplayReport(category="base", state_differences=[bfcl.StateDifference("e", "C", ("a",), True)])
    assert attributed.exit_code == 0
    unexplained = bfcl.ReplayReport(category="base", state_differences=[bfcl.StateDifference("e", "C", ("a",), False)])
    assert unexplained.exit_code == 1
    differing = bfcl.ReplayReport(
        category="base", differences=[bfcl.Difference("e", 0, "f()", "a", "b", True, True, None)]
    )
    assert differing.exit_code == 1


def test_a_tampered_result_is_a_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = BfclTool.run

    def tampered(self: BfclTool, args: dict[str, Any], ctx: Any) -> Any:
        out = real_run(self, args, ctx)
        return out + " (tampered)" if self.name() == "mkdir" and isinstance(out, str) else out

    monkeypatch.setattr(BfclTool, "run", tampered)
    report = bfcl.replay(category="base", limit=1)  # multi_turn_base_0 calls mkdir(dir_name='temp') in turn 0
    assert [(d.entry_id, d.turn, d.call) for d in report.differences] == [
        ("multi_turn_base_0", 0, "mkdir(dir_name='temp')")
    ]
    (difference,) = report.differences
    assert difference.got == difference.expected + " (tampered)"
    assert report.exit_code == 1


# --------------------------------------------------------------------------- isolations


def test_replay_with_backends_in_server_processes_gives_the_same_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host's copy of the backends' call path is tampered with: a call that ran in the
    # host would differ; in process isolation every call runs in its session's server process.
    from rho_actors.integrations.bfcl import backends

    monkeypatch.setattr(backends, "execute_direct", lambda *args: ("tampered in the host", False))
    assert bfcl.replay(category="base", limit=1, isolation="thread").differences != []
    report = bfcl.replay(category="base", ids=["multi_turn_base_0", "multi_turn_base_173"], isolation="process")
    # the verdicts of thread isolation (test_known_validation_rejection_is_listed, test_replay_is_identical)
    assert report.differences == [] and report.exit_code == 0
    assert report.identical == report.calls - 1 and report.calls > 1
    assert [(r.entry_id, r.kind) for r in report.rejections] == [("multi_turn_base_173", "invalid_arguments")]
    assert [(d.class_name, d.attributed_to_rejection) for d in report.state_differences] == [("TicketAPI", True)]
    assert report.sessions_identical_state == 1
    data = json.loads(report.to_json())
    assert data["isolation"] == "process" and data["replay_sessions_wall_s"] > 0


def test_an_unknown_isolation_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown isolation 'gpu'; choose one of thread, process, ray"):
        bfcl.replay(category="base", limit=1, isolation="gpu")


def test_a_backends_server_that_cannot_start_makes_its_session_differ_not_the_replay_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rho_actors.integrations.bfcl import backends

    replay_module = importlib.import_module("rho_actors.integrations.bfcl.replay")  # the package's name is the function

    def broken(isolation: str, entry: Any) -> Any:
        raise RuntimeError("no room for the server")

    monkeypatch.setattr(replay_module, "server_start", broken)
    report = bfcl.replay(category="base", limit=2)
    assert report.sessions == 2 and report.identical == 0 and len(report.differences) == report.calls
    assert all("server 'bfcl:multi_turn_base_" in d.got and "is not running" in d.got for d in report.differences)
    assert report.unexplained_state_differences and report.exit_code == 1
    assert "its start failed (RuntimeError: no room for the server)" in report.state_differences[0].attributes[0]
    assert backends.server_name(bfcl.load_entries("base", 1)[0]) == "bfcl:multi_turn_base_0"
