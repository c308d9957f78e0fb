"""Property tests of the boundaries the third fuzzing round found faults at: what a child
sends (the wire decoder), MCP stdio lines, the observer stream, terminal rendering, and
validation where floats and RE2 differ from JSON Schema (``multipleOf``, ``false``
subschemas, ``\\s``/``\\S``/``.``), with jsonschema as the oracle where it agrees with
the specification.

Properties: decoding a child's bytes gives a well-formed value or the codec's own error,
never another exception; every text decoded from a child is valid UTF-8 without control
characters; every stdio line with a ``method`` and an ``id`` is either a request the SDK
serves or answered at once, with its id where usable; every observer line is one strict
RFC 8259 object; no rendering of another's text raises or lets a control sequence
through; validation agrees with the oracle, and with ECMA-262 on pattern classes.
"""

from __future__ import annotations

import io
import json
import os
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from jsonschema import Draft202012Validator
from rich.console import Console

from rho_actors import ErrorKind, Image, ToolResult
from rho_actors.declarations.arguments import make_validator, violations
from rho_actors.declarations.patterns import ECMA_SPACE
from rho_actors.observe.observer import json_line
from rho_actors.observe.top import TopView
from rho_actors.sandbox import wire
from rho_actors.selftest import SelftestRow, render_rows
from rho_actors.tool import IMAGE_TYPES

pytestmark = pytest.mark.timeout(600)

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_DEEP = os.environ.get("RHO_FUZZ") == "deep"


def examples(ci: int) -> settings:
    """Fewer examples than the profile's in CI for a slow property (rendering); the deep
    profile's count under ``RHO_FUZZ=deep``."""
    return settings(max_examples=2_000 if _DEEP else ci)


def utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def strings_of(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings_of(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings_of(v)]
    return []


every_char = st.characters(codec=None)  # surrogates, controls, bidi marks included
hostile_text = st.text(every_char, max_size=12) | st.sampled_from(
    ["[/]", "[link=https://example.invalid]x", "\x1b]0;t\x07", "\x1b]52;c;ZXZpbA==\x07", "\x1b[2J", "\x9b2J",
     "\u202e", "\ud800", "[bold]"])
json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | hostile_text
json_like = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(hostile_text, inner, max_size=3), max_leaves=12)


# --- tooling: the oracle's generator works -------------------------------------------------------


def test_from_schema_produces_examples_for_an_object_schema() -> None:
    """hypothesis-jsonschema's from_schema failed for every object schema with hypothesis
    6.170.10+ (it calls ``many.more()``): the property tests drew nothing."""
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                              "required": ["a"], "additionalProperties": False}
    drawn: list[Any] = []

    @settings(max_examples=25, database=None)
    @given(from_schema(schema))
    def collect(value: Any) -> None:
        drawn.append(value)

    collect()
    assert len(drawn) >= 10
    assert all(Draft202012Validator(schema).is_valid(value) for value in drawn)


# --- the wire decoder -------------------------------------------------------------------------

result_field = st.sampled_from(["ok", "content", "error_kind", "details", "images"])
mime = st.sampled_from([*IMAGE_TYPES, "image/svg+xml", "text/html", "image/PNG", "bad", "", "a/b"]) | st.text(
    max_size=8)
plain_message = st.fixed_dictionaries({
    "ok": st.booleans() | st.integers(0, 1), "content": hostile_text | st.binary(max_size=4),
    "error_kind": st.none() | st.sampled_from([k.value for k in ErrorKind]) | st.text(max_size=6),
    "details": st.none() | st.binary(max_size=16) | json_like.map(lambda v: msgpack.packb(v, use_bin_type=True)
                                                                  if _packable(v) else None),
    "images": st.lists(st.lists(st.binary(max_size=8) | mime, min_size=0, max_size=3), max_size=3)
    | st.lists(st.tuples(st.binary(max_size=8), mime).map(list), max_size=3),
}) | st.dictionaries(result_field | st.text(max_size=4), json_leaf, max_size=6)


def _packable(value: Any) -> bool:
    try:
        msgpack.packb(value, use_bin_type=True)
    except Exception:
        return False
    return True


frame = st.one_of(
    st.binary(max_size=64),
    plain_message.filter(_packable).map(lambda m: bytes(msgpack.packb(m, use_bin_type=True))),
    st.builds(lambda data, cut: data[:cut], plain_message.filter(_packable).map(
        lambda m: bytes(msgpack.packb(m, use_bin_type=True))), st.integers(0, 40)),
)


@given(frame)
def test_a_result_frame_decodes_to_a_result_or_a_wire_error(body: bytes) -> None:
    try:
        result = wire.PlainCodec().decode(body)
    except wire.WireError as err:
        assert utf8(str(err))
        return
    assert isinstance(result, ToolResult) and utf8(result.content)
    assert all(isinstance(image, Image) and image.mime_type in IMAGE_TYPES for image in result.images)
    assert result.ok == (result.error_kind is None)


@given(st.booleans(), st.text(max_size=20), st.lists(st.tuples(st.binary(max_size=8), st.sampled_from(IMAGE_TYPES)),
                                                     max_size=3), json_like)
def test_a_plain_result_crosses_the_wire_unchanged(ok: bool, content: str, images: list[tuple[bytes, str]],
                                                   details: Any) -> None:
    content = content.encode("utf-8", "replace").decode("utf-8")
    plain = details if wire.plain_problem(details, "details") is None and _packable(details) else None
    result = ToolResult("c", "t", ok, content, None if ok else ErrorKind.RAISED, plain,
                        tuple(Image(d, m) for d, m in images))
    back = wire.PlainCodec().decode(wire.PlainCodec().encode(result))
    assert (back.ok, back.content, back.error_kind, back.images) == (
        result.ok, result.content, result.error_kind, result.images)
    assert back.details == json.loads(json.dumps(plain)) if plain is not None else back.details is None


child_json = st.one_of(
    json_like.map(lambda v: json.dumps(v, ensure_ascii=True)),
    json_like.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.binary(max_size=32),
    st.sampled_from(['{"m": "\\ud800"}', '["\\u001b]0;x\\u0007"]', '{"\\udfff": 1}', "NaN", '{"a": Infinity}']),
)


@given(child_json)
def test_json_from_a_child_is_scrubbed_or_refused(body: str | bytes) -> None:
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    try:
        value = wire.decode_json(data)
    except wire.WireError:
        return
    for text in strings_of(value):
        assert utf8(text) and not _CONTROL.search(text), repr(text)


# --- MCP stdio lines ----------------------------------------------------------------------------

request_id: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=4),
    st.sampled_from([{}, [], {"a": 1}]))
params = st.none() | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2) | json_leaf | st.lists(
    st.integers(), max_size=2)
stdio_line = st.builds(
    lambda ident, p, method, version, extra: json.dumps(
        {"jsonrpc": version, "method": method, "id": ident, **({} if p is None else {"params": p}), **extra}),
    request_id, params, st.sampled_from(["ping", "tools/list", "initialize"]) | st.integers(),
    st.sampled_from(["2.0", "2.0", "1.0"]) | st.integers(), st.dictionaries(st.sampled_from(["result", "error"]),
                                                                            st.integers(), max_size=1),
)


@given(stdio_line)
def test_every_request_line_is_served_or_answered_with_its_id(line: str) -> None:
    import mcp_types as types

    from rho_actors.mcp.stdio_lines import early_answer

    answer = early_answer(line)
    ident = json.loads(line)["id"]
    if answer is None:  # the SDK takes it: then it is a request it answers, with this id
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        assert isinstance(message, types.JSONRPCRequest) and message.id == ident
        return
    assert answer.error.code == types.INVALID_REQUEST
    usable = type(ident) in (str, int)
    assert answer.id == (ident if usable else None)
    sent = json.loads(answer.model_dump_json(by_alias=True, exclude_unset=True))
    assert sent["id"] == (ident if usable else None) and "id" in sent


# --- the observer stream ------------------------------------------------------------------------


@given(st.dictionaries(hostile_text, json_like | st.builds(object) | st.tuples(st.integers()), max_size=5))
def test_every_observer_line_is_one_strict_json_object(fields: dict[str, Any]) -> None:
    line = json_line({"type": "report", **fields})
    assert line.endswith(b"\n") and b"\n" not in line[:-1]

    def refuse(name: str) -> Any:
        raise ValueError(name)

    message = json.loads(line.decode("utf-8"), parse_constant=refuse)
    assert type(message) is dict and (message["type"] == "report" or "type" in fields)


# --- terminal rendering -----------------------------------------------------------------------

_SGR = re.compile(r"\x1b\[[0-9;]*m")
_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _terminal_safe(out: str) -> None:
    stripped = _SGR.sub("", out)  # rich's own styling is the only escape sequence allowed
    assert not _TERMINAL_CONTROL.search(stripped.replace("\n", "")), repr(out)
    assert utf8(out)


def _render(renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="standard", width=120).print(renderable)
    return out.getvalue()


@examples(40)
@given(hostile_text, hostile_text, hostile_text, json_like)
def test_top_renders_anything_an_observer_sends_as_text(call_id: str, tool: str, reason: str, value: Any) -> None:
    view = TopView()
    view.update({"type": "snapshot", "tree": {"id": tool, "kind": reason, "children": [{"id": call_id}]},
                 "calls": [{"session_id": reason, "call_id": call_id, "tool": tool, "ms_left": value}],
                 "workers": [{"pid": value, "rss_bytes": value}], "stats": {}, "events": [], "reports": []})
    view.update({"type": "event", "kind": "finished", "session_id": reason, "call_id": call_id, "tool": tool,
                 "outcome": reason, "duration_ms": value})
    view.update({"type": "report", "event": tool, "reason": reason, "value": value})
    _terminal_safe(_render(view.render()))


@examples(40)
@given(hostile_text, st.sampled_from(["passed", "failed", "timeout", "crashed", "no selftest"]), hostile_text)
def test_the_selftest_table_renders_any_name_and_message_as_text(name: str, outcome: Any, message: str) -> None:
    _terminal_safe(_render(render_rows([SelftestRow(name, outcome, 3.0, message)])))


# --- validation where floats and RE2 differ from JSON Schema -------------------------------------


@given(st.integers(-10**9, 10**9), st.sampled_from(["0.01", "0.1", "0.05", "0.25", "3", "0.001"]))
def test_multiple_of_is_exact_on_the_decimal_as_written(cents: int, divisor_text: str) -> None:
    value = float(Decimal(cents) / 100)  # a number with at most 2 decimals, as a model writes it
    divisor = float(divisor_text) if "." in divisor_text else int(divisor_text)
    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": divisor}}}
    exact = (Fraction(Decimal(repr(value))) / Fraction(Decimal(divisor_text))).denominator == 1
    assert (violations(make_validator(schema), {"n": value}) == []) is exact


def _around(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Schemas holding ``inner`` schemas where ``false`` may stand: properties, items,
    additional and unevaluated properties, pattern properties, anyOf."""
    return st.one_of(
        st.builds(lambda props: {"type": "object", "properties": props},
                  st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
        st.builds(lambda rest, first: {"type": "array", "prefixItems": first, "items": rest}, inner,
                  st.lists(inner, max_size=2)),
        st.builds(lambda extra, left: {"type": "object", "additionalProperties": extra,
                                       "unevaluatedProperties": left}, inner, inner),
        st.builds(lambda sub: {"type": "object", "patternProperties": {"^[ab]$": sub}}, inner),
        st.builds(lambda subs: {"anyOf": subs}, st.lists(inner, min_size=1, max_size=2)),
    )


false_schema = st.recursive(st.booleans() | st.just({"type": "integer"}) | st.just({}), _around, max_leaves=6)
small_json = st.recursive(st.none() | st.integers(-3, 3) | st.sampled_from(["a", "b"]), lambda inner: st.lists(
    inner, max_size=3) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=3), max_leaves=8)


@given(false_schema, st.dictionaries(st.sampled_from("abcd"), small_json, max_size=3))
def test_false_subschemas_agree_with_jsonschema_and_name_a_path(sub: Any, instance: dict[str, Any]) -> None:
    schema = {"type": "object", "properties": {"v": sub}, "additionalProperties": sub}
    accepted = Draft202012Validator(schema).is_valid(instance)
    found = violations(make_validator(schema), instance)
    assert (found == []) == accepted, (schema, instance, found)
    assert not any(" None " in line or line.endswith("None") for line in found), found


@given(st.text(every_char.filter(utf8), max_size=6))
def test_pattern_classes_agree_with_ecma_262(text: str) -> None:
    spaces = set(ECMA_SPACE)
    line_ends = set("\n\r\u2028\u2029")
    for pattern, ecma in [
        (r"^\S+$", bool(text) and not any(c in spaces for c in text)),
        (r"^\s*$", all(c in spaces for c in text)),
        (r"^[^\S\n]*$", all(c in spaces and c != "\n" for c in text)),
        (r"^.*$", not any(c in line_ends for c in text)),
        (r"^[\sa]*$", all(c in spaces or c == "a" for c in text)),
    ]:
        schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
        assert (violations(make_validator(schema), {"s": text}) == []) is ecma, (pattern, text)
