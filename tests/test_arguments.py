"""Call arguments (arguments.py): strict decoding and validation with JSON paths."""

from __future__ import annotations

import json
import types
from collections import OrderedDict
from typing import Any

import pytest

from rho_actors import ArgumentsError, ErrorKind, decode_arguments
from rho_actors.declarations.arguments import DEFAULT_MAX_ARGUMENT_DEPTH, make_validator, violations
from tests.conftest import WAIT_S

PREFIX = "arguments are not valid JSON: "


def refused(arguments: Any, **kwargs: Any) -> str:
    """The message of the ``invalid_json`` ArgumentsError ``arguments`` gets."""
    with pytest.raises(ArgumentsError) as info:
        decode_arguments(arguments, **kwargs)
    assert info.value.kind is ErrorKind.INVALID_JSON
    assert isinstance(info.value, ValueError)
    return str(info.value)


def nested(levels: int) -> str:
    """A JSON object whose containers nest exactly ``levels`` deep (the object is level 1)."""
    return '{"a": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


# --- valid input -----------------------------------------------------------------------


def test_valid_object() -> None:
    text = '{"a": 1, "b": [true, null, 2.5, "x"], "c": {"d": {}}}'
    assert decode_arguments(text) == {"a": 1, "b": [True, None, 2.5, "x"], "c": {"d": {}}}


def test_empty_object_and_surrounding_whitespace() -> None:
    assert decode_arguments("{}") == {}
    assert decode_arguments(' \n\t{"a": 1}  \r\n') == {"a": 1}


def test_bytes_input() -> None:
    assert decode_arguments(b'{"a": "\xc3\xbc"}') == {"a": "ü"}
    assert decode_arguments(bytearray(b'{"n": 2}')) == {"n": 2}


def test_invalid_utf8_bytes_are_refused_not_repaired() -> None:
    # The module "repairs nothing"; RFC 8259 JSON text is UTF-8.
    refused(b'{"a": "\xff"}')


def test_valid_surrogate_pair_escape_is_accepted() -> None:
    assert decode_arguments('{"e": "\\ud83d\\ude00"}') == {"e": "😀"}


def test_already_decoded_mapping_is_accepted_and_copied() -> None:
    original = {"a": 1, "b": [1, 2], "c": {"d": None}}
    decoded = decode_arguments(original)
    assert decoded == original
    assert type(decoded) is dict and decoded is not original
    assert decode_arguments(types.MappingProxyType({"x": 1})) == {"x": 1}
    assert decode_arguments(OrderedDict(y=2)) == {"y": 2}


# --- not one JSON object -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "type_name"),
    [("[1, 2]", "array"), ('"text"', "string"), ("42", "integer"), ("4.5", "number"), ("null", "null"),
     ("true", "boolean")],
)
def test_non_object_json_names_the_type(text: str, type_name: str) -> None:
    message = refused(text)
    assert message == f"arguments must be a JSON object, got {type_name}: {text}"


def test_long_non_object_is_shortened_in_the_message() -> None:
    text = json.dumps(list(range(1_000)))
    message = refused(text)
    assert message.startswith("arguments must be a JSON object, got array: [0, 1, 2")
    assert message.endswith("...")
    assert len(message) < 250


def test_glued_objects_are_extra_data() -> None:
    message = refused('{"a":1}{"a":2}')
    assert message.startswith(PREFIX)
    assert "Extra data" in message
    assert "char 7" in message


@pytest.mark.parametrize("text", ['{"a": 1} x', '{"a": 1},', '{"a": 1}\n{"b": 2}', '{"a": 1}]'])
def test_trailing_garbage_is_refused(text: str) -> None:
    assert "Extra data" in refused(text)


@pytest.mark.parametrize("text", ['{"a": 1', '{"a": }', "{'a': 1}", '{"a": 1,}', "{a: 1}", "not json"])
def test_malformed_json_is_refused(text: str) -> None:
    assert refused(text).startswith(PREFIX)


def test_empty_string_is_refused_saying_an_object_is_expected() -> None:
    empty = "arguments were empty: send a JSON object, {} when the tool takes no arguments"
    assert refused("") == empty
    assert refused("   ") == empty
    assert refused(b"") == empty


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_tokens_are_refused(token: str) -> None:
    message = refused('{"x": ' + token + "}")
    assert message.startswith(PREFIX)
    assert f"{token} is not JSON" in message


def test_number_overflowing_to_infinity_is_refused() -> None:
    assert refused('{"a": 1e400}') == PREFIX + "$.a: inf is not JSON"


def test_flat_ascii_text_is_checked_as_any_other() -> None:
    """Flat arguments from ASCII text without a \\u escape skip the walk: what can still be
    wrong there is found as before (an overflowing float, a raw surrogate, a depth of 0)."""
    assert decode_arguments('{"s": "x", "i": 3, "f": 1.5, "b": true, "n": null}') == {
        "s": "x", "i": 3, "f": 1.5, "b": True, "n": None}
    assert refused('{"s": "x", "f": -1e400}') == PREFIX + "$.f: -inf is not JSON"
    assert refused('{"s": "x\ud800"}') == PREFIX + "$.s: a string holds a lone surrogate"  # not ASCII
    assert refused('{"a": [1e400]}') == PREFIX + "$.a[0]: inf is not JSON"
    with pytest.raises(ArgumentsError, match="nested deeper than 0 levels"):
        decode_arguments('{"a": 1}', max_depth=0)


def test_duplicate_keys_are_refused_naming_the_key() -> None:
    assert refused('{"a": 1, "b": 2, "a": 3}') == PREFIX + "duplicate key 'a'"
    assert "duplicate key 'k'" in refused('{"x": {"k": 1, "k": 1}}')


def test_lone_surrogate_escape_in_value_is_refused() -> None:
    assert refused('{"a": "\\ud800"}') == PREFIX + "$.a: a string holds a lone surrogate"
    assert refused('{"a": ["ok", "x\\udc00"]}') == PREFIX + "$.a[1]: a string holds a lone surrogate"


def test_lone_surrogate_escape_in_key_is_refused() -> None:
    assert refused('{"\\ud800": 1}') == PREFIX + "$: a key holds a lone surrogate"
    assert refused('{"o": {"k\\udbff": 1}}') == PREFIX + "$.o: a key holds a lone surrogate"


# --- depth -----------------------------------------------------------------------------


def test_exactly_max_depth_levels_are_accepted() -> None:
    assert DEFAULT_MAX_ARGUMENT_DEPTH == 64
    decoded = decode_arguments(nested(64))
    depth, item = 1, decoded["a"]
    while item:
        depth, item = depth + 1, item[0]
    assert depth + 1 == 64


def test_one_level_past_max_depth_is_refused() -> None:
    message = refused(nested(65))
    assert message.startswith(PREFIX)
    assert "nested deeper than 64 levels" in message


def test_custom_max_depth() -> None:
    assert decode_arguments('{"a": {"b": [1]}}', max_depth=3) == {"a": {"b": [1]}}
    assert "nested deeper than 2 levels" in refused('{"a": {"b": [1]}}', max_depth=2)
    assert "nested deeper than 1 levels" in refused('{"a": []}', max_depth=1)


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_hostile_nesting_is_refused_without_recursion_error(opening: str) -> None:
    text = '{"x": ' + opening * 100_000
    message = refused(text)
    assert "nested deeper than 64 levels" in message


def test_hostile_nesting_that_closes_is_refused() -> None:
    text = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert "nested deeper than" in refused(text)


def test_deep_mapping_is_refused_without_recursion_error() -> None:
    value: Any = 1
    for _ in range(100_000):
        value = [value]
    message = refused({"a": value})
    assert "nested deeper than 64 levels" in message
    assert "$.a" in message


# --- decoded mappings and other input types ---------------------------------------------


def test_mapping_with_non_str_key_is_refused() -> None:
    assert refused({1: "x"}) == PREFIX + "$: key 1 is not a string"
    assert refused({"a": {None: 1}}) == PREFIX + "$.a: key None is not a string"


def test_mapping_holding_a_set_is_refused() -> None:
    assert refused({"s": {1, 2}}) == PREFIX + "$.s: a set is not JSON data"


def test_mapping_holding_nan_or_infinity_is_refused() -> None:
    assert refused({"n": float("nan")}) == PREFIX + "$.n: nan is not JSON"
    assert refused({"l": [1.0, float("-inf")]}) == PREFIX + "$.l[1]: -inf is not JSON"


def test_mapping_holding_an_object_or_lone_surrogate_is_refused() -> None:
    assert refused({"o": object()}) == PREFIX + "$.o: a object is not JSON data"
    assert refused({"s": "\ud800"}) == PREFIX + "$.s: a string holds a lone surrogate"


@pytest.mark.parametrize(("value", "type_name"), [(5, "int"), (None, "NoneType"), ([1], "list"), (1.5, "float")])
def test_non_str_non_mapping_is_refused(value: Any, type_name: str) -> None:
    assert refused(value) == f"arguments must be JSON text or a mapping, got {type_name}"


# --- validation ------------------------------------------------------------------------

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "name": {"type": "string"},
        "items": {"type": "array", "items": {"type": "string"}},
        "when": {"type": "string", "format": "date"},
        "inner": {"type": "object", "properties": {"n": {"type": "number", "minimum": 0}}},
    },
    "required": ["a", "name"],
    "additionalProperties": False,
}


def test_violations_empty_for_valid_args() -> None:
    validator = make_validator(SCHEMA)
    assert violations(validator, {"a": 1, "name": "n"}) == []
    args = {"a": 1, "name": "n", "items": ["x"], "when": "2026-01-02", "inner": {"n": 0}}
    assert violations(validator, args) == []


def test_violations_list_every_violation_with_its_path_sorted() -> None:
    validator = make_validator(SCHEMA)
    args = {"a": "one", "items": ["x", "y", 3], "inner": {"n": -1}, "extra": 1}
    found = violations(validator, args)
    assert found == sorted(found, key=lambda line: tuple(line.split(": ", 1)))
    assert len(found) == 5
    assert [line.split(": ", 1)[0] for line in found] == ["$", "$", "$.a", "$.inner.n", "$.items[2]"]
    assert '$.a: "one" is not of type "integer"' in found
    assert '$.items[2]: 3 is not of type "string"' in found
    assert "$.inner.n: -1 fails minimum 0" in found
    assert '$: "name" is a required property' in found
    assert '$: unexpected properties: "extra"' in found


def test_violations_missing_required_is_at_root() -> None:
    found = violations(make_validator(SCHEMA), {})
    assert found == ['$: "a" is a required property', '$: "name" is a required property']


def test_format_is_asserted() -> None:
    validator = make_validator(SCHEMA)
    found = violations(validator, {"a": 1, "name": "n", "when": "2026-13-45"})
    assert found == ['$.when: "2026-13-45" is not a valid "date"']


def test_long_violation_messages_are_shortened() -> None:
    validator = make_validator({"type": "object", "properties": {"s": {"type": "integer"}}})
    (line,) = violations(validator, {"s": "x" * 1_000})
    assert line.startswith('$.s: "xxx')
    assert line.endswith("...")
    assert len(line) < 200


# --- cost bounded by the input ------------------------------------------------------------

_BOUNDED_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from rho_actors.declarations.arguments import ArgumentsError, decode_arguments
key = "K" * 100_000
items = ",".join(["0"] * 60_000)
assert decode_arguments('{"%s": [%s]}' % (key, items))["K" * 100_000][-1] == 0
try:
    decode_arguments('{"%s": [%s, "\\\\ud800"]}' % (key, items))
except ArgumentsError as err:
    print(err)
"""


def test_a_long_key_over_a_large_array_decodes_in_memory_bounded_by_the_input() -> None:
    # 360 kB of arguments (well under the 1 MB bound): a path string built per item
    # would take 6 GB; the child has 1 GB of address space in all.
    import subprocess
    import sys

    command = [sys.executable, "-c", _BOUNDED_CHILD]
    child = subprocess.run(command, check=False, capture_output=True, text=True, timeout=WAIT_S)
    assert child.returncode == 0, child.stderr[-2000:]
    message = child.stdout.strip()
    assert message.startswith("arguments are not valid JSON: $.KKK")
    assert message.endswith("...[60000]: a string holds a lone surrogate")
    assert len(message) < 300
