"""Output encoding (encoding.py): the text a model reads for what a tool returned."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import pathlib
import uuid
from typing import Any

import pydantic
import pytest

from rho_actors import EncodedOutput, encode_output
from rho_actors.encoding import DEFAULT_MAX_OUTPUT_CHARS, REPR_MARK, scrub_strings, scrub_text


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN/Infinity and lone surrogates: strict RFC 8259 JSON."""

    def refuse(token: str) -> Any:
        raise ValueError(f"non-strict constant {token}")

    text.encode("utf-8")  # raises on a lone surrogate
    return json.loads(text, parse_constant=refuse)


def as_json(value: Any) -> Any:
    out = encode_output(value)
    assert not out.is_repr, out.text
    return strict_loads(out.text)


class Color(enum.Enum):
    RED = "red"
    BLUE = 5


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    FAST = "fast"


class Shade(str, enum.Enum):  # noqa: UP042 -- the str mixin is the point
    DARK = "dark"


@dataclasses.dataclass
class Point:
    x: int
    y: float


@dataclasses.dataclass
class Shape:
    name: str
    corners: list[Point]
    when: datetime.date


class Model(pydantic.BaseModel):
    a: int
    when: datetime.datetime
    tags: set[str]


# --- str ------------------------------------------------------------------------------


def test_str_passes_through_unchanged() -> None:
    text = 'plain "text"\nwith ünïcode 😀'
    assert encode_output(text) == EncodedOutput(text, False, False, len(text))


def test_lone_surrogate_in_str_is_replaced_and_pair_survives() -> None:
    assert encode_output("a\ud800b").text == "a\ufffdb"
    assert encode_output("\udc00").text == "\ufffd"
    assert encode_output("😀\ud800").text == "😀\ufffd"
    # two surrogate code points that form a valid pair are joined
    assert encode_output("\ud83d\ude00").text == "😀"
    encode_output("x\ud800").text.encode("utf-8")


def test_lone_surrogate_in_nested_data_is_replaced() -> None:
    out = encode_output({"k\udfff": ["v\ud800", "😀", {"n": "\ud83d\ude00"}]})
    out.text.encode("utf-8")
    assert strict_loads(out.text) == {"k\ufffd": ["v\ufffd", "😀", {"n": "😀"}]}


def test_scrub_text() -> None:
    assert scrub_text("fine") == "fine"
    assert scrub_text("x\ud800a\udc00b") == "x\ufffda\ufffdb"


# --- strict JSON ----------------------------------------------------------------------


def test_nan_and_infinities_become_null_and_output_is_strict() -> None:
    out = encode_output({"a": float("nan"), "b": [float("inf"), -float("inf")], "c": 1.5})
    assert strict_loads(out.text) == {"a": None, "b": [None, None], "c": 1.5}
    assert "NaN" not in out.text and "Infinity" not in out.text
    assert encode_output(float("nan")).text == "null"


def test_plain_json_values() -> None:
    assert encode_output(None).text == "null"
    assert encode_output(True).text == "true"
    assert encode_output(42).text == "42"
    assert encode_output([1, "a", None]).text == '[1, "a", null]'
    assert encode_output({"a": {"b": []}}).text == '{"a": {"b": []}}'


def test_non_ascii_is_kept_as_is() -> None:
    assert encode_output({"s": "ünï 😀"}).text == '{"s": "ünï 😀"}'


def test_docstring_example() -> None:
    assert encode_output({"when": datetime.date(2026, 1, 2), "tags": {"b", "a"}}).text == (
        '{"when": "2026-01-02", "tags": ["a", "b"]}'
    )


def test_datetime_date_time_as_iso_8601() -> None:
    tz = datetime.timezone(datetime.timedelta(hours=2))
    assert as_json(
        {
            "dt": datetime.datetime(2026, 1, 2, 3, 4, 5),
            "aware": datetime.datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=tz),
            "d": datetime.date(2026, 12, 31),
            "t": datetime.time(23, 59, 1),
        }
    ) == {
        "dt": "2026-01-02T03:04:05",
        "aware": "2026-01-02T03:04:05.000600+02:00",
        "d": "2026-12-31",
        "t": "23:59:01",
    }


def test_sets_are_sorted_lists() -> None:
    assert as_json({3, 1, 2}) == [1, 2, 3]
    assert as_json(frozenset({"b", "c", "a"})) == ["a", "b", "c"]
    assert as_json({"s": {2.5, -1}}) == {"s": [-1, 2.5]}


def test_mixed_type_set_is_deterministic() -> None:
    value = {1, "a", None, (2, 3), 0.5}
    first = encode_output(value)
    assert not first.is_repr
    assert sorted(map(json.dumps, strict_loads(first.text))) == sorted(map(json.dumps, [1, "a", None, [2, 3], 0.5]))
    for _ in range(5):
        assert encode_output(set(value)).text == first.text
    assert encode_output({"a", 1}).text == encode_output({1, "a"}).text


def test_decimal_uuid_path_as_strings() -> None:
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert as_json([decimal.Decimal("1.10"), u, pathlib.Path("/tmp/x.txt"), pathlib.PurePosixPath("a/b")]) == [
        "1.10",
        "12345678-1234-5678-1234-567812345678",
        "/tmp/x.txt",
        "a/b",
    ]


def test_enums_as_their_value() -> None:
    assert as_json([Color.RED, Color.BLUE, Level.HIGH, Mode.FAST]) == ["red", 5, 2, "fast"]
    assert encode_output(Level.LOW).text == "1"


def test_str_mixin_enum_as_its_value() -> None:
    # DESIGN §2 / encoding docstring: an Enum is encoded as its value, whatever its mixin.
    assert as_json({"shade": Shade.DARK}) == {"shade": "dark"}
    assert as_json({Shade.DARK: 1}) == {"dark": 1}


def test_dataclass_and_nested_dataclass_as_objects() -> None:
    shape = Shape("tri", [Point(0, 0.5), Point(1, float("nan"))], datetime.date(2026, 1, 2))
    assert as_json(shape) == {
        "name": "tri",
        "corners": [{"x": 0, "y": 0.5}, {"x": 1, "y": None}],
        "when": "2026-01-02",
    }


def test_dataclass_class_itself_is_not_an_object() -> None:
    out = encode_output(Point)
    assert out.is_repr and out.text.startswith(REPR_MARK)


def test_pydantic_model_as_object() -> None:
    m = Model(a=1, when=datetime.datetime(2026, 1, 2, 3, 4, 5), tags={"x"})
    assert as_json({"m": m}) == {"m": {"a": 1, "when": "2026-01-02T03:04:05", "tags": ["x"]}}


def test_tuple_as_array() -> None:
    assert encode_output((1, (2, "x"))).text == '[1, [2, "x"]]'


def test_non_str_dict_keys() -> None:
    u = uuid.UUID(int=1)
    value = {7: "int", None: "none", True: "bool", Level.HIGH: "intenum", Color.BLUE: "enum", u: "uuid", 2.5: "f"}
    assert as_json(value) == {
        "7": "int",
        "null": "none",
        "true": "bool",
        "2": "intenum",
        "5": "enum",
        str(u): "uuid",
        "2.5": "f",
    }
    assert as_json({datetime.date(2026, 1, 2): 1, pathlib.Path("p"): 2}) == {"2026-01-02": 1, "p": 2}
    assert as_json({Mode.FAST: 1}) == {"fast": 1}


def test_enum_key_with_str_value() -> None:
    # "an Enum as its value" and "non-string dict keys as strings": Color.RED's value is "red".
    assert as_json({Color.RED: 1}) == {"red": 1}


def test_unsupported_dict_key_falls_back_to_repr() -> None:
    out = encode_output({(1, 2): "tuple key"})
    assert out.is_repr
    assert out.text == REPR_MARK + "{(1, 2): 'tuple key'}"


def test_shared_reference_is_not_a_cycle() -> None:
    shared = [1, 2]
    assert as_json({"a": shared, "b": shared}) == {"a": [1, 2], "b": [1, 2]}


# --- fallback to repr ------------------------------------------------------------------


def test_object_falls_back_to_marked_repr() -> None:
    obj = object()
    out = encode_output(obj)
    assert out.is_repr
    assert out.text == REPR_MARK + repr(obj)
    assert REPR_MARK.startswith("[not JSON-encodable")


def test_object_nested_in_data_falls_back_for_the_whole_value() -> None:
    class Thing:
        def __repr__(self) -> str:
            return "<Thing>"

    out = encode_output({"a": [1, Thing()]})
    assert out.is_repr
    assert out.text == REPR_MARK + "{'a': [1, <Thing>]}"


def test_bytes_fall_back_to_repr() -> None:
    out = encode_output(b"\x00ab")
    assert out.is_repr and out.text == REPR_MARK + "b'\\x00ab'"


def test_cycle_falls_back_to_repr() -> None:
    cyc: list[Any] = [1]
    cyc.append(cyc)
    out = encode_output(cyc)
    assert out.is_repr
    assert out.text == REPR_MARK + "[1, [...]]"
    d: dict[str, Any] = {}
    d["self"] = d
    assert encode_output(d).is_repr


def test_very_deep_nesting_falls_back_without_raising() -> None:
    deep: list[Any] = []
    for _ in range(500):
        deep = [deep]
    out = encode_output(deep)
    assert out.is_repr and out.text.startswith(REPR_MARK)


def test_repr_that_raises_still_gives_text() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    out = encode_output(Broken())
    assert out.is_repr
    assert out.text.startswith(REPR_MARK)
    assert "Broken" in out.text and "repr raised" in out.text


def test_repr_that_exits_still_gives_text() -> None:
    class Exits:
        def __repr__(self) -> str:
            raise SystemExit(3)

    out = encode_output(Exits())
    assert out.is_repr and "Exits" in out.text


def test_repr_with_lone_surrogate_is_scrubbed() -> None:
    class Weird:
        def __repr__(self) -> str:
            return "<weird \ud800>"

    out = encode_output(Weird())
    assert out.text == REPR_MARK + "<weird \ufffd>"


def test_scrub_strings_fixes_every_string_keys_too_at_any_depth_leaving_its_input_alone() -> None:
    """The one walk of a transcript record's and a child's plain data: every string,
    keys too, through the fix; new containers (a tuple a list), the input untouched;
    deeper than the recursion limit (the transcript's recursive walk raised there)."""
    value = {"k\ud800": ["a\udc00", ("t\ud801", 1, None)], 2: {"x": 1.5}}
    assert scrub_strings(value) == {"k\ufffd": ["a\ufffd", ["t\ufffd", 1, None]], 2: {"x": 1.5}}
    assert value == {"k\ud800": ["a\udc00", ("t\ud801", 1, None)], 2: {"x": 1.5}}
    assert scrub_strings(["a\x1b", {"b": "c"}], str.upper) == ["A\x1b", {"B": "C"}]
    nested: Any = "\ud800"
    for _ in range(5_000):
        nested = {"n": nested}
    out = scrub_strings(nested)
    for _ in range(5_000):
        out = out["n"]
    assert out == "\ufffd"


def test_model_dump_that_raises_falls_back() -> None:
    class FakeModel:
        def model_dump(self, mode: str = "python") -> Any:
            raise ValueError("cannot dump")

        def __repr__(self) -> str:
            return "FakeModel()"

    out = encode_output({"m": FakeModel()})
    assert out.is_repr
    assert out.text == REPR_MARK + "{'m': FakeModel()}"


def test_model_dump_that_exits_falls_back() -> None:
    # encode_output "never raises": a BaseException from the value's own code is output too.
    class ExitingModel:
        def model_dump(self, mode: str = "python") -> Any:
            raise SystemExit(1)

        def __repr__(self) -> str:
            return "ExitingModel()"

    out = encode_output(ExitingModel())
    assert out.is_repr
    assert out.text == REPR_MARK + "ExitingModel()"


# --- the cap ---------------------------------------------------------------------------


def test_default_cap() -> None:
    assert DEFAULT_MAX_OUTPUT_CHARS == 100_000
    out = encode_output("x" * 100_001)
    assert out.truncated and out.original_chars == 100_001
    assert out.text.startswith("x" * 100_000 + "\n")
    assert "100,001" in out.text


def test_long_text_is_cut_with_notice_of_original_size() -> None:
    out = encode_output("abcdef" * 2_000, max_chars=10)
    assert out.truncated is True
    assert out.original_chars == 12_000
    assert out.text.startswith("abcdefabcd\n")
    notice = out.text[10:]
    assert "truncated" in notice
    assert "12,000" in notice
    assert not out.is_repr


def test_long_json_is_cut_too() -> None:
    value = list(range(2_000))
    full = json.dumps(value)
    out = encode_output(value, max_chars=50)
    assert out.truncated and out.original_chars == len(full)
    assert out.text.startswith(full[:50])
    assert f"{len(full):,}" in out.text[50:]


def test_exactly_max_chars_is_not_cut() -> None:
    out = encode_output("y" * 40, max_chars=40)
    assert out == EncodedOutput("y" * 40, False, False, 40)
    out = encode_output("y" * 41, max_chars=40)
    assert out.truncated and out.original_chars == 41


def test_repr_fallback_is_capped_too() -> None:
    class Long:
        def __repr__(self) -> str:
            return "L" * 1_000

    out = encode_output(Long(), max_chars=100)
    assert out.is_repr and out.truncated
    assert out.original_chars == len(REPR_MARK) + 1_000
    assert out.text.startswith(REPR_MARK)


@pytest.mark.parametrize("size", [1_234_567])
def test_notice_uses_thousands_separators(size: int) -> None:
    out = encode_output("z" * size, max_chars=5)
    assert "1,234,567" in out.text
    assert out.original_chars == size
