"""Checked declarations (declarations.py): read_declaration, check_declaration, describe_origin."""

from __future__ import annotations

import inspect
import types
from typing import Any

import pytest

from rho_actors import DeclarationError, ToolInfo, check_declaration, read_declaration
from rho_actors.declarations.checks import DEFAULT_MAX_SCHEMA_DEPTH, describe_origin

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["a"],
}
TOP_LEVEL = 'parameter_schema: the top level must be an object schema ("type": "object")'


def raw(**overrides: Any) -> dict[str, Any]:
    """A valid raw declaration with ``overrides``."""
    base: dict[str, Any] = {"name": "adder", "description": "Add numbers.", "parameter_schema": SCHEMA}
    base.update(overrides)
    return base


def rejection(declaration: dict[str, Any], **kwargs: Any) -> DeclarationError:
    with pytest.raises(DeclarationError) as info:
        check_declaration(declaration, **kwargs)
    assert isinstance(info.value, ValueError)
    return info.value


class AddTool:
    @staticmethod
    def name() -> str:
        return "adder"

    @staticmethod
    def description() -> str:
        return "Add numbers."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return SCHEMA

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        return args["a"]


def a_function(args: dict[str, Any], ctx: Any) -> None:
    return None


def tool_with(**callbacks: Any) -> Any:
    """An AddTool instance with callbacks replaced (each a zero-arg callable)."""
    obj = AddTool()
    for key, value in callbacks.items():
        setattr(obj, key, value)
    return obj


def raising(exc: BaseException) -> Any:
    def callback() -> Any:
        raise exc

    return callback


def nest_schema(levels: int) -> dict[str, Any]:
    """An object schema whose dicts/lists nest exactly ``levels`` deep (the schema is level 1)."""
    value: Any = 1
    for _ in range(levels - 1):
        value = [value]
    return {"type": "object", "default": value} if levels > 1 else {"type": "object"}


# --- valid -----------------------------------------------------------------------------


def test_valid_declaration_gives_tool_info() -> None:
    info = check_declaration(raw(timeout_ms=5_000, concurrency="exclusive"))
    assert info == ToolInfo("adder", "Add numbers.", SCHEMA, 5_000, "exclusive")


def test_defaults_when_optional_callbacks_are_absent() -> None:
    info = check_declaration(raw())
    assert info.timeout_ms == 30_000
    assert info.concurrency == "parallel"


def test_schema_is_deep_copied() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    info = check_declaration(raw(parameter_schema=schema))
    schema["properties"]["a"]["type"] = "string"
    schema["properties"]["b"] = {}
    schema["type"] = "array"
    assert info.parameter_schema == {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_read_then_check_a_class_tool() -> None:
    declaration = read_declaration(AddTool)
    assert declaration == {"name": "adder", "description": "Add numbers.", "parameter_schema": SCHEMA}
    assert check_declaration(declaration).name == "adder"


def test_read_declaration_of_a_module() -> None:
    mod: Any = types.ModuleType("mod_tool")
    mod.name = lambda: "mod_tool"
    mod.description = lambda: "From a module."
    mod.parameter_schema = lambda: {"type": "object"}
    mod.timeout_ms = lambda: 100
    mod.run = lambda args, ctx: None
    info = check_declaration(read_declaration(mod))
    assert info == ToolInfo("mod_tool", "From a module.", {"type": "object"}, 100, "parallel")


def test_read_declaration_leaves_out_absent_callbacks() -> None:
    assert read_declaration(object()) == {}
    err = rejection(read_declaration(object()))
    assert str(err) == "name: missing; description: missing; parameter_schema: missing"
    assert err.name is None


# --- name ------------------------------------------------------------------------------


class MyStr(str):
    pass


@pytest.mark.parametrize("name", ["a", "A-z_0-9", "x" * 64, "get_weather", "1"])
def test_valid_names(name: str) -> None:
    assert check_declaration(raw(name=name)).name == name


@pytest.mark.parametrize("name", ["", "x" * 65, "my tool", "my.tool", "tööl", "tool\n", "a/b", "名前"])
def test_names_not_matching_the_pattern_are_refused(name: str) -> None:
    err = rejection(raw(name=name))
    assert str(err) == f"name: {name!r} does not match ^[A-Za-z0-9_-]{{1,64}}$"
    assert err.name is None


def test_long_name_is_shortened_in_the_message() -> None:
    err = rejection(raw(name="n" * 500))
    assert str(err) == f"name: {'n' * 80!r} does not match ^[A-Za-z0-9_-]{{1,64}}$"


@pytest.mark.parametrize(
    ("name", "type_name"), [(None, "NoneType"), (5, "int"), (b"adder", "bytes"), (MyStr("adder"), "MyStr")]
)
def test_non_str_name_is_refused(name: Any, type_name: str) -> None:
    err = rejection(raw(name=name))
    assert str(err) == f"name: expected str, got {type_name}"
    assert err.name is None


# --- description -----------------------------------------------------------------------


@pytest.mark.parametrize(("value", "type_name"), [(None, "NoneType"), (1, "int"), (MyStr("d"), "MyStr")])
def test_non_str_description_is_refused(value: Any, type_name: str) -> None:
    err = rejection(raw(description=value))
    assert str(err) == f"description: expected str, got {type_name}"
    assert err.name == "adder"


@pytest.mark.parametrize("value", ["", " ", "\n\t "])
def test_blank_description_is_refused(value: str) -> None:
    err = rejection(raw(description=value))
    assert str(err) == "description: empty"
    assert err.name == "adder"


# --- parameter_schema ------------------------------------------------------------------


@pytest.mark.parametrize(("value", "type_name"), [(None, "NoneType"), ([], "list"), ('{"type": "object"}', "str")])
def test_non_dict_schema_is_refused(value: Any, type_name: str) -> None:
    err = rejection(raw(parameter_schema=value))
    assert str(err) == f"parameter_schema: expected dict, got {type_name}"
    assert err.name == "adder"


def test_schema_with_non_str_key_is_refused() -> None:
    err = rejection(raw(parameter_schema={"type": "object", "properties": {1: {"type": "string"}}}))
    assert str(err) == "parameter_schema.properties: key 1 is not a string"


def test_schema_with_tuple_value_is_refused() -> None:
    err = rejection(raw(parameter_schema={"type": "object", "required": ("a",)}))
    assert str(err) == "parameter_schema.required: a tuple is not JSON data"


def test_schema_with_nan_is_refused() -> None:
    err = rejection(raw(parameter_schema={"type": "object", "properties": {"x": {"maximum": float("nan")}}}))
    assert str(err) == "parameter_schema.properties.x.maximum: nan is not JSON"


def test_invalid_json_schema_names_the_path() -> None:
    err = rejection(raw(parameter_schema={"type": "object", "properties": {"a": {"type": "nope"}}}))
    message = str(err)
    assert message.startswith("parameter_schema.properties.a.type: not a valid JSON Schema (Draft 2020-12): ")
    assert "'nope'" in message
    assert err.name == "adder"


def test_invalid_json_schema_keyword_value() -> None:
    err = rejection(raw(parameter_schema={"type": "object", "required": "a"}))
    assert str(err).startswith("parameter_schema.required: not a valid JSON Schema (Draft 2020-12): ")


@pytest.mark.parametrize(
    ("schema", "got"),
    [({"type": "array"}, "'array'"), ({}, "None"), ({"properties": {}}, "None"), ({"type": "string"}, "'string'")],
)
def test_top_level_must_be_an_object_schema(schema: dict[str, Any], got: str) -> None:
    err = rejection(raw(parameter_schema=schema))
    assert str(err) == f"{TOP_LEVEL}, got type {got}"


def test_schema_depth() -> None:
    assert DEFAULT_MAX_SCHEMA_DEPTH == 32
    assert check_declaration(raw(parameter_schema=nest_schema(32))).name == "adder"
    err = rejection(raw(parameter_schema=nest_schema(33)))
    assert "nested deeper than 32 levels" in str(err)
    assert str(err).startswith("parameter_schema.default")


def test_custom_schema_depth() -> None:
    assert check_declaration(raw(parameter_schema=nest_schema(3)), max_schema_depth=3).name == "adder"
    err = rejection(raw(parameter_schema=nest_schema(4)), max_schema_depth=3)
    assert "nested deeper than 3 levels" in str(err)


def test_hostile_schema_depth_is_refused_without_recursion_error() -> None:
    err = rejection(raw(parameter_schema=nest_schema(50_000)))
    assert "nested deeper than 32 levels" in str(err)


# --- callbacks that raise ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (RuntimeError("boom"), "RuntimeError: boom"),
        (ValueError(), "ValueError"),
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
    ],
)
def test_name_raising_is_contained_and_named(exc: BaseException, text: str) -> None:
    declaration = read_declaration(tool_with(name=raising(exc)))
    assert set(declaration) == {"name", "description", "parameter_schema"}
    err = rejection(declaration)
    assert str(err) == f"name() raised {text}"
    assert err.name is None


@pytest.mark.parametrize("callback", ["description", "parameter_schema"])
def test_other_required_callbacks_raising(callback: str) -> None:
    err = rejection(read_declaration(tool_with(**{callback: raising(SystemExit("bye"))})))
    assert str(err) == f"{callback}() raised SystemExit: bye"
    assert err.name == "adder"


def test_exception_whose_str_raises() -> None:
    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    err = rejection(read_declaration(tool_with(description=raising(Nasty()))))
    assert str(err) == "description() raised Nasty: <str() raised>"


def test_optional_callbacks_raising_mean_defaults() -> None:
    tool = tool_with(timeout_ms=raising(KeyboardInterrupt()), concurrency=raising(RuntimeError("x")))
    info = check_declaration(read_declaration(tool))
    assert info.timeout_ms == 30_000
    assert info.concurrency == "parallel"


@pytest.mark.parametrize("timeout", [0, -1, True, 1.5, "100", None])
def test_bad_timeout_means_the_default(timeout: Any) -> None:
    assert check_declaration(raw(timeout_ms=timeout)).timeout_ms == 30_000


@pytest.mark.parametrize("value", ["Exclusive", "serial", MyStr("exclusive"), None, 1])
def test_bad_concurrency_means_the_default(value: Any) -> None:
    assert check_declaration(raw(concurrency=value)).concurrency == "parallel"


def test_every_problem_is_listed_in_one_message() -> None:
    tool = tool_with(
        name=lambda: "bad name",
        description=lambda: "  ",
        parameter_schema=lambda: {"type": "array"},
        timeout_ms=lambda: -5,
    )
    err = rejection(read_declaration(tool))
    assert str(err) == (
        f"name: 'bad name' does not match ^[A-Za-z0-9_-]{{1,64}}$; description: empty; {TOP_LEVEL}, got type 'array'"
    )
    assert err.name is None


def test_error_name_is_the_valid_name_when_other_parts_fail() -> None:
    err = rejection(raw(description="", parameter_schema=None))
    assert err.name == "adder"
    assert str(err) == "description: empty; parameter_schema: expected dict, got NoneType"


# --- describe_origin -------------------------------------------------------------------


def test_describe_origin_of_a_class() -> None:
    line = inspect.getsourcelines(AddTool)[1]
    assert describe_origin(AddTool) == f"{__name__}.AddTool ({__file__}:{line})"


def test_describe_origin_of_a_function() -> None:
    line = inspect.getsourcelines(a_function)[1]
    assert describe_origin(a_function) == f"{__name__}.a_function ({__file__}:{line})"


def test_describe_origin_of_an_instance() -> None:
    line = inspect.getsourcelines(AddTool)[1]
    assert describe_origin(AddTool()) == f"{__name__}.AddTool instance ({__file__}:{line})"


def test_describe_origin_of_a_module_without_source() -> None:
    mod = types.ModuleType("made_up")
    assert describe_origin(mod) == "made_up"
