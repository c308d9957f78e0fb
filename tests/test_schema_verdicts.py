"""A schema offered by many tools is checked once (rho_actors.declarations.checks): the
verdict is kept by the SHA-256 of its exact JSON text, so the same schema gets the same
verdict and any other schema (another type, key order or value) its own check."""

from __future__ import annotations

from typing import Any

import pytest

from rho_actors.declarations import checks
from rho_actors.declarations.checks import DeclarationError, check_declaration


def declaration(name: str, schema: Any) -> dict[str, Any]:
    return {"name": name, "description": "A tool.", "parameter_schema": schema}


@pytest.fixture
def costly(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The schemas that reached the costly checks during the test (a fresh verdict cache)."""
    seen: list[dict[str, Any]] = []
    real = checks._costly_checks

    def counted(schema: dict[str, Any]) -> list[str]:
        seen.append(schema)
        return real(schema)

    monkeypatch.setattr(checks, "_costly_checks", counted)
    monkeypatch.setattr(checks, "_SCHEMA_VERDICTS", checks._Verdicts(8))
    return seen


def test_the_same_schema_is_checked_once_for_many_tools(costly: list[dict[str, Any]]) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    infos = [check_declaration(declaration(f"t{i}", {**schema, "properties": {"a": {"type": "integer"}}}))
             for i in range(5)]
    assert len(costly) == 1
    assert [i.name for i in infos] == ["t0", "t1", "t2", "t3", "t4"]
    infos[0].parameter_schema["properties"]["a"]["type"] = "string"  # each keeps its own copy
    assert infos[1].parameter_schema["properties"]["a"]["type"] == "integer"


def test_a_bad_schema_gets_the_same_reason_every_time(costly: list[dict[str, Any]]) -> None:
    bad = {"type": "object", "properties": {"a": {"type": "integr"}}}
    reasons = []
    for i in range(3):
        with pytest.raises(DeclarationError) as caught:
            check_declaration(declaration(f"t{i}", bad))
        reasons.append(str(caught.value))
    assert len(costly) == 1 and len(set(reasons)) == 1
    assert "parameter_schema.properties.a.type: not a valid JSON Schema" in reasons[0]


def test_schemas_that_differ_in_any_way_are_each_checked(costly: list[dict[str, Any]]) -> None:
    variants = [
        {"type": "object", "properties": {"a": {"minimum": 1}}},
        {"type": "object", "properties": {"a": {"minimum": 1.0}}},  # 1 and 1.0: other JSON text
        {"properties": {"a": {"minimum": 1}}, "type": "object"},  # another key order
        {"type": "object", "properties": {"a": {"minimum": True}}},  # not a number: refused
    ]
    outcomes = []
    for i, schema in enumerate(variants):
        try:
            outcomes.append(check_declaration(declaration(f"t{i}", schema)).name)
        except DeclarationError as err:
            outcomes.append(str(err))
    assert len(costly) == 4
    assert outcomes[:3] == ["t0", "t1", "t2"] and "not a valid JSON Schema" in outcomes[3]


def test_the_cache_keeps_only_the_latest_verdicts(costly: list[dict[str, Any]]) -> None:
    for i in range(10):  # a cache of 8
        check_declaration(declaration("t", {"type": "object", "properties": {f"p{i}": {}}}))
    check_declaration(declaration("t", {"type": "object", "properties": {"p9": {}}}))  # still held
    assert len(costly) == 10
    check_declaration(declaration("t", {"type": "object", "properties": {"p0": {}}}))  # evicted: checked again
    assert len(costly) == 11
