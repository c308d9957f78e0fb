"""Provider dialects (formats.py): a checked declaration in each provider's shape."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rho_actors import DIALECTS, ToolInfo, declaration, to_dialect

DESC = "Current weather for a city."
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name."}},
    "required": ["city"],
}


class Weather:
    @staticmethod
    def name() -> str:
        return "get_weather"

    @staticmethod
    def description() -> str:
        return "Current weather for a city."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name."}},
            "required": ["city"],
        }

    @staticmethod
    def timeout_ms() -> int:
        return 2_500

    @staticmethod
    def concurrency() -> str:
        return "exclusive"

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return "sunny"


class BadName(Weather):
    @staticmethod
    def name() -> str:
        return "get weather"


class RaisingSchema(Weather):
    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        raise SystemExit(1)


INFO = ToolInfo("get_weather", "Current weather for a city.", copy.deepcopy(SCHEMA), 2_500, "exclusive")

EXPECTED: dict[str, dict[str, Any]] = {
    "openai": {
        "type": "function",
        "function": {"name": "get_weather", "description": DESC, "parameters": copy.deepcopy(SCHEMA)},
    },
    "anthropic": {"name": "get_weather", "description": DESC, "input_schema": copy.deepcopy(SCHEMA)},
    "mcp": {"name": "get_weather", "description": DESC, "inputSchema": copy.deepcopy(SCHEMA)},
    "neutral": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": copy.deepcopy(SCHEMA),
        "timeout_ms": 2_500,
        "concurrency": "exclusive",
    },
}


def test_dialects() -> None:
    assert DIALECTS == ("openai", "anthropic", "mcp", "neutral")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_shape_from_a_tool(dialect: Any) -> None:
    assert declaration(Weather, dialect) == EXPECTED[dialect]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_shape_from_tool_info(dialect: Any) -> None:
    assert declaration(INFO, dialect) == EXPECTED[dialect]
    assert to_dialect(INFO, dialect) == EXPECTED[dialect]


def test_default_dialect_is_neutral() -> None:
    assert declaration(Weather) == EXPECTED["neutral"]


def test_neutral_dialect_gives_defaults_for_a_tool_without_options() -> None:
    info = ToolInfo("t", "d", {"type": "object"})
    assert declaration(info) == {
        "name": "t",
        "description": "d",
        "parameters": {"type": "object"},
        "timeout_ms": 30_000,
        "concurrency": "parallel",
    }


@pytest.mark.parametrize("dialect", ["gemini", "OpenAI", "", None])
def test_unknown_dialect_is_a_value_error(dialect: Any) -> None:
    with pytest.raises(ValueError, match=r"unknown dialect .*; expected one of openai, anthropic, mcp, neutral"):
        declaration(Weather, dialect)
    with pytest.raises(ValueError, match=r"unknown dialect"):
        to_dialect(INFO, dialect)


def test_unknown_dialect_is_refused_even_for_a_failing_tool() -> None:
    with pytest.raises(ValueError, match=r"unknown dialect 'gemini'"):
        declaration(BadName, "gemini")  # type: ignore[arg-type]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_failing_tool_has_no_declaration(dialect: Any) -> None:
    assert declaration(BadName, dialect) is None
    assert declaration(RaisingSchema, dialect) is None
    assert declaration(object(), dialect) is None


@pytest.mark.parametrize("dialect", DIALECTS)
def test_returned_dicts_are_copies(dialect: Any) -> None:
    first = declaration(INFO, dialect)
    assert first is not None
    schema = (
        first["function"]["parameters"]
        if dialect == "openai"
        else next(v for k, v in first.items() if k in ("input_schema", "inputSchema", "parameters"))
    )
    schema["properties"]["city"]["type"] = "integer"
    schema["required"].append("x")
    first["name"] = "changed"
    assert declaration(INFO, dialect) == EXPECTED[dialect]
    assert INFO.parameter_schema == SCHEMA
    assert to_dialect(INFO, dialect) == EXPECTED[dialect]


def test_copies_from_a_tool_do_not_touch_the_tool() -> None:
    first = declaration(Weather, "anthropic")
    assert first is not None
    first["input_schema"]["properties"].clear()
    assert declaration(Weather, "anthropic") == EXPECTED["anthropic"]
