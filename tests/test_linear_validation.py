"""The uncounted check of linear schemas (``declarations/linear.py``): which schemas are
linear, the same verdicts and messages as the budgeted validation, the budget still
stopping hostile arguments, and the loop's calls taking it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall
from rho_actors.declarations import arguments, linear
from rho_actors.declarations.arguments import MAX_KEYWORD_CHECKS, decode_arguments, make_validator, violations
from rho_actors.declarations.checks import check_declaration
from rho_actors.declarations.integral import integral_floats
from rho_actors.declarations.linear import QUICK_MAX_CHECKS, linear_cost, quick_valid

from .conftest import WAIT_S
from .helpers import make_tool

pytestmark = pytest.mark.timeout(120)

STOPPED = f"$: validation stopped after {MAX_KEYWORD_CHECKS:,} schema checks; send smaller arguments"


def checked(schema: dict[str, Any]) -> Any:
    return make_validator(check_declaration({"name": "t", "description": "d", "parameter_schema": schema})
                          .parameter_schema)


LINEAR: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "string", "description": "x"}}, "required": ["a"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
     "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                               "minItems": 1, "maxItems": 4}},
     "additionalProperties": {"type": "number"}},
    {"type": "object", "properties": {"mode": {"enum": ["r", "w"], "default": "r"}, "k": {"const": 1},
                                      "o": {"type": "object", "properties": {"x": {"type": ["integer", "null"]}},
                                            "required": ["x"], "maxProperties": 2}}},
    {"type": "object", "properties": {"never": False, "always": True, "items": {"items": False}}},
]

NOT_LINEAR: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a"}}},
    {"type": "object", "patternProperties": {"^a": {}}},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}},
    {"type": "object", "properties": {"a": {"type": "string", "format": "date"}}},
    {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
    {"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0.01}}},
    {"type": "object", "unevaluatedProperties": False},
    {"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{"type": "string"}]}}},
    {"type": "object", "dependentRequired": {"a": ["b"]}},
]


@pytest.mark.parametrize("schema", LINEAR)
def test_linear_schemas_are_found_linear(schema: dict[str, Any]) -> None:
    cost = linear_cost(checked(schema).schema)
    assert cost is not None and cost >= 2


@pytest.mark.parametrize("schema", NOT_LINEAR)
def test_schemas_with_other_keywords_are_not(schema: dict[str, Any]) -> None:
    validator = checked(schema)
    assert linear_cost(validator.schema) is None
    assert not quick_valid(validator, {}, 2)  # budgeted, always


def test_nesting_past_64_levels_is_not_linear() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(70):
        schema = {"type": "array", "items": schema}
    assert linear_cost(schema) is None


INSTANCES = [
    '{"a": "x"}', '{"a": 1}', "{}", '{"n": 3}', '{"n": 3.0}', '{"n": -1}', '{"n": 3, "m": 1}', '{"n": null}',
    '{"tags": ["ab"], "z": 1.5}', '{"tags": []}', '{"tags": ["abcd", 1]}', '{"z": "no"}',
    '{"mode": "w", "k": 1, "o": {"x": null}}', '{"mode": "x", "k": 1.0, "o": {"x": 2.0, "y": 1, "z": 2}}',
    '{"o": {}}', '{"never": 1}', '{"always": [1]}', '{"items": []}', '{"items": [1]}', '{"items": "s"}',
]


@pytest.mark.parametrize("schema", LINEAR)
def test_verdicts_messages_and_integral_floats_are_unchanged(schema: dict[str, Any]) -> None:
    validator = checked(schema)
    for text in INSTANCES:
        counted, quick = decode_arguments(text), decode_arguments(text)
        assert violations(validator, quick, 1.0, len(text)) == violations(validator, counted, 1.0), text
        assert json.dumps(quick) == json.dumps(counted), text  # 3.0 at an integer position is 3 both ways
        assert quick_valid(validator, decode_arguments(text), len(text)) == (violations(validator, counted) == [])


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    scalars: list[Any] = [None, True, 0, -1, 3, 2.0, 2.5, "r", "w", "ab", "abcd", "", 1]
    if kind < 6:
        return rng.choice(scalars)
    keys = ["a", "n", "m", "tags", "z", "mode", "k", "o", "x", "y", "never", "always", "items"]
    if kind < 8:
        return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_random_instances_get_the_budgeted_verdict() -> None:
    rng = random.Random(26)
    validators = [checked(s) for s in LINEAR]
    for _ in range(3_000):
        value = random_value(rng)
        if not isinstance(value, dict):
            continue
        text = json.dumps(value)
        for validator in validators:
            assert violations(validator, decode_arguments(text), 1.0, len(text)) == \
                violations(validator, decode_arguments(text), 1.0), (text, validator.schema)


def test_the_budget_still_stops_hostile_arguments_of_a_non_linear_schema() -> None:
    schema = {"type": "object", "patternProperties": {"^a": {}, "^b": {}}, "additionalProperties": {"type": "integer"}}
    text = json.dumps({f"k{i}": i for i in range(40_000)})
    assert violations(checked(schema), decode_arguments(text), WAIT_S, len(text)) == [STOPPED]  # the checks' bound


def test_the_budget_still_stops_large_arguments_of_a_linear_schema() -> None:
    """Past the quick bound, a linear schema is validated with the budget: the same refusal."""
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
    text = json.dumps({"a": [0] * 250_000})
    validator = checked(schema)
    assert not quick_valid(validator, decode_arguments(text), len(text))
    assert violations(validator, decode_arguments(text), WAIT_S, len(text)) == [STOPPED]  # the checks' bound
    small = json.dumps({"a": list(range(100))})
    assert len(small) * (linear_cost(validator.schema) or 0) <= QUICK_MAX_CHECKS
    assert quick_valid(validator, decode_arguments(small), len(small))


def test_a_lower_budget_bounds_the_quick_check_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rho_actors.declarations.arguments.MAX_KEYWORD_CHECKS", 1_000)
    schema = {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "integer"}}}}
    text = json.dumps({"x": [0] * 2_000})
    assert len(text) * (linear_cost(checked(schema).schema) or 0) <= QUICK_MAX_CHECKS  # within the usual bound
    assert violations(checked(schema), decode_arguments(text), 5.0, len(text)) == \
        ["$: validation stopped after 1,000 schema checks; send smaller arguments"]


def test_the_quick_check_takes_no_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid call of a linear schema is not counted at all (the budget is never set)."""
    validator = checked(LINEAR[2])
    counted: list[int] = []
    def charge(units: int) -> bool:
        counted.append(units)
        return True

    monkeypatch.setattr("rho_actors.declarations.arguments._charge", charge)
    assert violations(validator, decode_arguments('{"tags": ["ab"]}'), 1.0, 16) == []
    assert counted == []


def test_forgotten_subschema_validators_give_the_same_verdicts() -> None:
    validator = checked(LINEAR[3])
    good, bad = '{"o": {"x": 1}}', '{"o": {"x": "s"}}'
    assert quick_valid(validator, decode_arguments(good), len(good))
    linear._CHILDREN.clear()  # as when the cache is full: each value descended as jsonschema does it
    assert quick_valid(validator, decode_arguments(good), len(good))
    assert not quick_valid(validator, decode_arguments(bad), len(bad))
    assert not quick_valid(validator, decode_arguments(good), None)  # the text's size not known


def test_calls_of_a_linear_schema_are_refused_with_the_same_text(tmp_path: Path) -> None:
    ran: list[Any] = []
    schema = LINEAR[1]
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        def count(args: Any, ctx: Any) -> str:
            ran.append(args)
            return "ok"

        system.register(make_tool("count", count, schema=schema))
        loop = system.start_loop("linear")
        results = loop.run_turn([ToolCall("c1", "count", '{"n": 3.0}'), ToolCall("c2", "count", '{"n": 10}'),
                                 ToolCall("c3", "count", {"n": 4}), ToolCall("c4", "count", '{"n": 5, "m": 0}')],
                                timeout_s=WAIT_S)
    finally:
        system.stop()
    assert [r.ok for r in results] == [True, False, True, False]
    assert ran == [{"n": 3}, {"n": 4}] and type(ran[0]["n"]) is int
    assert results[1].error_kind is ErrorKind.INVALID_ARGUMENTS and "$.n: 10 fails maximum 9" in results[1].content
    assert results[3].error_kind is ErrorKind.INVALID_ARGUMENTS and '"m"' in results[3].content


_EDGE_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 1.0, 1.5, -0.0, 2**53, 2**53 + 1, 2**64 + 1, -(2**63) - 1, 10**20, 1e20, 0.1,
    "", "a", "ab", "\U0001F600", "e\u0301", [], [1], [True], [1.0, "a"], {}, {"a": 1}, {"a": True}, {"a": 1.0},
]


def _random_linear(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A random schema of the linear keywords only, with edge values in its ``enum``,
    ``const`` and bounds."""
    schema: dict[str, Any] = {}
    kinds = ["integer", "number", "string", "boolean", "null", "array", "object"]
    if rng.random() < 0.7:
        schema["type"] = rng.choice(kinds) if rng.random() < 0.8 else rng.sample(kinds, 2)
    if rng.random() < 0.2:
        schema["enum"] = rng.sample(_EDGE_VALUES, rng.randrange(1, 4))
    if rng.random() < 0.1:
        schema["const"] = rng.choice(_EDGE_VALUES)
    for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if rng.random() < 0.15:
            schema[bound] = rng.choice([0, 1, 1.5, 2**53, 2**53 + 1, 2**64, 10**20, -(2**63), 0.1])
    for size in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
        if rng.random() < 0.1:
            schema[size] = rng.randrange(3)
    if depth < 2 and rng.random() < 0.4:
        schema["properties"] = {k: _random_linear(rng, depth + 1) for k in rng.sample(["a", "b", "c"], 2)}
        if rng.random() < 0.5:
            schema["required"] = rng.sample(["a", "b"], rng.randrange(3))
        if rng.random() < 0.4:
            schema["additionalProperties"] = rng.choice([False, True, _random_linear(rng, depth + 1)])
    if depth < 2 and rng.random() < 0.3:
        schema["items"] = rng.choice([False, _random_linear(rng, depth + 1)])
    return schema


def _random_instance(rng: random.Random, depth: int = 0) -> Any:
    if depth < 2 and rng.random() < 0.3:
        return {k: _random_instance(rng, depth + 1) for k in rng.sample(["a", "b", "c", "d"], rng.randrange(4))}
    if depth < 2 and rng.random() < 0.2:
        return [_random_instance(rng, depth + 1) for _ in range(rng.randrange(3))]
    return rng.choice(_EDGE_VALUES)


def test_the_compiled_check_gives_jsonschemas_verdict() -> None:
    """The quick verdict is jsonschema-rs's compiled validator's: for random linear
    schemas and instances (integers past 64 bits, ``1.0`` and ``true`` against ``1``,
    astral and combining characters, nested ``enum``/``const``) it is the budgeted
    jsonschema validation's, valid or not."""
    rng = random.Random(42)
    checked_pairs = 0
    for _ in range(400):
        schema = {"type": "object", "properties": {"v": _random_linear(rng)}}
        validator = checked(schema)
        for _ in range(15):
            value = {"v": _random_instance(rng)}
            text = json.dumps(value)
            expected = violations(validator, decode_arguments(text), 1.0) == []
            assert quick_valid(validator, decode_arguments(text), len(text)) == expected, (schema, text)
            checked_pairs += 1
    assert checked_pairs == 6000


def test_a_schema_the_compiled_check_cannot_take_falls_back_to_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(schema: Any) -> Any:
        raise ValueError("not compiled")

    monkeypatch.setattr(jsonschema_rs, "Draft202012Validator", refuse)
    validator = checked(LINEAR[1])
    assert quick_valid(validator, decode_arguments('{"n": 3}'), 8)
    assert not quick_valid(validator, decode_arguments('{"n": 10}'), 9)
    assert violations(validator, decode_arguments('{"n": 10}'), 1.0, 9) == ["$.n: 10 fails maximum 9"]


def test_integral_floats_are_looked_for_only_where_a_schema_names_integer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid call of a linear schema naming no ``integer`` skips the walk that makes
    integral floats ``int`` s; one naming it anywhere (nested, in a type list, in
    ``items`` or ``additionalProperties``) still gets them, as does any non-linear schema."""
    none = checked({"type": "object", "properties": {"x": {"type": "number"}, "s": {"type": "array"}}})
    assert not linear.needs_integral(none)
    walked: list[Any] = []

    def walk(schema: Any, args: dict[str, Any]) -> None:
        walked.append(args)
        integral_floats(schema, args)

    monkeypatch.setattr(arguments, "integral_floats", walk)
    args = decode_arguments('{"x": 3.0}')
    assert violations(none, args, 1.0, 10) == [] and type(args["x"]) is float  # a number stays as sent
    assert walked == []  # not walked at all: nothing to look for
    inner = {"type": "object", "properties": {"n": {"type": "integer"}}}
    for schema in ({"type": "object", "properties": {"o": inner}},
                   {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}},
                   {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}},
                   {"type": "object", "additionalProperties": {"type": "integer"}},
                   NOT_LINEAR[2]):
        validator = checked(schema)
        assert linear.needs_integral(validator), schema
    nested = checked({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})
    args = decode_arguments('{"a": [1.0, 2]}')
    assert violations(nested, args, 1.0, 15) == [] and [type(v) for v in args["a"]] == [int, int]


def test_arguments_without_a_float_list_or_object_at_their_first_level_are_left_at_once() -> None:
    """``integral_floats`` looks at the schema only when the arguments' first level holds
    a float, a list or an object: nothing deeper can hold a float otherwise."""
    class Untouchable(dict[str, Any]):
        def get(self, *args: Any) -> Any:
            raise AssertionError("the schema was walked")

        def __getitem__(self, key: str) -> Any:
            raise AssertionError("the schema was walked")

    flat = {"n": 3, "s": "3.0", "b": True, "z": None}
    integral_floats(Untouchable(), flat)
    assert flat == {"n": 3, "s": "3.0", "b": True, "z": None}
    schema = {"type": "object", "properties": {"n": {"type": "integer"},
                                               "o": {"type": "object", "properties": {"m": {"type": "integer"}}}}}
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"n": 3.0}, {"n": 3}), ({"o": {"m": 2.0}}, {"o": {"m": 2}}),
        ({"n": 1, "o": {"m": 4.0}}, {"n": 1, "o": {"m": 4}})]
    for args, want in cases:
        integral_floats(schema, args)
        assert args == want and all(type(v) is int for v in (args.get("n", 0), args.get("o", {}).get("m", 0)))


def test_registration_makes_the_quick_check_before_the_first_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The uncounted check of a registered tool's linear schema is made when it is
    registered, not on its first call's time (nothing is made while a call validates)."""
    made: list[Any] = []
    make = linear._made

    def noting(validator: Any, key: int) -> tuple[Any, int, bool]:
        made.append(validator)
        return make(validator, key)

    monkeypatch.setattr(linear, "_made", noting)
    with ActorSystem(data_dir=tmp_path / "data") as system:
        system.register(make_tool("count", "ok", schema=LINEAR[1]))
        assert made, "registration made no quick check"
        made.clear()
        [result] = system.start_loop("s").run_turn([ToolCall("c1", "count", '{"n": 3}')], timeout_s=WAIT_S)
        assert result.ok, result.content
        assert made == []
