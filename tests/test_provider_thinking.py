"""Anthropic extended thinking through the real SDK against the loopback server, which
checks each ``thinking`` block's signature and refuses (as the API does) a tool-use turn
continued with thinking on whose assistant message does not start with a thinking
block: the blocks are recorded and sent back exactly, and a transcript recorded without
them continues with thinking off for that request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, tool
from rho_actors.agent.driver import FinalResult, prompt, stream
from rho_actors.agent.model import Reply
from rho_actors.agent.providers import RetryPolicy
from rho_actors.agent.providers.anthropic import AnthropicModel
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, read_records
from rho_actors.tool import ToolCall, ToolResult
from tests.conftest import WAIT_S
from tests.wire_server import (
    ANTHROPIC_PATH,
    Response,
    WireServer,
    anthropic_message,
    anthropic_stream,
    redacted_thinking_block,
    signature,
    text_block,
    thinking_block,
    tool_use_block,
)

FAST = RetryPolicy(attempts=1, total_s=5.0)
THINKING = {"type": "enabled", "budget_tokens": 1024}


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Any]:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        system.register(lookup)
        yield system.start_loop("thinking")
    finally:
        system.stop()


def model(server: WireServer) -> AnthropicModel:
    return AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="k", retry=FAST, timeout_s=WAIT_S,
                          max_tokens=2048, thinking=THINKING)


def thinking_stream(thought: str, tid: str) -> list[tuple[str | None, Any]]:
    """A streamed reply: a thinking block (its text and signature in deltas), then a
    tool_use block."""
    def event(name: str, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return name, {"type": name, **data}

    return [
        event("message_start", {"message": {"id": "m", "type": "message", "role": "assistant", "model": "c",
                                            "content": [], "stop_reason": None, "stop_sequence": None,
                                            "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        event("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": "",
                                                                      "signature": ""}}),
        event("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": thought[:5]}}),
        event("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": thought[5:]}}),
        event("content_block_delta", {"index": 0, "delta": {"type": "signature_delta",
                                                            "signature": signature(thought)}}),
        event("content_block_stop", {"index": 0}),
        event("content_block_start", {"index": 1, "content_block": {"type": "tool_use", "id": tid, "name": "lookup",
                                                                      "input": {}}}),
        event("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta",
                                                            "partial_json": '{"key": "k"}'}}),
        event("content_block_stop", {"index": 1}),
        event("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                "usage": {"output_tokens": 9}}),
        event("message_stop", {}),
    ]


@pytest.mark.parametrize("streamed", [False, True])
def test_thinking_blocks_are_recorded_and_sent_back_exactly(server: WireServer, loop: Any, streamed: bool) -> None:
    thought = "The user wants k; I will look it up."
    blocks = [thinking_block(thought), redacted_thinking_block("hidden"), tool_use_block("t1", "lookup", {"key": "k"})]
    first: Any = thinking_stream(thought, "t1") if streamed else anthropic_message(blocks)
    answer: Any = anthropic_stream(["k is v"]) if streamed else anthropic_message([text_block("k is v")])
    server.script(ANTHROPIC_PATH, Response(200, first), Response(200, answer),
                  Response(200, anthropic_message([text_block("again")])))
    with model(server) as claude:
        if streamed:
            final = list(stream(loop, "what is k?", model=claude))[-1]
            assert isinstance(final, FinalResult)
            result = final.result
        else:
            result = prompt(loop, "what is k?", model=claude)
        later = prompt(loop, "and now?", model=claude)
    assert result.ok and result.text == "k is v", result.error
    assert later.ok and later.text == "again", later.error
    expected = [thinking_block(thought)] + ([] if streamed else [redacted_thinking_block("hidden")])
    bodies = server.bodies(ANTHROPIC_PATH)
    assert all(b["thinking"] == THINKING for b in bodies)
    for body in bodies[1:]:
        assistant = next(m for m in body["messages"] if m["role"] == "assistant")
        assert assistant["content"][:len(expected)] == expected
        assert assistant["content"][len(expected)]["type"] == "tool_use"
    reply = next(r for r in read_records(loop.data_dir / TRANSCRIPT_NAME)[0] if r["type"] == "reply")
    assert reply["thinking"] == expected


def test_a_turn_recorded_without_thinking_blocks_continues_with_thinking_off(
    server: WireServer, loop: Any, logs: list[str]
) -> None:
    # what an earlier version recorded: a reply with a call, no thinking block, and its result
    with Transcript(loop.data_dir / TRANSCRIPT_NAME) as transcript:
        transcript.user(1, "what is k?")
        transcript.reply(1, Reply("", (ToolCall("t1", "lookup", {"key": "k"}),)))
        transcript.result(1, 0, ToolResult("t1", "lookup", True, "value of k"))
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("k is v")])),
                  Response(200, anthropic_message([text_block("next")])))
    with model(server) as claude:
        continued = prompt(loop, None, model=claude)
        later = prompt(loop, "and now?", model=claude)
    assert continued.ok and continued.text == "k is v", continued.error
    assert later.ok and later.text == "next", later.error
    first, second = server.bodies(ANTHROPIC_PATH)
    assert "thinking" not in first  # the documented fallback: thinking off for that request
    assert second["thinking"] == THINKING  # a new turn: thinking on again
    assert any("no thinking block" in line for line in logs)


def test_the_server_refuses_a_turn_continued_without_its_thinking_block(server: WireServer) -> None:
    # the rule the fallback meets, enforced here as by the API
    import anthropic

    def request(assistant: list[dict[str, Any]]) -> dict[str, Any]:
        return {"model": "c", "max_tokens": 2048, "thinking": THINKING, "messages": [
            {"role": "user", "content": "q"}, {"role": "assistant", "content": assistant},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "v"}]}]}

    call = tool_use_block("t1", "lookup", {"key": "k"})
    changed = thinking_block("a thought") | {"thinking": "another thought"}
    with anthropic.Anthropic(base_url=server.anthropic_url, api_key="k", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block"):
            client.messages.create(**request([call]))
        with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
            client.messages.create(**request([changed, call]))
