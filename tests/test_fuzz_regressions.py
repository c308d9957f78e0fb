"""The faults fuzzing found (one test per kind, with the minimal inputs and siblings),
and bounded validation: no fetching, linear-time patterns, bounded keywords."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, Image, ToolCall, encode_output
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptError, checksum, load
from rho_actors.declarations.arguments import ArgumentsError, decode_arguments, make_validator, violations
from rho_actors.declarations.checks import DeclarationError, check_declaration
from rho_actors.declarations.formats import declaration
from rho_actors.encoding import cap_text
from rho_actors.tool import ToolResult
from tests.conftest import WAIT_S, slack

from .helpers import make_tool

pytestmark = pytest.mark.timeout(60)


def utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def raw(schema: Any, **extra: Any) -> dict[str, Any]:
    return {"name": "t", "description": "A tool.", "parameter_schema": schema, **extra}


def refusal(schema: Any) -> str:
    with pytest.raises(DeclarationError) as info:
        check_declaration(raw(schema))
    return str(info.value)


# --- 1. text that is not UTF-8 ------------------------------------------------------------


@pytest.mark.parametrize("text", ['"\ud800"', "[\"\udfff\"]", "\ud800", '{"a": 1}\ud800', "\udc00{}"])
def test_refusals_never_echo_a_lone_surrogate(text: str) -> None:
    with pytest.raises(ArgumentsError) as info:
        decode_arguments(text)
    assert utf8(str(info.value))


def test_result_text_is_always_utf8() -> None:
    assert ToolResult("c", "t", False, "bad \ud800 text").content == "bad \ufffd text"
    assert utf8(encode_output({"k\udfff": ["\ud800"]}).text)
    assert utf8(cap_text("\ud800" * 10, 3)[0])


def test_a_description_with_a_lone_surrogate_is_sent_as_utf8() -> None:
    info = check_declaration(raw({"type": "object"}) | {"description": "say \ud800 hi"})
    assert info.description == "say \ufffd hi"


def test_a_schema_with_a_lone_surrogate_is_left_out() -> None:
    assert "cannot be sent as UTF-8 JSON" in refusal({"type": "object", "description": "\ud800"})


# --- 2. the cap holds for refusals --------------------------------------------------------


def test_violation_lists_are_bounded() -> None:
    validator = make_validator({"type": "object", "additionalProperties": {"type": "integer"}})
    args = {f"key{'k' * 5000}{i}": "x" * 10_000 for i in range(500)}
    found = violations(validator, args)
    assert sum(len(line) for line in found) < 3_000
    assert found[-1].startswith("... and ")
    capped, truncated = cap_text("; ".join(violations(validator, {"a": "x", "b": "x", "c": "x"})), 100)
    assert truncated and len(capped) < 100 + 80


def capped_parts(content: str) -> tuple[str, str]:
    head, marker, rest = content.partition("\n[output truncated: ")
    assert marker, f"no size notice in {content!r}"
    return head, marker + rest


def test_refusals_built_in_the_loop_obey_the_output_cap(tmp_path: Path) -> None:
    ran: list[Any] = []
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, max_output_chars=100)
    try:
        system.register(make_tool("counts", lambda args, ctx: ran.append(args), schema=schema))
        for i in range(30):
            system.register(make_tool(f"tool_with_a_long_name_{i:02}"))
        results = system.start_loop("capped").run_turn([
            ToolCall("c1", "counts", '{"a": "x", "b": "x", "c": "x"}'),
            ToolCall("c2", "counts", "[" + "1, " * 500 + "1]"),
            ToolCall("c3", "nope", "{}"),
        ])
    finally:
        system.stop()
    assert [r.error_kind for r in results] == [ErrorKind.INVALID_ARGUMENTS, ErrorKind.INVALID_JSON,
                                              ErrorKind.UNKNOWN_TOOL]
    head, notice = capped_parts(results[0].content)
    assert head == ("invalid arguments for tool 'counts': $.a: \"x\" is not of type \"integer\"; "
                    '$.b: "x" is not of type "integer"; $.c: "x" is not')[:100]
    assert len(head) == 100 and notice.endswith("characters in all, the first 100 shown]")
    for result in results[1:]:
        head, notice = capped_parts(result.content)
        assert len(head) == 100 and notice.endswith("the first 100 shown]")
    assert ran == []


# --- 3. declaration checks ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "object", "pattern": "(?=a)"}, "RE2 cannot compile"),
        ({"type": "object", "patternProperties": {"(a": {}}}, "RE2 cannot compile"),
        ({"type": "object", "properties": {"a": {"pattern": "a{1001}"}}}, "RE2 cannot compile"),
        ({"type": "object", "properties": {"a": {"maximum": 10**4301}}}, "cannot be sent as UTF-8 JSON"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "does not resolve"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/b"}}}, "does not resolve"),
        ({"type": "object", "$ref": "#"}, "cycle"),
        ({"type": "object", "properties": {"a": {"$id": "x"}}}, "$id is allowed only at the top level"),
    ],
)
def test_what_cannot_be_sent_or_validated_is_left_out(schema: dict[str, Any], reason: str) -> None:
    assert reason in refusal(schema)


def test_the_overflowing_pattern_never_raises_anything_but_a_reason() -> None:
    schema = {"type": "object", "pattern": "a{4294967296}"}
    try:
        info = check_declaration(raw(schema))
    except DeclarationError:
        return
    validator = make_validator(info.parameter_schema)
    assert isinstance(violations(validator, {}), list)

    class Tool:
        name = staticmethod(lambda: "t")
        description = staticmethod(lambda: "A tool.")
        parameter_schema = staticmethod(lambda: schema)

    declaration(Tool)  # never raises


def test_local_refs_still_work() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "integer"}}}
    validator = make_validator(check_declaration(raw(schema)).parameter_schema)
    assert violations(validator, {"a": 1}) == []
    assert violations(validator, {"a": "x"}) == ['$.a: "x" is not of type "integer"']


# --- 4. encoding never raises -------------------------------------------------------------


def test_a_str_subclass_whose_methods_raise_is_encoded() -> None:
    class Hostile(str):
        def __str__(self) -> str:
            raise RuntimeError("no")

        def encode(self, *a: Any, **k: Any) -> bytes:
            raise RuntimeError("no")

        def __len__(self) -> int:
            raise RuntimeError("no")

    assert encode_output(Hostile("fine")).text == "fine"
    assert encode_output({"k": Hostile("v")}).text == '{"k": "v"}'

    class Unhashable:
        def __repr__(self) -> str:
            raise SystemExit(1)

    assert encode_output(Unhashable()).is_repr


# --- 5. images -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "mime", "error"),
    [("text", "image/png", TypeError), (b"x", None, TypeError), (b"x", "image/tiff", ValueError),
     (b"x", "", ValueError), (None, "image/png", TypeError)],
)
def test_bad_images_are_refused_when_made(data: Any, mime: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="Image"):
        Image(data, mime)


def test_image_types_are_normalised() -> None:
    assert Image(b"x", "image/PNG").mime_type == "image/png"
    assert Image(bytearray(b"x"), " Image/JPEG ").data == b"x"  # type: ignore[arg-type]


# --- C. message wording --------------------------------------------------------------------


def test_empty_arguments_say_an_object_is_expected() -> None:
    with pytest.raises(ArgumentsError, match=r"arguments were empty: send a JSON object, \{\}"):
        decode_arguments(ToolCall("c", "ping", "").arguments)


def test_messages_speak_json_and_hint_to_omit_null() -> None:
    schema = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                                               "flag": {"type": "boolean"}}}
    found = violations(make_validator(schema), {"query": "otters", "limit": None, "flag": "true"})
    assert found == [
        '$.flag: "true" is not of type "boolean"',
        '$.limit: null is not of type "integer"; to leave an optional field out, omit it instead of sending null',
    ]
    assert not any(word in line for line in found for word in ("None", "True", "dict"))


def test_an_integral_float_reaches_the_tool_as_an_int() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"},
                                               "l": {"type": "array", "items": {"type": "integer"}}}}
    args: dict[str, Any] = {"n": 3.0, "x": 3.0, "l": [1.0, 2]}
    assert violations(make_validator(schema), args) == []
    assert args == {"n": 3, "x": 3.0, "l": [1, 2]}
    assert type(args["n"]) is int and type(args["x"]) is float and type(args["l"][0]) is int


def test_a_bad_timeout_in_a_contract_tool_is_logged_once(logs: list[str]) -> None:
    for _ in range(3):
        info = check_declaration(raw({"type": "object"}, timeout_ms=2.5e3, concurrency="both"))
    assert info.timeout_ms == 30_000 and info.concurrency == "parallel"
    assert sum("timeout_ms() gave 2500.0 (float)" in m for m in logs) == 1
    assert sum("concurrency() gave 'both' (str)" in m for m in logs) == 1


# --- B. bounded validation, no fetching -----------------------------------------------------


def test_redos_pattern_validates_fast() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    validator = make_validator(check_declaration(raw(schema)).parameter_schema)
    started = time.perf_counter()
    found = violations(validator, {"s": "a" * 29 + "!"})
    assert time.perf_counter() - started < slack(2.0)  # backtracking took 18 s
    assert found == ['$.s: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaa!" does not match "^(a+)+$"']


def test_unique_items_over_thousands_of_objects_is_bounded() -> None:
    schema = {"type": "object", "properties": {"u": {"type": "array", "uniqueItems": True}}}
    validator = make_validator(schema)
    items = [{"id": i, "tags": [i, str(i)]} for i in range(5_000)]
    started = time.perf_counter()
    assert violations(validator, {"u": items}) == []
    assert violations(validator, {"u": [*items, {"tags": [0, "0"], "id": 0.0}]})[0].startswith("$.u: has non-unique")
    assert time.perf_counter() - started < slack(2.0)  # pairwise comparison took 8 s
    assert violations(validator, {"u": [1, True]}) == []  # true is not 1 in JSON Schema


def test_validation_stops_at_its_keyword_budget() -> None:
    schema = {"type": "object", "properties": {"l": {"type": "array", "items": {"anyOf": [
        {"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 10}]}}}}
    found = violations(make_validator(schema), {"l": [5] * 100_000})
    assert found == ["$: validation stopped after 200,000 schema checks; send smaller arguments"]


def test_oversized_argument_text_is_refused() -> None:
    with pytest.raises(ArgumentsError, match="at most 1,000,000 are accepted"):
        decode_arguments('{"a": "' + "x" * 1_000_000 + '"}')


@pytest.fixture
def listener() -> Any:
    """A loopback server that records every connection it is sent."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.05)
    accepted: list[Any] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(WAIT_S)
    server.close()


def test_remote_and_file_refs_are_left_out_and_nothing_connects(listener: Any, tmp_path: Path) -> None:
    port, accepted = listener
    secret = tmp_path / "schema.json"
    secret.write_text(json.dumps({"type": "integer"}))
    for ref in (f"http://127.0.0.1:{port}/s.json", f"file://{secret}", "s.json", f"http://127.0.0.1:{port}/#/x"):
        schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
        assert "is not a local reference" in refusal(schema)
        # a validator built anyway (bypassing the checks) refuses to retrieve
        result = violations(make_validator(schema), {"a": 1})
        assert result and "could not be validated" in result[0]
    assert accepted == []


# --- 7. transcript integrity ------------------------------------------------------------------


def _written(tmp_path: Path) -> Path:
    path = tmp_path / TRANSCRIPT_NAME
    from rho_actors.agent.model import Reply

    with Transcript(path) as t:
        t.user(1, "hi")
        t.reply(1, Reply("", (ToolCall("call_1", "add", '{"a": 1}'),)))
        t.result(1, 0, ToolResult("call_1", "add", True, "1"))
        t.reply(2, Reply("done"))
    return path


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _expect_error(path: Path, line: int, fragment: str) -> None:
    with pytest.raises(TranscriptError, match=f"line {line} is not a valid record: .*{fragment}"):
        load(path)


def test_a_flipped_byte_is_detected(tmp_path: Path) -> None:
    path = _written(tmp_path)
    path.write_bytes(path.read_bytes().replace(b"call_1", b"call_2", 1))
    _expect_error(path, 2, "checksum")


def test_swapped_lines_a_gap_and_a_repeat_are_detected(tmp_path: Path) -> None:
    path = _written(tmp_path)
    lines = _lines(path)
    path.write_bytes(b"".join([lines[0], lines[2], lines[1], lines[3]]))
    _expect_error(path, 2, "seq is 3 where 2 was due")
    path.write_bytes(b"".join([lines[0], lines[2], lines[3]]))
    _expect_error(path, 2, "seq is 3 where 2 was due")
    path.write_bytes(b"".join([lines[0], lines[1], lines[2], lines[1], lines[3]]))
    _expect_error(path, 4, "seq is 2 where 4 was due")


def test_an_exact_duplicate_line_is_repaired(tmp_path: Path, logs: list[str]) -> None:
    path = _written(tmp_path)
    good = load(path).messages
    lines = _lines(path)
    path.write_bytes(b"".join([lines[0], lines[1], lines[1], lines[2], lines[3]]))
    assert load(path).messages == good
    assert any("repeats line 2 exactly" in m for m in logs)
    with Transcript(path) as t:  # and appending continues the sequence
        t.user(3, "again")
    assert load(path).messages[-1].text == "again"


@pytest.mark.parametrize(
    ("change", "fragment"),
    [({"v": 3}, "unknown version 3"), ({"ok": "false"}, "ok must be true or false"),
     ({"content": 5}, "expected a string"), ({"images": {}}, "expected an array"),
     ({"ok": False}, "ok is false but error_kind is null"), ({"duration_ms": "1"}, "must be a number")],
)
def test_unknown_versions_and_ill_typed_fields_are_detected(tmp_path: Path, change: dict[str, Any],
                                                           fragment: str) -> None:
    path = _written(tmp_path)
    lines = _lines(path)
    record = json.loads(lines[2]) | change
    record["sum"] = checksum(record)  # a consistent forgery still fails the type checks
    lines[2] = (json.dumps(record) + "\n").encode()
    path.write_bytes(b"".join(lines))
    _expect_error(path, 3, fragment)


def test_a_downgraded_record_is_detected(tmp_path: Path) -> None:
    path = _written(tmp_path)
    lines = _lines(path)
    record = {k: v for k, v in json.loads(lines[1]).items() if k not in ("seq", "sum")} | {"v": 1}
    lines[1] = (json.dumps(record) + "\n").encode()
    path.write_bytes(b"".join(lines))
    _expect_error(path, 2, "a version 1 record after version 2 records")


def test_a_version_1_transcript_still_loads_and_grows(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    path.write_text('{"v": 1, "type": "user", "step": 1, "ts": 1.0, "text": "old"}\n'
                    '{"v": 1, "type": "reply", "step": 1, "ts": 2.0, "text": "ok", "tool_calls": [], '
                    '"model_ms": 1.0}\n')
    with Transcript(path) as t:
        t.user(2, "new")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[2]["v"] == 2 and records[2]["seq"] == 3
    assert [m.text for m in load(path).messages] == ["old", "ok", "new"]


def test_extra_fields_are_covered_by_the_checksum_and_ignored(tmp_path: Path) -> None:
    path = _written(tmp_path)
    lines = _lines(path)
    record = json.loads(lines[1]) | {"id_map": {"call_1": "model-id"}}
    record["sum"] = checksum(record)
    lines[1] = (json.dumps(record) + "\n").encode()
    path.write_bytes(b"".join(lines))
    assert len(load(path).messages) == 4
