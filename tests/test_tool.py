"""The tool contract (tool.py): is_tool, concurrency, timeout_ms, ErrorKind, ToolResult."""

from __future__ import annotations

import types
from typing import Any, cast

import pytest

from rho_actors import (
    DEFAULT_TIMEOUT_MS,
    ErrorKind,
    ToolResult,
    concurrency,
    default_timeout_ms,
    is_tool,
    timeout_ms,
)
from rho_actors.tool import REQUIRED_CALLBACKS, missing_callbacks

from .helpers import make_tool

StaticTool = make_tool("static", "ok", description="A tool made of staticmethods.")


class InstanceTool:
    def name(self) -> str:
        return "instance"

    def description(self) -> str:
        return "A tool instance."

    def parameter_schema(self) -> dict[str, Any]:
        return {"type": "object"}

    def run(self, args: dict[str, Any], ctx: Any) -> Any:
        return "ok"


def module_tool(**overrides: Any) -> types.ModuleType:
    mod: Any = types.ModuleType("a_tool_module")
    mod.name = lambda: "mod"
    mod.description = lambda: "A module tool."
    mod.parameter_schema = lambda: {"type": "object"}
    mod.run = lambda args, ctx: "ok"
    for key, value in overrides.items():
        setattr(mod, key, value)
    return cast(types.ModuleType, mod)


def tool_with(**callbacks: Any) -> Any:
    """An object with the required callbacks plus ``callbacks`` (each a zero-arg callable)."""
    obj = InstanceTool()
    for key, value in callbacks.items():
        setattr(obj, key, value)
    return obj


def boom() -> Any:
    raise RuntimeError("boom")


# --- is_tool ---------------------------------------------------------------------------


def test_is_tool_accepts_module_class_and_instance() -> None:
    assert is_tool(module_tool())
    assert is_tool(StaticTool)
    assert is_tool(InstanceTool())


@pytest.mark.parametrize("missing", REQUIRED_CALLBACKS)
def test_is_tool_refuses_a_module_missing_any_callback(missing: str) -> None:
    mod = module_tool()
    delattr(mod, missing)
    assert not is_tool(mod)
    assert missing_callbacks(mod) == [missing]


@pytest.mark.parametrize("missing", REQUIRED_CALLBACKS)
def test_is_tool_refuses_a_class_missing_any_callback(missing: str) -> None:
    attrs = {cb: staticmethod(lambda *a: None) for cb in REQUIRED_CALLBACKS if cb != missing}
    cls = type("Partial", (), attrs)
    assert not is_tool(cls)
    assert not is_tool(cls())
    assert missing_callbacks(cls) == [missing]


@pytest.mark.parametrize("missing", REQUIRED_CALLBACKS)
def test_a_non_callable_attribute_counts_as_missing(missing: str) -> None:
    mod = module_tool(**{missing: "not callable"})
    assert not is_tool(mod)
    assert missing_callbacks(mod) == [missing]


def test_is_tool_refuses_plain_values() -> None:
    assert not is_tool(None)
    assert not is_tool(42)
    assert not is_tool(object())
    assert missing_callbacks(object()) == list(REQUIRED_CALLBACKS)


# --- concurrency -----------------------------------------------------------------------


class MyStr(str):
    pass


def test_concurrency_exclusive_only_for_exactly_that_str() -> None:
    assert concurrency(tool_with(concurrency=lambda: "exclusive")) == "exclusive"
    assert concurrency(module_tool(concurrency=lambda: "exclusive")) == "exclusive"


@pytest.mark.parametrize(
    "answer",
    [MyStr("exclusive"), "Exclusive", "exclusive ", "parallel", "serial", "", None, 1, ["exclusive"], b"exclusive"],
)
def test_concurrency_anything_else_is_parallel(answer: Any) -> None:
    assert concurrency(tool_with(concurrency=lambda: answer)) == "parallel"


def test_concurrency_raise_and_absence_are_parallel() -> None:
    assert concurrency(tool_with(concurrency=boom)) == "parallel"
    assert concurrency(InstanceTool()) == "parallel"
    assert concurrency(StaticTool) == "parallel"
    assert concurrency(tool_with(concurrency="exclusive")) == "parallel"  # not callable


# --- timeout_ms ------------------------------------------------------------------------


def test_default_timeout_ms() -> None:
    assert DEFAULT_TIMEOUT_MS == 30_000
    assert default_timeout_ms() == 30_000


@pytest.mark.parametrize("value", [1, 250, 30_000, 24 * 3600 * 1000])
def test_timeout_ms_positive_int_is_used(value: int) -> None:
    assert timeout_ms(tool_with(timeout_ms=lambda: value)) == value


@pytest.mark.parametrize("value", [24 * 3600 * 1000 + 1, 10**13, 10**400])
def test_timeout_ms_past_a_day_is_cut_to_a_day(value: int) -> None:
    assert timeout_ms(tool_with(timeout_ms=lambda: value)) == 24 * 3600 * 1000


@pytest.mark.parametrize("value", [True, False, 0, -1, -5_000, 1.5, 1000.0, "1000", None, float("nan")])
def test_timeout_ms_bad_values_mean_the_default(value: Any) -> None:
    assert timeout_ms(tool_with(timeout_ms=lambda: value)) == 30_000


def test_timeout_ms_raise_and_absence_mean_the_default() -> None:
    assert timeout_ms(tool_with(timeout_ms=boom)) == 30_000
    assert timeout_ms(InstanceTool()) == 30_000
    assert timeout_ms(StaticTool) == 30_000
    assert timeout_ms(tool_with(timeout_ms=5)) == 30_000  # not callable


def test_timeout_ms_and_concurrency_of_a_module() -> None:
    mod = module_tool(timeout_ms=lambda: 1234, concurrency=lambda: "exclusive")
    assert timeout_ms(mod) == 1234
    assert concurrency(mod) == "exclusive"


# --- ErrorKind and ToolResult -----------------------------------------------------------


def test_error_kind_values() -> None:
    assert [k.value for k in ErrorKind] == [
        "invalid_json",
        "invalid_arguments",
        "unknown_tool",
        "withheld",
        "unavailable",
        "timeout",
        "tool_error",
        "raised",
        "exited",
        "crashed",
        "memory",
        "output_limit",
        "cancelled",
        "pending_approval",
        "deferred",
        "rejected",
        "approval_expired",
    ]
    assert ErrorKind("timeout") is ErrorKind.TIMEOUT
    assert ErrorKind.RAISED == "raised"  # type: ignore[comparison-overlap]  # a StrEnum


def test_error_kind_retryable() -> None:
    retryable = {k for k in ErrorKind if k.retryable}
    assert retryable == {ErrorKind.TIMEOUT, ErrorKind.CRASHED, ErrorKind.CANCELLED}
    for kind in (ErrorKind.INVALID_JSON, ErrorKind.INVALID_ARGUMENTS, ErrorKind.UNKNOWN_TOOL, ErrorKind.RAISED):
        assert kind.retryable is False


def test_tool_result_retryable() -> None:
    assert ToolResult("c1", "t", True, "fine").retryable is False
    assert ToolResult("c1", "t", False, "late", ErrorKind.TIMEOUT).retryable is True
    assert ToolResult("c1", "t", False, "died", ErrorKind.CRASHED).retryable is True
    assert ToolResult("c1", "t", False, "bad", ErrorKind.INVALID_ARGUMENTS).retryable is False
    assert ToolResult("c1", "t", False, "oops", ErrorKind.RAISED).retryable is False


def test_tool_result_defaults() -> None:
    result = ToolResult("c1", "t", True, "text")
    assert result.error_kind is None
    assert result.details is None
    assert result.images == ()
    assert result.duration_ms == 0.0
