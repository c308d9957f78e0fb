"""Property tests of the rules fuzzing established (issue: every text that reaches a
model, an SDK or a transcript is valid and bounded; the transcript detects tampering).

Strategies: argument text, schemas and declarations, tool outputs, provider conversations,
transcripts (mutations of ones the runtime wrote). Properties: the rules (a recorded
conversation is sent in a form each provider's loopback rules accept; a transcript line
changed whole is never dropped silently), plus exactly one result per call id in order,
``ok`` only when jsonschema accepts the instance, and the system keeps serving.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from jsonschema import Draft202012Validator

from rho_actors import ActorSystem, ErrorKind, ToolCall, encode_output
from rho_actors.agent.model import Message, Reply
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptError, load, read_records
from rho_actors.declarations.arguments import (
    MAX_REFUSAL_CHARS,
    ArgumentsError,
    decode_arguments,
    make_validator,
    violations,
)
from rho_actors.declarations.checks import DeclarationError, check_declaration
from rho_actors.tool import ToolResult

pytestmark = pytest.mark.timeout(600)


def utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_data = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                                                 max_size=4),
                         max_leaves=20)
argument_text = st.one_of(
    st.text(),
    json_data.map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.builds(lambda v, cut: json.dumps(v)[:cut], json_data, st.integers(0, 40)),
    st.sampled_from(['"\ud800"', "", " ", "{}", '{"a": NaN}', '{"a":1}{"a":2}', "[" * 80 + "]" * 80]),
)

simple_type = st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object"])
leaf_schema = st.one_of(
    st.builds(lambda t: {"type": t}, simple_type),
    st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 5)),
    st.builds(lambda n: {"type": "integer", "minimum": n}, st.integers(-5, 5)),
    st.builds(lambda v: {"enum": v}, st.lists(json_leaf, min_size=1, max_size=3)),
    st.just({"type": "array", "uniqueItems": True}),
    st.just({"type": "string", "pattern": "^[a-z]+$"}),
)
sub_schema = st.recursive(leaf_schema, lambda inner: st.one_of(
    st.builds(lambda p: {"type": "object", "properties": p}, st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    st.builds(lambda i: {"type": "array", "items": i}, inner),
    st.builds(lambda a: {"anyOf": a}, st.lists(inner, min_size=1, max_size=3)),
), max_leaves=6)
object_schema = st.builds(
    lambda props, req, extra: {"type": "object", "properties": props, "required": [k for k in props if k in req],
                               "additionalProperties": extra},
    st.dictionaries(st.text(max_size=5), sub_schema, max_size=4), st.lists(st.text(max_size=5), max_size=2),
    st.booleans() | sub_schema,
)


@given(argument_text)
def test_argument_text_is_decoded_or_refused_in_valid_bounded_utf8(text: str) -> None:
    try:
        assert isinstance(decode_arguments(text), dict)
    except ArgumentsError as err:
        assert err.kind is ErrorKind.INVALID_JSON
        assert utf8(str(err)) and len(str(err)) <= MAX_REFUSAL_CHARS + 3


@given(object_schema, st.data())
def test_valid_only_when_jsonschema_accepts(schema: dict[str, Any], data: st.DataObject) -> None:
    info = check_declaration({"name": "t", "description": "d", "parameter_schema": schema})
    leaf = data.draw(leaf_schema.filter(lambda s: s.get("type") not in ("object", "array")))
    fitting = st.builds(lambda v: {"v": v}, from_schema(leaf))  # hypothesis-jsonschema: values a schema accepts
    instance = data.draw(st.one_of(fitting, st.dictionaries(st.text(max_size=5), json_data, max_size=4)))
    if "v" in instance and len(instance) == 1:
        schema = {**schema, "properties": {**schema["properties"], "v": leaf}}
        info = check_declaration({"name": "t", "description": "d", "parameter_schema": schema})
    accepted = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER).is_valid(instance)
    found = violations(make_validator(info.parameter_schema), instance)
    assert (found == []) == accepted
    assert all(utf8(line) for line in found) and sum(map(len, found)) <= MAX_REFUSAL_CHARS + 100


declaration_parts = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=70) | json_leaf, "description": st.text() | json_leaf,
    "parameter_schema": object_schema | json_data | st.builds(lambda p: {"type": "object", "pattern": p}, st.text()),
    "timeout_ms": json_leaf, "concurrency": json_leaf,
})


@given(declaration_parts)
def test_declarations_are_accepted_usable_or_left_out_with_a_reason(raw: dict[str, Any]) -> None:
    try:
        info = check_declaration(raw)
    except DeclarationError as err:
        assert str(err)
        return
    text = json.dumps({"d": info.description, "s": info.parameter_schema}, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # both SDKs can send it
    validator = make_validator(info.parameter_schema)
    assert isinstance(violations(validator, {}), list)


class _Weird:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _LyingStr(str):
    def __str__(self) -> str:
        raise RuntimeError("no str")


tool_output = st.recursive(
    json_leaf | st.builds(_Weird) | st.text().map(_LyingStr) | st.binary() | st.sets(st.integers()),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text() | st.integers(), inner, max_size=4),
    max_leaves=15,
)


@given(tool_output, st.integers(1, 200))
def test_encoding_never_raises_and_is_valid_bounded_utf8(value: Any, cap: int) -> None:
    out = encode_output(value, cap)
    assert utf8(out.text) and len(out.text) <= cap + 100


def _real_transcript(folder: Path) -> Path:
    path = folder / TRANSCRIPT_NAME
    with Transcript(path) as t:
        t.user(1, "what is 1 + 2?")
        t.reply(1, Reply("", (ToolCall("call_1", "add", '{"a": 1, "b": 2}'), ToolCall("call_2", "add", {"a": 3}))))
        t.result(1, 0, ToolResult("call_1", "add", True, "3"))
        t.result(1, 1, ToolResult("call_2", "add", False, "missing b", ErrorKind.INVALID_ARGUMENTS))
        t.reply(2, Reply("3"))
        t.error(3, "max_steps", "stopped")
    return path


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("swap"), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("drop"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("dup"), st.integers(0, 5), st.integers(0, 6)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
)


@given(st.lists(mutation, min_size=1, max_size=3))
def test_a_mutated_transcript_is_detected_or_reads_back_unchanged(mutations: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _real_transcript(Path(folder))
        original = load(path).messages
        original_records = read_records(path)[0]
        written = data = path.read_bytes()
        for kind, a, b in mutations:
            lines = data.splitlines(keepends=True)
            if not lines:
                break
            if kind == "flip" and data:
                data = data[: a % len(data)] + bytes([data[a % len(data)] ^ b]) + data[a % len(data) + 1:]
            elif kind == "swap":
                lines[a % len(lines)], lines[b % len(lines)] = lines[b % len(lines)], lines[a % len(lines)]
                data = b"".join(lines)
            elif kind == "drop":
                del lines[a % len(lines)]
                data = b"".join(lines)
            elif kind == "dup":
                lines.insert(b % (len(lines) + 1), lines[a % len(lines)])
                data = b"".join(lines)
            elif kind == "cut":
                data = data[: a % (len(data) + 1)]
        assume(data)
        path.write_bytes(data)
        try:
            history = load(path)
        except TranscriptError as err:
            assert "line " in str(err)
            return
        # accepted: the same records, or a prefix of them only where a write may have been
        # cut short: the file is a prefix of what was written, or its last line is torn (no
        # newline, or NUL bytes); a whole changed line is never dropped silently
        records = read_records(path)[0]
        torn = not data.endswith(b"\n") or b"\0" in data[:-1].rsplit(b"\n", 1)[-1]
        assert records == original_records or (
            records == original_records[: len(records)] and (written.startswith(data) or torn)
        ), (mutations, len(records))
        assert history.messages == original[: len(history.messages)] or history.pending


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from rho_actors import tool

    @tool
    def echo(text: str, times: int = 1) -> str:
        """Repeat the text."""
        return text * times

    system = ActorSystem(data_dir=tmp_path_factory.mktemp("data"), max_output_chars=200)
    system.register(echo)
    yield system.start_loop("fuzz")
    system.stop()


call = st.builds(ToolCall, st.text(max_size=8), st.sampled_from(["echo", "nope", "\ud800"]),
                 argument_text | st.dictionaries(st.text(max_size=5), json_data, max_size=3))


@given(st.lists(call, min_size=1, max_size=5))
def test_one_result_per_call_in_order_and_the_system_keeps_serving(serving: Any, calls: list[ToolCall]) -> None:
    results = serving.run_turn(calls, timeout_s=30)
    assert [r.call_id for r in results] == [c.id for c in calls]
    for result in results:
        assert utf8(result.content)
        assert result.ok == (result.error_kind is None)
    [again] = serving.run_turn([ToolCall("ok", "echo", '{"text": "x"}')], timeout_s=30)
    assert again.ok and again.content == "x"


# --- provider conversations ---------------------------------------------------------------

small_id = st.sampled_from(["", "c1", "c1", "c 2", "call.3", "\ud800", "x" * 70]) | st.text(max_size=6)
conversation_call = st.builds(
    ToolCall, small_id, st.sampled_from(["ping", "", "odd name!", "p" * 80, "\udfff"]),
    argument_text | st.dictionaries(st.text(max_size=5), json_data, max_size=3),
)
conversation_message = st.one_of(
    st.builds(Message.user, st.text(max_size=8)),
    st.builds(Message.system, st.text(max_size=8)),
    st.builds(Message.assistant, st.text(max_size=8), st.lists(conversation_call, max_size=4)),
    st.builds(lambda cid, ok, text: Message("tool", text, (), cid, "ping", not ok), small_id, st.booleans(),
              st.text(max_size=8)),
)


@given(st.lists(conversation_message, min_size=1, max_size=8))
def test_any_recorded_conversation_is_sent_in_a_form_each_provider_accepts(messages: list[Message]) -> None:
    from rho_actors.agent.provider_rules import ANTHROPIC_RULES, OPENAI_RULES, sanitise
    from rho_actors.agent.providers.anthropic import to_anthropic_request
    from rho_actors.agent.providers.openai import to_openai_messages
    from tests.wire_server import anthropic_violation, openai_violation

    wire = to_openai_messages(messages)
    if wire:
        assert openai_violation({"messages": wire}) is None, wire
        json.dumps(wire, ensure_ascii=False, allow_nan=False).encode("utf-8")
    system, turns = to_anthropic_request(messages)
    if turns:
        body = {"messages": turns, **({"system": system} if system else {})}
        assert anthropic_violation(body) is None, body
        json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    for rules in (OPENAI_RULES, ANTHROPIC_RULES):
        once = sanitise(messages, rules)
        assert sanitise(once, rules) == once
