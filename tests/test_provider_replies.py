"""Replies other frameworks' bug reports found mishandled, through the real SDKs against the
loopback servers (tests/wire_server.py): parallel streamed calls sharing an ``index``,
name pieces equal to the name so far, ``arguments`` sent as a JSON object or another
JSON value, and replies cut off by the token limit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, tool
from rho_actors.agent.driver import FinalResult, PromptResult, prompt, stream
from rho_actors.agent.providers import RetryPolicy
from rho_actors.agent.providers.anthropic import AnthropicModel
from rho_actors.agent.providers.openai import OpenAIModel
from rho_actors.agent.transcript import TRANSCRIPT_NAME, read_records
from rho_actors.tool import ErrorKind
from tests.conftest import WAIT_S
from tests.wire_server import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    Response,
    WireServer,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
    text_block,
    tool_use_block,
)

FAST = RetryPolicy(attempts=1, total_s=5.0)
RUNS: list[tuple[str, Any]] = []


@tool
def write_file(path: str, mode: str = "overwrite") -> str:
    """Write a file (records the call: a side effect)."""
    RUNS.append(("write_file", (path, mode)))
    return f"wrote {path} ({mode})"


@tool
def a(n: int = 0) -> str:
    """A tool named a."""
    RUNS.append(("a", n))
    return f"a {n}"


@tool
def aa(n: int = 0) -> str:
    """A tool named aa."""
    RUNS.append(("aa", n))
    return f"aa {n}"


@tool
def get_(n: int = 0) -> str:
    """A tool named get_."""
    RUNS.append(("get_", n))
    return f"get_ {n}"


@tool
def get_get_(n: int = 0) -> str:
    """A tool named get_get_."""
    RUNS.append(("get_get_", n))
    return f"get_get_ {n}"


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Any]:
    RUNS.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        for t in (write_file, a, aa, get_, get_get_):
            system.register(t)
        yield system.start_loop("replies")
    finally:
        system.stop()


def openai_model(server: WireServer, **options: Any) -> OpenAIModel:
    return OpenAIModel("gpt-test", base_url=server.openai_url, api_key="k", retry=FAST, timeout_s=WAIT_S, **options)


def anthropic_model(server: WireServer, **options: Any) -> AnthropicModel:
    return AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="k", retry=FAST, timeout_s=WAIT_S,
                          **options)


def chunk(delta: Any, finish: str | None = None) -> tuple[None, dict[str, Any]]:
    return None, {"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def part(index: Any, cid: str | None, name: str | None, arguments: Any) -> tuple[None, dict[str, Any]]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "type": "function", "function": function}
    if cid is not None:
        call["id"] = cid
    return chunk({"tool_calls": [call]})


def streamed(*chunks: Any, finish: str = "tool_calls") -> list[Any]:
    return [chunk({"role": "assistant", "content": ""}), *chunks, chunk({}, finish), (None, "[DONE]")]


def streamed_prompt(server: WireServer, loop: Any, reply: list[Any]) -> PromptResult:
    server.script(OPENAI_PATH, Response(200, reply), Response(200, openai_stream(["done"])))
    with openai_model(server) as model:
        events = list(stream(loop, "go", model=model))
    final = events[-1]
    assert isinstance(final, FinalResult)
    return final.result


# --- streamed parallel calls that share an index (issue 23.2, 24.6) ------------------------

SHARED_INDEX = {
    # Ollama, LiteLLM and Gemini adapters: every call with index 0 and its own id, each whole
    "each call whole": [part(0, "call_a", "write_file", '{"path": "x"}'),
                        part(0, "call_b", "write_file", '{"path": "y"}')],
    # each call in pieces, one call after the other
    "each call in pieces": [part(0, "call_a", "write_file", '{"pa'), part(0, None, None, 'th": "x"}'),
                            part(0, "call_b", "write_file", '{"path"'), part(0, None, None, ': "y"}')],
    # the pieces interleaved, each carrying its call's id
    "interleaved with ids": [part(0, "call_a", "write_file", '{"pa'), part(0, "call_b", "write_file", '{"path"'),
                             part(0, "call_a", None, 'th": "x"}'), part(0, "call_b", None, ': "y"}')],
    # interleaved without ids: the piece goes to the call still open
    "interleaved, a whole call between": [part(0, "call_a", "write_file", '{"path": '),
                                          part(0, "call_b", "write_file", '{"path": "y"}'),
                                          part(0, None, None, '"x"}')],
}


@pytest.mark.parametrize("case", list(SHARED_INDEX))
def test_parallel_streamed_calls_that_share_an_index_each_run(server: WireServer, loop: Any, case: str) -> None:
    result = streamed_prompt(server, loop, streamed(*SHARED_INDEX[case]))
    assert result.ok, result.error
    calls = result.steps[0].reply.tool_calls
    assert [(c.id, c.name, json.loads(str(c.arguments))) for c in calls] == [
        ("call_a", "write_file", {"path": "x"}), ("call_b", "write_file", {"path": "y"})]
    assert sorted(RUNS) == [("write_file", ("x", "overwrite")), ("write_file", ("y", "overwrite"))]
    assert [r.ok for r in result.steps[0].results] == [True, True]


def test_the_readme_example_server_shape_distinct_indexes_still_work(server: WireServer, loop: Any) -> None:
    reply = openai_stream(tool_calls=[("c1", "a", '{"n": 1}'), ("c2", "aa", '{"n": 2}')])
    result = streamed_prompt(server, loop, reply)
    assert result.ok, result.error
    assert sorted(RUNS) == [("a", 1), ("aa", 2)]


NAME_PIECES = {
    # a piece equal to the name so far is a piece, not a repeat (issue 24.5)
    '"a" + "a"': ([part(0, "c1", "a", ""), part(0, None, "a", ""), part(0, None, None, '{"n": 1}')], ("aa", 1)),
    '"get_" + "get_"': ([part(0, "c1", "get_", ""), part(0, None, "get_", '{"n": 2}')], ("get_get_", 2)),
    # a repeat of a complete name (the arguments began, or the part repeats the id) is one
    "the whole name again after the arguments began": (
        [part(0, "c1", "get_", '{"n"'), part(0, None, "get_", ": 3}")], ("get_", 3)),
    "the whole name again with the id": ([part(0, "c1", "a", '{"n"'), part(0, "c1", "a", ": 4}")], ("a", 4)),
}


@pytest.mark.parametrize("case", list(NAME_PIECES))
def test_name_pieces_are_joined_and_only_a_complete_name_counts_as_a_repeat(
    server: WireServer, loop: Any, case: str
) -> None:
    chunks, ran = NAME_PIECES[case]
    result = streamed_prompt(server, loop, streamed(*chunks))
    assert result.ok, result.error
    assert [ran] == RUNS


# --- arguments sent as a JSON object (issue 23.3) --------------------------------------------


def completion_with_arguments(arguments: Any) -> dict[str, Any]:
    body = openai_completion(None, [("c1", "write_file", "{}")])
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = arguments
    return body


def test_arguments_sent_as_a_json_object_are_the_arguments(server: WireServer, loop: Any) -> None:
    server.script(OPENAI_PATH, Response(200, completion_with_arguments({"path": "notes.txt", "mode": "append"})),
                  Response(200, openai_completion("done")), Response(200, openai_completion("again")))
    with openai_model(server) as model:
        first = prompt(loop, "write", model=model)
        second = prompt(loop, "more", model=model)
    assert first.ok and second.ok, (first.error, second.error)
    assert RUNS == [("write_file", ("notes.txt", "append"))]
    # recorded, and replayed on every later request, as its JSON text
    reply = next(r for r in read_records(loop.data_dir / TRANSCRIPT_NAME)[0] if r["type"] == "reply")
    assert json.loads(reply["tool_calls"][0]["arguments"]) == {"path": "notes.txt", "mode": "append"}
    for body in server.bodies(OPENAI_PATH)[1:]:
        assistant = next(m for m in body["messages"] if m["role"] == "assistant" and m.get("tool_calls"))
        sent = assistant["tool_calls"][0]["function"]["arguments"]
        assert isinstance(sent, str) and json.loads(sent) == {"path": "notes.txt", "mode": "append"}


@pytest.mark.parametrize(("arguments", "named"), [
    ([1, 2], "got array: [1,2]"), (5, "got integer: 5"), (True, "got boolean: true"), (None, "got null: null"),
])
def test_arguments_of_another_shape_are_an_error_naming_what_arrived(
    server: WireServer, loop: Any, arguments: Any, named: str
) -> None:
    server.script(OPENAI_PATH, Response(200, completion_with_arguments(arguments)),
                  Response(200, openai_completion("done")))
    with openai_model(server) as model:
        result = prompt(loop, "write", model=model)
    assert result.ok, result.error
    [call_result] = result.steps[0].results
    assert call_result.error_kind == ErrorKind.INVALID_JSON
    assert "arguments must be a JSON object" in call_result.content
    assert named.replace(" ", "") in call_result.content.replace(" ", "")
    assert RUNS == []


def test_streamed_arguments_sent_as_an_object_are_the_arguments(server: WireServer, loop: Any) -> None:
    result = streamed_prompt(server, loop, streamed(part(0, "c1", "write_file", {"path": "s.txt"})))
    assert result.ok, result.error
    assert RUNS == [("write_file", ("s.txt", "overwrite"))]


# --- a reply cut off by the token limit (issue 23.5) -------------------------------------------


def test_an_openai_call_cut_off_by_the_token_limit_never_runs(server: WireServer, loop: Any) -> None:
    cut = openai_completion(None, [("c1", "write_file", '{"path": "a.txt"}'), ("c2", "write_file", '{"path": "b')],
                            finish_reason="length")
    cut["usage"]["completion_tokens"] = 64
    server.script(OPENAI_PATH, Response(200, cut), Response(200, openai_completion("again")))
    with openai_model(server, max_tokens=64) as model:
        result = prompt(loop, "write", model=model)
        after = prompt(loop, "go on", model=model)
    assert RUNS == [("write_file", ("a.txt", "overwrite"))]  # the call the model finished ran
    first, last = result.steps[0].results
    assert first.ok
    assert not last.ok and last.error_kind == ErrorKind.INVALID_JSON
    assert "token limit" in last.content and "64" in last.content and "did not run" in last.content
    assert result.error is not None and "token limit" in result.error and "64" in result.error
    assert after.ok and after.text == "again", after.error  # the session goes on


@pytest.mark.parametrize("streamed_reply", [False, True])
def test_an_anthropic_call_cut_off_by_max_tokens_never_runs(
    server: WireServer, loop: Any, streamed_reply: bool
) -> None:
    if streamed_reply:  # the SDK parses the partial JSON: a dict of what came, "mode" missing
        body: Any = anthropic_stream(tool_uses=[("t1", "write_file", {"path": "a.txt", "mode": "append"})])
        body = body[:-4]  # the last piece of the input never comes
        body += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
                 ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens",
                                                                        "stop_sequence": None},
                                    "usage": {"output_tokens": 32}}),
                 ("message_stop", {"type": "message_stop"})]
    else:
        body = anthropic_message([tool_use_block("t1", "write_file", {"path": "a.txt"})], stop_reason="max_tokens")
        body["usage"]["output_tokens"] = 32
    server.script(ANTHROPIC_PATH, Response(200, body), Response(200, anthropic_message([text_block("again")])))
    with anthropic_model(server, max_tokens=32) as model:
        if streamed_reply:
            final = list(stream(loop, "write", model=model))[-1]
            assert isinstance(final, FinalResult)
            result = final.result
        else:
            result = prompt(loop, "write", model=model)
        after = prompt(loop, "go on", model=model)
    assert RUNS == []
    [cut] = result.steps[0].results
    assert not cut.ok and "token limit" in cut.content and "32" in cut.content
    assert result.error is not None and "token limit" in result.error
    assert after.ok and after.text == "again", after.error


# --- declarations a provider refuses (issue 23.4) ----------------------------------------------


class Declared:
    """A tool whose parameter schema is given as it is (as an MCP server declares one)."""

    def __init__(self, name: str, schema: dict[str, Any]) -> None:
        self._name, self._schema = name, schema

    def name(self) -> str:
        return self._name

    def description(self) -> str:
        return f"The tool {self._name}."

    def parameter_schema(self) -> dict[str, Any]:
        return self._schema

    def run(self, args: dict[str, Any], ctx: Any) -> str:
        RUNS.append((self._name, args))
        return "ok"


SCHEMAS: dict[str, dict[str, Any]] = {
    "bare": {"type": "object"},
    "either": {"type": "object", "anyOf": [
        {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    "both": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
             "allOf": [{"properties": {"y": {"type": "integer"}}, "required": ["y"]}],
             "not": {"required": ["z"]}},
    "spaced": {"type": "object", "properties": {"a b": {"type": "string"}}},
}


@pytest.fixture
def declared_loop(tmp_path: Path) -> Iterator[Any]:
    RUNS.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        for name, schema in SCHEMAS.items():
            system.register(Declared(name, schema))
        yield system.start_loop("declared")
    finally:
        system.stop()


def sent_schemas(body: dict[str, Any], provider: str) -> dict[str, Any]:
    if provider == "openai":
        return {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    return {t["name"]: t["input_schema"] for t in body["tools"]}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_each_provider_is_sent_schemas_it_accepts_and_calls_are_held_to_the_whole_schema(
    server: WireServer, declared_loop: Any, provider: str
) -> None:
    calls = [("c1", "bare", "{}"), ("c2", "either", '{"a": 1}'), ("c3", "either", '{"c": 1}'),
             ("c4", "both", '{"x": 1}'), ("c5", "both", '{"x": 1, "y": 2}')]
    if provider == "openai":
        server.script(OPENAI_PATH, Response(200, openai_completion(None, calls)),
                      Response(200, openai_completion("done")), Response(200, openai_completion("again")))
        model: Any = openai_model(server)
    else:
        blocks = [tool_use_block(cid, name, json.loads(args)) for cid, name, args in calls]
        server.script(ANTHROPIC_PATH, Response(200, anthropic_message(blocks)),
                      Response(200, anthropic_message([text_block("done")])),
                      Response(200, anthropic_message([text_block("again")])))
        model = anthropic_model(server)
    with model:
        first = prompt(declared_loop, "go", model=model)
        second = prompt(declared_loop, "more", model=model)
    assert first.ok and second.ok and second.text == "again", (first.error, second.error)
    assert [r.ok for r in first.steps[0].results] == [True, True, False, False, True]
    assert all(r.error_kind == ErrorKind.INVALID_ARGUMENTS for r in first.steps[0].results if not r.ok)
    bodies = server.bodies(OPENAI_PATH if provider == "openai" else ANTHROPIC_PATH)
    assert len(bodies) == 3
    sent = sent_schemas(bodies[0], provider)
    assert sent["bare"] == {"type": "object", "properties": {}}
    assert sent["either"] == {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    assert sent["both"]["required"] == ["x", "y"] and "allOf" not in sent["both"]
    assert ("not" in sent["both"]) == (provider == "anthropic")  # the Messages API takes a top-level not
    # a property name the Messages API refuses: no form carries it, so the tool is left out
    assert ("spaced" in sent) == (provider == "openai")
    # what the loop validates against, and offers, is unchanged
    offered = {d["name"]: d["parameters"] for d in declared_loop.declarations("neutral")}
    assert offered == SCHEMAS


def test_provider_schema_never_changes_the_schema_it_is_given() -> None:
    from rho_actors.agent.provider_schemas import provider_schema

    for schema in SCHEMAS.values():
        before = json.dumps(schema, sort_keys=True)
        for provider in ("openai", "anthropic", "neutral"):
            provider_schema(schema, provider)
        assert json.dumps(schema, sort_keys=True) == before
    assert provider_schema(SCHEMAS["spaced"], "anthropic")[0] is None
    assert "'a b'" in str(provider_schema(SCHEMAS["spaced"], "anthropic")[1])


def test_a_streamed_openai_call_cut_off_by_the_token_limit_never_runs(server: WireServer, loop: Any) -> None:
    reply = streamed(part(0, "c1", "write_file", '{"path": "a.txt"}'), part(1, "c2", "write_file", '{"path": "b'),
                     finish="length")
    result = streamed_prompt(server, loop, reply)
    assert RUNS == [("write_file", ("a.txt", "overwrite"))]
    first, cut = result.steps[0].results
    assert first.ok and not cut.ok and "token limit" in cut.content and "did not run" in cut.content
    assert result.error is not None and "c2" in result.error and "token limit" in result.error
