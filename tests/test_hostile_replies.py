"""Replies of unexpected shape, through the real SDKs against the loopback servers: a
call without an id, name or function, a block of no content, malformed usage, a stream
whose parts lack their index or repeat the name, arguments nested deep. Each reply is
recorded and answered (its calls get results), and the session's next prompt succeeds."""

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
    openai_completion,
    openai_stream,
    text_block,
    tool_use_block,
)

FAST = RetryPolicy(attempts=1, total_s=5.0)
RUNS: list[int] = []


@tool
def ping(n: int = 0) -> str:
    """Count a call (a side effect)."""
    RUNS.append(n)
    return f"pong {n}"


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Any]:
    RUNS.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        system.register(ping)
        yield system.start_loop("hostile")
    finally:
        system.stop()


def two_prompts(server: WireServer, provider: str, loop: Any, first: Any, *, streamed: bool = False
                ) -> tuple[PromptResult, PromptResult]:
    path = OPENAI_PATH if provider == "openai" else ANTHROPIC_PATH
    server.script(path, Response(200, first))
    for text in ("done", "again"):
        if streamed:
            server.script(path, Response(200, openai_stream([text])))
        elif provider == "openai":
            server.script(path, Response(200, openai_completion(text)))
        else:
            server.script(path, Response(200, anthropic_message([text_block(text)])))
    model: Any = (OpenAIModel("gpt-test", base_url=server.openai_url, api_key="k", retry=FAST, timeout_s=WAIT_S)
                  if provider == "openai" else
                  AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="k", retry=FAST,
                                 timeout_s=WAIT_S))
    with model:
        if streamed:
            results = [list(stream(loop, text, model=model))[-1] for text in ("do it", "once more")]
            assert all(isinstance(r, FinalResult) for r in results)
            first, second = (r.result for r in results if isinstance(r, FinalResult))
            return first, second
        return prompt(loop, "do it", model=model), prompt(loop, "once more", model=model)


def answered(first: PromptResult, second: PromptResult) -> list[Any]:
    """The results of the first step's calls, after checking both prompts succeeded and
    every call has a unique, non-empty id with one result."""
    assert first.ok, first.error
    assert second.ok and second.text == "again", second.error
    ids = [c.id for c in first.steps[0].reply.tool_calls]
    assert ids and all(ids) and len(set(ids)) == len(ids)
    assert [r.call_id for r in first.steps[0].results] == ids
    return list(first.steps[0].results)


def openai_calls(*calls: dict[str, Any]) -> dict[str, Any]:
    body = openai_completion(None, [("x", "ping", "{}")])
    body["choices"][0]["message"]["tool_calls"] = list(calls)
    return body


def fn(name: Any = "ping", arguments: Any = '{"n": 1}') -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


OPENAI_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    # the call's raw form, and the error kind of its result (None: it ran)
    "id null": ({"id": None, "type": "function", "function": fn()}, None),
    "id left out": ({"type": "function", "function": fn()}, None),
    "id a number": ({"id": 5, "type": "function", "function": fn()}, None),
    "name null": ({"id": "c1", "type": "function", "function": fn(name=None)}, ErrorKind.UNKNOWN_TOOL),
    "function left out": ({"id": "c1", "type": "function"}, ErrorKind.UNKNOWN_TOOL),
    "unknown call type": ({"id": "c1", "type": "mystery", "function": fn()}, None),
}


@pytest.mark.parametrize("case", list(OPENAI_CASES))
def test_an_openai_call_of_unexpected_shape_is_answered(server: WireServer, loop: Any, case: str) -> None:
    call, kind = OPENAI_CASES[case]
    [result] = answered(*two_prompts(server, "openai", loop, openai_calls(call)))
    assert result.error_kind == kind, result.content
    assert ([] if kind else [1]) == RUNS


ANTHROPIC_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "id null": ({"type": "tool_use", "id": None, "name": "ping", "input": {"n": 1}}, None),
    "id left out": ({"type": "tool_use", "name": "ping", "input": {"n": 1}}, None),
    "name null": ({"type": "tool_use", "id": "t1", "name": None, "input": {}}, ErrorKind.UNKNOWN_TOOL),
    "input a list": (tool_use_block("t1", "ping", [1]), ErrorKind.INVALID_JSON),
}


@pytest.mark.parametrize("case", list(ANTHROPIC_CASES))
def test_an_anthropic_call_of_unexpected_shape_is_answered(server: WireServer, loop: Any, case: str) -> None:
    block, kind = ANTHROPIC_CASES[case]
    [result] = answered(*two_prompts(server, "anthropic", loop, anthropic_message([block])))
    assert result.error_kind == kind, result.content
    assert ([] if kind else [1]) == RUNS


def test_arguments_nested_past_the_bound_are_recorded_as_text_and_refused(server: WireServer, loop: Any) -> None:
    deep = json.loads('{"a": ' * 900 + "1" + "}" * 900)  # what the SDK parses; too deep to record as an object
    reply = anthropic_message([tool_use_block("t1", "ping", deep)])
    [result] = answered(*two_prompts(server, "anthropic", loop, reply))
    assert result.error_kind == ErrorKind.INVALID_JSON and "nested deeper" in result.content
    reply = next(r for r in read_records(loop.data_dir / TRANSCRIPT_NAME)[0] if r["type"] == "reply")
    assert json.loads(reply["tool_calls"][0]["arguments"]) == deep  # the audit keeps what was sent


def test_a_message_without_content_and_malformed_usage_still_count(server: WireServer, loop: Any) -> None:
    body = anthropic_message([text_block("x")])
    body["content"], body["usage"] = None, {"input_tokens": "many", "output_tokens": -3}
    first, second = two_prompts(server, "anthropic", loop, body)
    assert first.ok and first.text == "" and second.ok, (first.error, second.error)
    body = openai_completion("")
    body["choices"][0]["message"]["content"] = [{"type": "text", "text": "in "}, {"type": "text", "text": "parts"}]
    body["usage"] = {"prompt_tokens": "x", "completion_tokens": None}
    first, _ = two_prompts(server, "openai", loop, body)
    assert first.ok and first.text == "in parts" and first.usage.total_tokens == 0, first.error


def chunk(delta: Any, finish: str | None = None, choices: Any = ...) -> tuple[None, dict[str, Any]]:
    body: dict[str, Any] = {"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m",
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if choices is not ...:
        body["choices"] = choices
    return None, body


def part(index: Any, cid: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "id": cid, "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}


STREAMS: dict[str, tuple[list[Any], list[int]]] = {
    "parts without an index": ([chunk(part(None, "a", "ping", '{"n": 1}')), chunk(part(None, "b", "ping", "{")),
                                chunk(part(None, None, None, '"n": 2}'))], [1, 2]),
    "an index missing beside one given": ([chunk(part(None, "a", "ping", '{"n": 1}')),
                                           chunk(part(1, "b", "ping", '{"n": 2}'))], [1, 2]),
    "the name sent again with each part": ([chunk(part(0, "a", "ping", '{"n"')), chunk(part(0, "a", "ping", ": 4}"))],
                                           [4]),
    "chunks without choices or delta": ([chunk(None, choices=None), chunk(None), chunk(part(0, "a", "ping", "{}"))],
                                        [0]),
}


@pytest.mark.parametrize("case", list(STREAMS))
def test_a_stream_of_unexpected_shape_is_put_together(server: WireServer, loop: Any, case: str) -> None:
    chunks, runs = STREAMS[case]
    answered(*two_prompts(server, "openai", loop, [*chunks, chunk({}, "tool_calls"), (None, "[DONE]")],
                          streamed=True))
    assert sorted(RUNS) == runs
