"""The agent loop on the wire: the loopback servers enforce each provider's request rules
(400 like the real APIs), and no reply, tool result or recorded element makes a later
prompt of the session fail; streaming, usage, instructions and options through both
real SDKs."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, Error, Image, PromptResult, ToolCall, tool
from rho_actors.agent.driver import FinalResult, StepEnded, TextDelta, ToolCallFinished, ToolCallStarted, prompt, stream
from rho_actors.agent.model import Message, Usage
from rho_actors.agent.provider_rules import ANTHROPIC_RULES, OPENAI_RULES, sanitise
from rho_actors.agent.providers import RetryPolicy
from rho_actors.agent.providers.anthropic import AnthropicModel, to_anthropic_request
from rho_actors.agent.providers.openai import OpenAIModel, to_openai_messages
from rho_actors.agent.transcript import TRANSCRIPT_NAME, read_records
from rho_actors.tool import ErrorKind, ToolResult
from tests.conftest import WAIT_S
from tests.helpers import unchecked_image
from tests.wire_server import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    Response,
    WireServer,
    anthropic_message,
    anthropic_stream,
    anthropic_violation,
    openai_completion,
    openai_stream,
    openai_violation,
    picture,
    text_block,
    tool_use_block,
)

FAST = RetryPolicy(attempts=2, initial_s=0.01, max_wait_s=0.05, jitter_s=0.0, total_s=5.0)
RUNS: list[int] = []


@tool
def ping(n: int = 0) -> str:
    """Count a call (a side effect)."""
    RUNS.append(n)
    return f"pong {n}"


@tool
def fail_empty() -> Any:
    """Fail without a message."""
    return Error("")


@tool
def tall_picture() -> Image:
    """A picture 9000 pixels high (over the Messages API's 8000), and mislabelled."""
    return Image(picture("PNG", (1, 9000)), "image/png")


@tool
def mislabelled() -> Image:
    """JPEG bytes labelled PNG."""
    return Image(picture("JPEG"), "image/png")


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Any]:
    RUNS.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        for t in (ping, fail_empty, tall_picture, mislabelled):
            system.register(t)
        yield system.start_loop("wire")
    finally:
        system.stop()


def make_model(provider: str, server: WireServer) -> Any:
    if provider == "openai":
        return OpenAIModel("gpt-test", base_url=server.openai_url, api_key="k", retry=FAST, timeout_s=WAIT_S)
    return AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="k", retry=FAST, timeout_s=WAIT_S)


def script(server: WireServer, provider: str, text: str | None, calls: Sequence[tuple[str, str, str]] = ()) -> None:
    if provider == "openai":
        server.script(OPENAI_PATH, Response(200, openai_completion(text, calls)))
        return
    blocks = [text_block(text)] if text is not None else []
    blocks += [tool_use_block(cid, name, json.loads(args)) for cid, name, args in calls]
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message(blocks)))


BOTH = ["openai", "anthropic"]

CASES: dict[str, tuple[str | None, list[tuple[str, str, str]]]] = {
    "missing id": (None, [("", "ping", "{}")]),
    "exact duplicate": (None, [("c1", "ping", '{"n": 1}'), ("c1", "ping", '{"n": 1}')]),
    "different calls sharing an id": (None, [("c1", "ping", '{"n": 1}'), ("c1", "ping", '{"n": 2}')]),
    "id of other characters": (None, [("call.1:x/y", "ping", "{}")]),
    "id too long": (None, [("x" * 60, "ping", "{}")]),
    "error without text": (None, [("c1", "fail_empty", "{}")]),
    "picture over the limits": (None, [("c1", "tall_picture", "{}"), ("c2", "mislabelled", "{}")]),
    "whitespace text beside a call": ("   \n", [("c1", "ping", "{}")]),
    "unknown tool of odd name": (None, [("c1", "no such.tool!", "{}")]),
}
OPENAI_ONLY: dict[str, tuple[str | None, list[tuple[str, str, str]]]] = {
    "invalid JSON": (None, [("c1", "ping", '{"n": 1,')]),
    "NaN": (None, [("c1", "ping", '{"n": NaN}')]),
    "not an object": (None, [("c1", "ping", "[1, 2]")]),
    "empty arguments": (None, [("c1", "ping", "")]),
    "deep arguments": (None, [("c1", "ping", "[" * 2000 + "]" * 2000)]),
}


def two_prompts(
    server: WireServer, provider: str, loop: Any, text: str | None, calls: list[tuple[str, str, str]]
) -> tuple[PromptResult, PromptResult]:
    script(server, provider, text, calls)
    script(server, provider, "done", [])
    script(server, provider, "and again", [])
    with make_model(provider, server) as model:
        first = prompt(loop, "do it", model=model)
        second = prompt(loop, "once more", model=model)
    return first, second


@pytest.mark.parametrize("provider", BOTH)
@pytest.mark.parametrize("case", list(CASES))
def test_no_reply_or_result_poisons_the_session(server: WireServer, loop: Any, provider: str, case: str) -> None:
    text, calls = CASES[case]
    first, second = two_prompts(server, provider, loop, text, calls)
    assert first.ok, first.error
    assert second.ok and second.text == "and again", second.error
    ids = [c.id for c in first.steps[0].reply.tool_calls]
    assert all(ids) and len(set(ids)) == len(ids)
    assert [r.call_id for r in first.steps[0].results] == ids  # one result per call, in order
    if case == "exact duplicate":
        assert RUNS == [1] and len(ids) == 1
    if case == "different calls sharing an id":
        assert sorted(RUNS) == [1, 2] and ids == ["c1", "c1_2"]
        records = [r for r in read_records(loop.data_dir / TRANSCRIPT_NAME)[0] if r["type"] == "reply"]
        assert records[0]["tool_calls"][1]["sent_id"] == "c1"  # the mapping is recorded
    if case == "error without text":
        assert first.steps[0].results[0].content.startswith("the call failed without a message")


@pytest.mark.parametrize("case", list(OPENAI_ONLY))
def test_arguments_that_are_no_json_object_are_recorded_as_sent_and_replayed_as_one(
    server: WireServer, loop: Any, case: str
) -> None:
    text, calls = OPENAI_ONLY[case]
    first, second = two_prompts(server, "openai", loop, text, calls)
    assert first.ok and second.ok, (first.error, second.error)
    assert RUNS == []
    assert first.steps[0].results[0].error_kind == ErrorKind.INVALID_JSON
    [reply] = [r for r in read_records(loop.data_dir / TRANSCRIPT_NAME)[0] if r["type"] == "reply"][:1]
    assert reply["tool_calls"][0]["arguments"] == calls[0][2]  # the audit keeps what was sent
    replayed = server.bodies(OPENAI_PATH)[1]["messages"]
    assert replayed[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert "shown as {} here" in replayed[2]["content"]


def test_blank_user_input_is_refused_before_anything_is_recorded(loop: Any) -> None:
    from rho_actors.agent.model import ScriptedModel

    for blank in ("", "  \n\t"):
        with pytest.raises(ValueError, match="empty or only whitespace"):
            prompt(loop, blank, model=ScriptedModel([]))
    assert not (loop.data_dir / TRANSCRIPT_NAME).exists() or read_records(loop.data_dir / TRANSCRIPT_NAME)[0] == []


@pytest.mark.parametrize("provider", BOTH)
def test_a_transcript_of_an_earlier_version_is_repaired_on_load(
    server: WireServer, loop: Any, provider: str
) -> None:
    deep = "[" * 2000 + "]" * 2000
    records = [
        {"type": "user", "step": 1, "text": "  "},
        {"type": "user", "step": 1, "text": "go"},
        {"type": "reply", "step": 1, "text": " ", "tool_calls": [
            {"id": "", "name": "ping", "arguments": "{}"},
            {"id": "d", "name": "ping", "arguments": "{bad"},
            {"id": "d", "name": "ping", "arguments": "{bad"},
            {"id": "e", "name": "ping", "arguments": deep},
            {"id": "f", "name": "ping", "arguments": '{"n": NaN}'},
        ], "model_ms": 1.0},
        *[{"type": "result", "step": 1, "index": i, "call_id": cid, "name": "ping", "ok": False, "content": "",
           "error_kind": "raised", "duration_ms": 1.0, "images": []} for i, cid in enumerate(["", "d", "d", "e", "f"])],
        {"type": "reply", "step": 2, "text": "\n", "tool_calls": [], "model_ms": 1.0},
    ]
    loop.data_dir.mkdir(parents=True, exist_ok=True)
    with open(loop.data_dir / TRANSCRIPT_NAME, "w") as f:
        for record in records:
            f.write(json.dumps({"v": 1, "ts": 0.0, **record}) + "\n")
    script(server, provider, "fine", [])
    script(server, provider, "still fine", [])
    with make_model(provider, server) as model:
        assert prompt(loop, "hello", model=model).ok
        result = prompt(loop, "again", model=model)
    assert result.ok and result.text == "still fine", result.error


def conversations() -> list[list[Message]]:
    nested: Any = {}
    for _ in range(2000):
        nested = {"a": nested}
    return [
        [Message.user("x"), Message.assistant("", [ToolCall("c", "ping", nested)])],
        [Message.user("x"), Message.assistant("", [ToolCall("c", "ping", {"n": math.nan})])],
        [Message.user("x"), Message.assistant("", [ToolCall("c", "ping", {"n": math.inf, 1: 2})])],  # type: ignore[dict-item]
        [Message.user("x\ud800"), Message.assistant("y\udfff", [ToolCall("c\ud800", "p\ud800", '"\\ud800"')])],
        [Message.tool_result(ToolResult("zz", "ping", False, "")), Message.user("orphan result before")],
        [Message.user("x"), Message.assistant("", [ToolCall("c", "ping", "{}")])],  # no result
        [Message("other", "?"), Message.system("  "), Message.user("x")],  # type: ignore[arg-type]
        [Message.user("x"), Message.assistant("", [ToolCall("c", "snap", "{}")]),
         Message.tool_result(ToolResult("c", "snap", True, "", images=(Image(b"\x00" * 10, "IMAGE/PNG"),
                                                                      unchecked_image("no bytes", "image/png"))))],
    ]


@pytest.mark.parametrize("index", range(8))
def test_building_a_request_never_raises_and_meets_the_rules(index: int) -> None:
    messages = conversations()[index]
    wire = to_openai_messages(messages)
    assert openai_violation({"messages": wire}) is None
    system, turns = to_anthropic_request(messages)
    body = {"messages": turns, **({"system": system} if system else {})}
    assert anthropic_violation(body) is None
    for rules in (OPENAI_RULES, ANTHROPIC_RULES):
        once = sanitise(messages, rules)
        assert sanitise(once, rules) == once  # idempotent
    json.dumps(wire, allow_nan=False)
    json.dumps(turns, allow_nan=False)


# --- instructions, options, usage, streaming ----------------------------------------------------


@pytest.mark.parametrize("provider", BOTH)
def test_instructions_options_and_usage(server: WireServer, loop: Any, provider: str) -> None:
    script(server, provider, None, [("c1", "ping", '{"n": 5}')])
    script(server, provider, "done", [])
    loop.instructions = "Be brief."
    with make_model(provider, server) as model:
        result = prompt(loop, "go", model=model, temperature=0.25, max_tokens=99)
    assert result.ok, result.error
    assert [s.usage for s in result.steps] == [Usage(10, 5), Usage(10, 5)]
    assert result.usage == Usage(20, 10) and result.usage.total_tokens == 30
    bodies = server.bodies(OPENAI_PATH if provider == "openai" else ANTHROPIC_PATH)
    for body in bodies:
        assert body["temperature"] == 0.25
        if provider == "openai":
            assert body["max_completion_tokens"] == 99
            assert body["messages"][0] == {"role": "system", "content": "Be brief."}
        else:
            assert body["max_tokens"] == 99 and body["system"] == "Be brief."
            assert body["messages"][0] == {"role": "user", "content": "go"}
    records = read_records(loop.data_dir / TRANSCRIPT_NAME)[0]
    assert "Be brief." not in json.dumps(records)  # instructions are not recorded


@pytest.mark.parametrize("provider", BOTH)
def test_streaming_through_the_real_sdks(server: WireServer, loop: Any, provider: str) -> None:
    if provider == "openai":
        server.script(OPENAI_PATH, Response(200, openai_stream(["Let me ", "ping."], [("c1", "ping", '{"n": 3}')])))
        server.script(OPENAI_PATH, Response(200, openai_stream(["Hel", "lo"])))
    else:
        server.script(ANTHROPIC_PATH, Response(200, anthropic_stream(["Let me ", "ping."], [("c1", "ping", {"n": 3})])))
        server.script(ANTHROPIC_PATH, Response(200, anthropic_stream(["Hel", "lo"])))
    with make_model(provider, server) as model:
        events = list(stream(loop, "go", model=model, instructions="Stream."))
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["TextDelta", "TextDelta", "ToolCallStarted", "ToolCallFinished", "StepEnded",
                     "TextDelta", "TextDelta", "StepEnded", "FinalResult"]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Let me ", "ping.", "Hel", "lo"]
    started = next(e for e in events if isinstance(e, ToolCallStarted))
    finished = next(e for e in events if isinstance(e, ToolCallFinished))
    assert started.call.name == "ping" and finished.result.content == "pong 3"
    assert isinstance(events[4], StepEnded) and events[4].step.number == 1
    final = events[-1]
    assert isinstance(final, FinalResult) and final.result.ok and final.result.text == "Hello"
    assert final.result.usage == Usage(14, 6)
    assert RUNS == [3]
    bodies = server.bodies(OPENAI_PATH if provider == "openai" else ANTHROPIC_PATH)
    assert all(b["stream"] is True for b in bodies)
    assert len(bodies) == 2


def test_an_image_in_a_recorded_result_is_sent_when_within_the_limits(server: WireServer) -> None:
    png = picture("PNG", (3, 3))
    conversation = [
        Message.user("look"),
        Message.assistant("", [ToolCall("s1", "snap", "{}")]),
        Message.tool_result(ToolResult("s1", "snap", True, "", images=(Image(png, "IMAGE/PNG"),))),
    ]
    _, turns = to_anthropic_request(conversation)
    block: Any = turns[2]["content"][0]["content"][0]  # type: ignore[index]
    assert block["source"] == {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}
