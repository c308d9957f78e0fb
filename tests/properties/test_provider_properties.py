"""Property tests of the provider edge: stream assembly (any way a server may split and
interleave parallel calls gives the calls the model meant) and per-request picture
limits (every request built from any conversation is within Anthropic's limits, as the
loopback server checks them, and building is idempotent)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk

from rho_actors.agent.model import Message
from rho_actors.agent.provider_rules import ANTHROPIC_RULES, sanitise
from rho_actors.agent.providers.anthropic import to_anthropic_request
from rho_actors.agent.providers.openai import reply_from_chunks
from rho_actors.tool import Image, ToolCall, ToolResult
from tests.wire_server import anthropic_violation, picture

pytestmark = pytest.mark.timeout(600)

NAMES = st.sampled_from(["a", "aa", "get_", "get_get_", "write_file", "x-y"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=8)
ARGUMENTS = st.dictionaries(st.text(max_size=6), VALUES, max_size=4)


@st.composite
def pieces(draw: Any, text: str, minimum: int = 1) -> list[str]:
    """``text`` cut at some points (every piece non-empty)."""
    if len(text) <= 1:
        return [text]
    cuts = sorted(draw(st.sets(st.integers(1, len(text) - 1), max_size=min(6, len(text) - 1))))
    bounds = [0, *cuts, len(text)]
    return [text[i:j] for i, j in itertools.pairwise(bounds)]


@st.composite
def streamed_calls(draw: Any) -> tuple[list[tuple[str, str, dict[str, Any]]], list[dict[str, Any]]]:
    """Calls ``(id, name, arguments)`` and the stream parts a server may send for them."""
    count = draw(st.integers(1, 4))
    calls = [(f"call_{n}", draw(NAMES), draw(ARGUMENTS)) for n in range(count)]
    shape = draw(st.sampled_from(["distinct indexes", "index 0 in turn", "index 0, ids on every part"]))
    per_call: list[list[dict[str, Any]]] = []
    for n, (cid, name, arguments) in enumerate(calls):
        index = n if shape == "distinct indexes" else 0
        names = [name] if shape == "index 0, ids on every part" else draw(pieces(name))
        texts = draw(pieces(json.dumps(arguments)))
        parts = [{"index": index, "id": cid, "type": "function", "function": {"name": names[0], "arguments": ""}}]
        parts += [{"index": index, "function": {"name": piece}} for piece in names[1:]]
        parts += [{"index": index, "function": {"arguments": piece}} for piece in texts]
        if shape == "index 0, ids on every part":
            for part in parts:
                part["id"] = cid
        per_call.append(parts)
    if shape == "index 0 in turn":
        order = [part for parts in per_call for part in parts]
    else:  # any interleaving that keeps each call's own parts in order
        queues = [list(parts) for parts in per_call]
        order = []
        while any(queues):
            pick = draw(st.sampled_from([k for k, q in enumerate(queues) if q]))
            order.append(queues[pick].pop(0))
    return calls, order


def chunk(delta: dict[str, Any], finish: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate({
        "id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


@given(streamed_calls())
def test_streamed_calls_are_assembled_as_the_model_meant_them(case: Any) -> None:
    calls, parts = case
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"tool_calls": [part]}) for part in parts]
    chunks.append(chunk({}, "tool_calls"))
    reply = reply_from_chunks(chunks, lambda _: None)
    got = {c.id: (c.name, json.loads(str(c.arguments))) for c in reply.tool_calls}
    assert got == {cid: (name, arguments) for cid, name, arguments in calls}
    assert len(reply.tool_calls) == len(calls)


SMALL = picture("PNG")
WIDE = picture("PNG", (2100, 4))


@given(st.lists(st.sampled_from([SMALL, WIDE]), max_size=30), st.integers(1, 3))
def test_every_request_is_within_the_per_request_picture_limits(pictures: list[bytes], per_result: int) -> None:
    messages: list[Message] = [Message.user("look")]
    groups = [pictures[i:i + per_result] for i in range(0, len(pictures), per_result)]
    calls = [ToolCall(f"t{n}", "shot", {}) for n in range(len(groups))]
    if calls:
        messages.append(Message.assistant("", calls))
        messages += [Message.tool_result(ToolResult(f"t{n}", "shot", True, "",
                                                    images=tuple(Image(p, "image/png") for p in group)))
                     for n, group in enumerate(groups)]
    built = sanitise(messages, ANTHROPIC_RULES)
    assert sanitise(built, ANTHROPIC_RULES) == built  # idempotent
    _system, wire = to_anthropic_request(messages)
    assert anthropic_violation({"messages": wire}) is None
    kept = sum(len(m.images) for m in built)
    left_out = sum(m.text.count("an older picture was left out") for m in built)
    assert kept + left_out == len(pictures)  # each picture sent, or its note
    if len(pictures) <= 20 or WIDE not in pictures:
        assert kept == len(pictures)  # nothing left out that fits
