"""@tool (function_tool.py): a typed function as a tool."""

import asyncio
import datetime
import inspect
from collections.abc import Mapping
from typing import Annotated, Any

import pydantic
import pytest

from rho_actors import FunctionTool, ToolInfo, check_declaration, declaration, is_tool, read_declaration, tool


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Returns their sum.
    """
    return a + b


@tool(name="weather_now", description="Weather, now.", timeout_ms=2_000, concurrency="exclusive")
def weather(city: Annotated[str, pydantic.Field(description="City name.")], units: str = "metric") -> str:
    """Ignored docstring."""
    return f"{city}:{units}"


@tool
def when_is(when: datetime.datetime, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """Echo the type of when and the context."""
    return {"type": type(when), "when": when, "ctx": ctx}


@tool
async def slow_add(a: int, b: int) -> int:
    """Add, asynchronously."""
    await asyncio.sleep(0)
    return a + b


def test_bare_decorator_makes_a_tool() -> None:
    assert isinstance(add, FunctionTool)
    assert is_tool(add)
    assert add.name() == "add"
    assert add.timeout_ms() == 30_000
    assert add.concurrency() == "parallel"


def test_decorator_with_options() -> None:
    assert is_tool(weather)
    assert weather.name() == "weather_now"
    assert weather.description() == "Weather, now."
    assert weather.timeout_ms() == 2_000
    assert weather.concurrency() == "exclusive"


def test_description_is_the_cleaned_docstring() -> None:
    assert add.description() == "Add two integers.\n\nReturns their sum."


def test_schema_from_the_signature() -> None:
    schema = add.parameter_schema()
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["a"]
    assert schema["properties"]["a"]["type"] == "integer"
    assert schema["properties"]["b"]["type"] == "integer"
    assert schema["properties"]["b"]["default"] == 0
    assert "title" not in schema


def test_annotated_field_description_is_in_the_schema() -> None:
    schema = weather.parameter_schema()
    assert schema["properties"]["city"]["description"] == "City name."
    assert schema["properties"]["city"]["type"] == "string"
    assert schema["required"] == ["city"]
    assert schema["properties"]["units"]["default"] == "metric"


def test_ctx_is_excluded_from_the_schema_and_receives_ctx() -> None:
    schema = when_is.parameter_schema()
    assert set(schema["properties"]) == {"when"}
    assert schema["required"] == ["when"]
    ctx = {"session_id": "s", "call_id": "c"}
    result = when_is.run({"when": "2026-01-02T03:04:05"}, ctx)
    assert result["ctx"] is ctx


def test_run_converts_types() -> None:
    result = when_is.run({"when": "2026-01-02T03:04:05"}, {})
    assert result["type"] is datetime.datetime
    assert result["when"] == datetime.datetime(2026, 1, 2, 3, 4, 5)
    assert when_is.parameter_schema()["properties"]["when"]["format"] == "date-time"


def test_run_uses_defaults_and_ignores_ctx_when_not_wanted() -> None:
    assert add.run({"a": 2}, {"session_id": "s"}) == 2
    assert add.run({"a": 2, "b": 3}, {}) == 5
    assert weather.run({"city": "Oslo"}, {}) == "Oslo:metric"


def test_run_refuses_arguments_the_types_refuse() -> None:
    with pytest.raises(pydantic.ValidationError):
        add.run({"a": "not a number"}, {})
    with pytest.raises(pydantic.ValidationError):
        add.run({"a": 1, "c": 2}, {})
    with pytest.raises(pydantic.ValidationError):
        add.run({}, {})


def test_async_run_returns_a_coroutine_giving_the_value() -> None:
    coro = slow_add.run({"a": 2, "b": 5}, {})
    assert inspect.iscoroutine(coro)
    assert asyncio.run(coro) == 7
    assert slow_add.parameter_schema()["required"] == ["a", "b"]


def test_decorated_object_is_still_callable_like_the_function() -> None:
    assert add(1, 2) == 3
    assert add(a=4) == 4
    assert weather("Rome", units="imperial") == "Rome:imperial"
    assert asyncio.run(slow_add(1, 1)) == 2
    assert add.__name__ == "add"
    assert add.__doc__ is not None and add.__doc__.startswith("Add two integers.")
    assert add.func.__name__ == "add"
    assert "add" in repr(add)


def test_var_positional_is_refused() -> None:
    def f(*args: int) -> None:
        """Doc."""

    with pytest.raises(TypeError, match=r"@tool f: parameter 'args' must be a plain keyword parameter"):
        tool(f)


def test_var_keyword_is_refused() -> None:
    def g(a: int, **kwargs: int) -> None:
        """Doc."""

    with pytest.raises(TypeError, match=r"@tool g: parameter 'kwargs' must be a plain keyword parameter"):
        tool(g)


def test_positional_only_is_refused() -> None:
    def h(a: int, /, b: int) -> None:
        """Doc."""

    with pytest.raises(TypeError, match=r"@tool h: parameter 'a' must be a plain keyword parameter"):
        tool(h)
    with pytest.raises(TypeError, match=r"@tool named: parameter 'a'"):
        tool(name="named")(h)


def test_keyword_only_is_allowed() -> None:
    @tool
    def k(*, a: int) -> int:
        """Doc."""
        return a

    assert k.run({"a": 3}, {}) == 3
    assert k.parameter_schema()["required"] == ["a"]


@pytest.mark.parametrize("t", [add, weather, when_is, slow_add])
def test_tool_passes_its_declaration_checks(t: FunctionTool) -> None:
    info = check_declaration(read_declaration(t))
    assert info == ToolInfo(t.name(), t.description(), t.parameter_schema(), t.timeout_ms(), t.concurrency())
    assert declaration(t, "openai") is not None


def test_tool_without_docstring_is_refused_at_decoration() -> None:
    def nodoc(a: int) -> int:
        return a

    with pytest.raises(TypeError, match=r"@tool nodoc: the function has no docstring.*pass description="):
        tool(nodoc)
    assert tool(description="Echo a.")(nodoc).description() == "Echo a."


def test_args_sections_become_parameter_descriptions() -> None:
    @tool
    def google(city: str, days: int = 3) -> str:
        """Forecast the weather.

        Args:
            city: The city's name.
            days: How many days ahead.
        """
        return city

    @tool
    def numpy_style(city: str) -> str:
        """Forecast the weather.

        Parameters
        ----------
        city : str
            The city's name.
        """
        return city

    assert google.description() == "Forecast the weather."
    props = google.parameter_schema()["properties"]
    assert props["city"]["description"] == "The city's name."
    assert props["days"]["description"] == "How many days ahead." and props["days"]["default"] == 3
    assert numpy_style.parameter_schema()["properties"]["city"]["description"] == "The city's name."
    assert numpy_style.description() == "Forecast the weather."
    assert declaration(google) is not None


def test_a_tool_without_parameters_runs_with_no_arguments_and_refuses_any() -> None:
    """A tool of no parameter is called with none for ``{}`` (a method bound to its
    instance, a function with only the call's context gets it); any argument is refused
    as pydantic refuses it."""

    @tool
    def now() -> str:
        """The time."""
        return "noon"

    @tool
    def session(ctx: Mapping[str, Any]) -> str:
        """The session."""
        return str(ctx["session_id"])

    class Clock:
        def __init__(self) -> None:
            self.zone = "UTC"

        @tool
        def zone_name(self) -> str:
            """The zone."""
            return self.zone

    assert now.run({}, {}) == "noon"
    assert session.run({}, {"session_id": "s1"}) == "s1"
    assert Clock().zone_name.run({}, {}) == "UTC"
    for t in (now, session, Clock().zone_name):
        with pytest.raises(pydantic.ValidationError):
            t.run({"extra": 1}, {"session_id": "s1"})


def test_methods_leave_self_and_cls_out() -> None:
    class Weather:
        def __init__(self) -> None:
            self.unit = "C"

        def forecast(self, city: str) -> str:
            """Forecast."""
            return city

        @tool
        def temperature(self, city: str) -> str:
            """Temperature."""
            return f"20 {self.unit} in {city}"

        @classmethod
        def cities(cls, prefix: str) -> list[str]:
            """Cities."""
            return [prefix]

    assert list(tool(Weather().forecast).parameter_schema()["properties"]) == ["city"]
    assert list(Weather.temperature.parameter_schema()["properties"]) == ["city"]
    assert Weather().temperature.run({"city": "Oslo"}, {}) == "20 C in Oslo"
    assert list(tool(Weather.cities).parameter_schema()["properties"]) == ["prefix"]
    assert tool(Weather().forecast).run({"city": "Oslo"}, {}) == "Oslo"


def test_selftest_is_taken() -> None:
    def check() -> None:
        return None

    @tool(selftest=check)
    def echo(a: int) -> int:
        """Echo."""
        return a

    assert echo.selftest is check
    with pytest.raises(TypeError, match="selftest must be a function"):
        tool(selftest=5)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"timeout_ms": 2.5e3}, TypeError, r"timeout_ms must be an int of milliseconds, got float 2500\.0"),
        ({"timeout_ms": True}, TypeError, "timeout_ms must be an int of milliseconds, got bool"),
        ({"timeout_ms": 0}, ValueError, "timeout_ms must be more than 0 milliseconds, got 0"),
        ({"timeout_ms": -5}, ValueError, "more than 0"),
        ({"concurrency": "serial"}, ValueError, "concurrency must be 'parallel' or 'exclusive', got 'serial'"),
    ],
)
def test_bad_options_are_refused_at_decoration(options: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        tool(**options)


def test_ctx_annotation_does_not_affect_other_parameters() -> None:
    # A ctx annotated with a name only imported under TYPE_CHECKING (a common pattern) must
    # not cost the other parameters their types: "a datetime parameter gets a datetime".
    @tool
    def late(when: "datetime.datetime", ctx: "NotImportedHere") -> Any:  # type: ignore[name-defined]  # noqa: F821
        """Doc."""
        return when

    assert late.parameter_schema()["properties"]["when"].get("format") == "date-time"
    assert late.run({"when": "2026-01-02T03:04:05"}, {}) == datetime.datetime(2026, 1, 2, 3, 4, 5)


@tool
def plain_kinds(s: str, i: int, f: float = 0.5, b: bool = False, o: str = "x") -> tuple[Any, ...]:
    """Plain arguments, echoed with their types."""
    return tuple((v, type(v)) for v in (s, i, f, b, o))


@pytest.mark.parametrize("args", [
    {"s": "a", "i": 1},
    {"s": "a", "i": 1, "f": 2.5, "b": True, "o": "y"},
    {"s": "a", "i": 1.0},  # an integral float: an int to the function
    {"s": "a", "i": True},  # a bool where an int goes: 1
    {"s": "a", "i": "7"},
    {"s": "a", "i": 2**80},
    {"s": "a", "i": 1, "f": 1},  # an int where a float goes: 1.0
    {"s": "a", "i": 1, "b": 1},
])
def test_plain_arguments_reach_the_function_as_pydantic_makes_them(args: dict[str, Any]) -> None:
    """Arguments of plain types (str, int, float, bool) already of their exact type are passed
    without pydantic; every other value still goes through it: the function gets the same
    values, of the same types, either way."""
    assert plain_kinds._plain is not None  # every argument plain: the path without pydantic is taken
    model = plain_kinds._model.model_validate(args)
    expected = plain_kinds.func(**{k: getattr(model, k) for k in plain_kinds._fields})
    assert plain_kinds.run(dict(args), {}) == expected


@pytest.mark.parametrize("args", [{"i": 1}, {"s": "a"}, {"s": "a", "i": 1, "extra": 2}, {"s": 1, "i": 1},
                                  {"s": "a", "i": 1, "f": "x"}, {"s": "a", "i": None}])
def test_plain_arguments_still_refused_by_pydantic(args: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        plain_kinds.run(args, {})


@tool
def constrained(s: Annotated[str, pydantic.Field(max_length=3)], t: str = pydantic.Field("ab", max_length=2)) -> str:
    """Constrained strings: always validated."""
    return s + t


def test_constrained_plain_types_are_validated() -> None:
    assert constrained.run({"s": "abc"}, {}) == "abcab"
    with pytest.raises(pydantic.ValidationError, match="at most 3"):
        constrained.run({"s": "abcd"}, {})
    with pytest.raises(pydantic.ValidationError, match="at most 2"):
        constrained.run({"s": "a", "t": "xyz"}, {})
