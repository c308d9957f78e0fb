"""``ActorSystem.register_many``: many tools as one change, with every rule of
``register`` (name checks, the host evicting a source's tool, left-out declarations,
withheld tools, serials), all or nothing when a tool is refused."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from rho_actors import ActorSystem, DeclarationEvent, DuplicateToolError, ToolCall, ToolSetChanged
from rho_actors.declarations.checks import check_declaration, read_declaration
from rho_actors.declarations.metaschema import metaschema_validator
from tests.conftest import WAIT_S
from tests.helpers import make_tool


def _adder(i: int) -> Any:
    def run(args: dict[str, Any], ctx: Any) -> int:
        return i + int(args.get("a", 0))

    return run


def _tools(n: int, prefix: str = "t") -> list[Any]:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    return [make_tool(f"{prefix}{i}", run=_adder(i), schema=schema) for i in range(n)]


def _state(system: ActorSystem) -> tuple[int, list[str], list[tuple[str, bool]]]:
    tool_set = system.tool_set()
    return tool_set.version, list(tool_set.entries), [(r.origin, r.offered) for r in system.registrations()]


def test_registers_every_tool_in_order_as_one_change(system: ActorSystem) -> None:
    changes: list[int] = []
    system.subscribe(lambda e: changes.append(e.version) if isinstance(e, ToolSetChanged) else None)
    loop = system.start_loop("s1", withheld=["t7"])
    before = system.tool_set().version
    registrations = system.register_many(_tools(40))
    assert [r.info.name for r in registrations if r.info is not None] == [f"t{i}" for i in range(40)]
    assert system.tool_set().version == before + 1 and changes == [before + 1]  # one published set
    assert [i.name for i in loop.offered()] == [f"t{i}" for i in range(40) if i != 7]  # withheld kept
    serials = [e.serial for e in system.tool_set().entries.values()]
    assert serials == sorted(serials) and len(set(serials)) == 40  # one new serial per registration
    [ok, withheld] = loop.run_turn([ToolCall("c1", "t39", '{"a": 1}'), ToolCall("c2", "t7", "{}")], timeout_s=WAIT_S)
    assert ok.ok and ok.content == "40"
    assert withheld.error_kind == "withheld"


def test_the_same_outcomes_as_register_for_good_and_left_out_tools(tmp_path: Any) -> None:
    bad_schema = make_tool("bad_schema", schema={"type": "object", "properties": {"a": {"type": "nope"}}})
    tools = [*_tools(3), make_tool("bad name!"), bad_schema, make_tool("no_text", description=" ")]
    with ActorSystem(data_dir=tmp_path / "one") as one, ActorSystem(data_dir=tmp_path / "many") as many:
        singly = [one.register(t) for t in tools]
        batch = many.register_many(tools)
        assert [(r.origin, r.offered, r.reason) for r in batch] == [(r.origin, r.offered, r.reason) for r in singly]
        assert [r.offered for r in batch] == [True, True, True, False, False, False]
        assert "parameter_schema.properties.a.type" in (batch[4].reason or "")
        assert dict(many.tool_set().unavailable) == dict(one.tool_set().unavailable)
        loop = many.start_loop("s")
        [result] = loop.run_turn([ToolCall("c1", "bad_schema", "{}")], timeout_s=WAIT_S)
        assert result.error_kind == "unavailable" and "parameter_schema" in result.content


def test_a_name_taken_twice_in_the_batch_registers_none_of_it(system: ActorSystem) -> None:
    system.register_many(_tools(2, "held"))
    before = _state(system)
    twin = make_tool("t1")
    with pytest.raises(DuplicateToolError) as err:
        system.register_many([*_tools(3), twin])
    message = str(err.value)
    assert "tool name 't1' is already registered by" in message
    assert "tool 3 of the batch: none of it is registered" in message
    assert _state(system) == before


def test_a_name_a_registered_tool_holds_registers_none_of_it(system: ActorSystem) -> None:
    system.register_many(_tools(2, "held"))
    before = _state(system)
    with pytest.raises(DuplicateToolError, match=r"'held1' is already registered by .*tool 2 of the batch"):
        system.register_many([*_tools(2), make_tool("held1"), *_tools(2, "more")])
    assert _state(system) == before


def test_a_bad_tool_or_option_raises_before_any_is_registered(system: ActorSystem) -> None:
    before = _state(system)
    with pytest.raises(TypeError, match=r"is not a tool: it lacks"):
        system.register_many([*_tools(2), object()])
    with pytest.raises(ValueError, match=r"env apply to untrusted tools only"):
        system.register_many(_tools(2), env={"A": "1"})
    with pytest.raises(ValueError, match=r"isolation must be one of"):
        system.register_many(_tools(2), isolation="nowhere")
    with pytest.raises(ValueError, match=r"origins names 1 tools, and 2 tools were given"):
        system.register_many(_tools(2), origins=["only one"])
    assert _state(system) == before


def test_origins_name_where_each_tool_comes_from(system: ActorSystem) -> None:
    system.register_many(_tools(2), origins=["first place", "second place"])
    assert [r.origin for r in system.registrations()] == ["first place", "second place"]
    with pytest.raises(DuplicateToolError, match=r"second place"):
        system.register_many(_tools(2, "t")[1:], origins=["elsewhere"])


def test_registering_the_same_tools_again_rereads_them(system: ActorSystem) -> None:
    tools = _tools(3)
    first = [e.serial for e in (system.register_many(tools), system.tool_set())[1].entries.values()]
    system.register_many(tools)
    again = [e.serial for e in system.tool_set().entries.values()]
    assert list(system.tool_set().entries) == ["t0", "t1", "t2"]
    assert all(b > a for a, b in zip(first, again, strict=True))  # new registrations, same places


def test_the_host_batch_evicts_a_source_tool_holding_a_name(system: ActorSystem) -> None:
    events: list[DeclarationEvent] = []
    system.subscribe(lambda e: events.append(e) if isinstance(e, DeclarationEvent) else None)
    served = make_tool("t1", run="from the source")
    system.register(served, source="plugins")
    system.register_many(_tools(3))
    assert system.tool_set().entries["t1"].tool is not served
    assert [e.kind for e in events if e.name == "t1"] == ["evicted"]
    with pytest.raises(DuplicateToolError):  # a source's batch never takes a held name
        system.register_many([make_tool("t2")], source="plugins")


def test_a_left_out_tool_registered_again_fixed_keeps_its_place(system: ActorSystem) -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "nope"}}}
    flaky = make_tool("flaky", parameter_schema=lambda: schema)
    system.register_many([*_tools(2), flaky, *_tools(2, "u")])
    assert "flaky" in system.tool_set().unavailable
    schema["properties"]["a"]["type"] = "integer"
    system.register(flaky)
    assert list(system.tool_set().entries) == ["t0", "t1", "flaky", "u0", "u1"]
    assert "flaky" not in system.tool_set().unavailable


@pytest.mark.parametrize("schema", [
    {"type": 3}, {"type": "object", "properties": {"a": {"type": "nope"}}}, {"properties": []},
    {"minLength": -1}, {"items": {"$defs": {"x": {"enum": 1}}}}, {"required": [1]},
    {"$defs": {"a": {"type": ["x"]}}}, {"dependencies": {"a": 3}}, {"definitions": {"a": {"minimum": "x"}}},
    {"anyOf": []}, {"unevaluatedProperties": 3}, {"contentSchema": 1}, {"format": 1}, {"deprecated": "x"},
    {"prefixItems": [{"type": 1}]}, {"$anchor": "1x"}, {"type": "object", "$comment": 5},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"maximum": []}}},
])
def test_the_inlined_metaschema_finds_what_check_schema_finds(schema: dict[str, Any]) -> None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    with pytest.raises(SchemaError) as err:
        Draft202012Validator.check_schema(schema, format_checker=None)  # type: ignore[arg-type]
    found = next(metaschema_validator().iter_errors(schema), None)
    assert found is not None
    assert (found.json_path, found.message) == (err.value.json_path, err.value.message)


@pytest.mark.parametrize("schema", [
    {"type": "object"}, {"type": "object", "properties": {"a": {"type": ["string", "null"], "minLength": 1}}},
    {"type": "object", "$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}},
    {"type": "object", "dependencies": {"a": ["b"]}, "unevaluatedProperties": False, "x-extension": {"type": 3}},
])
def test_the_inlined_metaschema_passes_what_check_schema_passes(schema: dict[str, Any]) -> None:
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(schema, format_checker=None)  # type: ignore[arg-type]
    assert next(metaschema_validator().iter_errors(schema), None) is None
    assert check_declaration(read_declaration(make_tool("x", schema=schema))).name == "x"


UNTRUSTED_A: Any = make_tool("untrusted_a", "a")
UNTRUSTED_B: Any = make_tool("untrusted_b", "b")
UNTRUSTED_C: Any = make_tool("untrusted_c", "c")
UNTRUSTED_A_AGAIN: Any = make_tool("untrusted_a", "again")


def test_untrusted_tools_are_read_in_other_processes_each_registered_when_read(system: ActorSystem) -> None:
    registrations = system.register_many([UNTRUSTED_A, UNTRUSTED_B], untrusted=True)
    assert [r.info.name if r.info else None for r in registrations] == ["untrusted_a", "untrusted_b"]
    assert all(e.untrusted and e.isolation == "process" for e in system.tool_set().entries.values())
    with pytest.raises(DuplicateToolError, match="'untrusted_a' is already registered"):
        system.register_many([UNTRUSTED_A_AGAIN, UNTRUSTED_C], untrusted=True)
    # as documented: untrusted tools are registered as each read is done (in that order), so the others stay
    assert set(system.tool_set().entries) == {"untrusted_a", "untrusted_b", "untrusted_c"}
    assert system.tool_set().entries["untrusted_a"].tool is UNTRUSTED_A


def _plain(text: str) -> str:
    """Not decorated."""
    return text


class _Values:
    name = "values"
    description = "A class whose callbacks are values."
    parameter_schema: ClassVar[dict[str, str]] = {"type": "object"}

    @staticmethod
    def run(args: Any, ctx: Any) -> str:
        return "ran"


def test_not_a_tool_says_what_was_found_and_what_to_do(system: ActorSystem) -> None:
    """A newcomer's three near-misses each get what was found and what to do (the
    message said only which callbacks were missing)."""
    import types

    with pytest.raises(TypeError, match=r"is not a tool: it lacks name, .*; it is a plain function: "
                                        r"decorate it with @tool \(from rho_actors import tool\)"):
        system.register(_plain)
    with pytest.raises(TypeError, match=r"it lacks name, description, parameter_schema; in this class _Values "
                                        r"name is a str, description is a str, parameter_schema is a dict, "
                                        r"not a function"):
        system.register(_Values)
    module = types.ModuleType("settings")
    module.name = "x"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"in this module name is a str, not a function"):
        system.register(module)
    pydantic_ai = pytest.importorskip("pydantic_ai")
    system.register(pydantic_ai.Tool(_plain))  # not a near-miss any more: a pydantic-ai Tool is adopted
    assert "_plain" in system.tool_set().entries
