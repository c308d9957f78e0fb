"""Anthropic's per-request picture limits (at most 100 pictures, none over 2000 px a side
when a request holds more than 20, 32 MB in all), through the real SDK against the
loopback server, which refuses a request over any of them as the API does: every
request is built within them, the newest pictures kept and each older one left out
with a notice in its result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, Image, tool
from rho_actors.agent.driver import prompt
from rho_actors.agent.model import Message
from rho_actors.agent.provider_rules import ANTHROPIC_RULES, NEUTRAL_RULES, sanitise
from rho_actors.agent.providers import RetryPolicy
from rho_actors.agent.providers.anthropic import AnthropicModel
from rho_actors.tool import ToolCall, ToolResult
from tests.conftest import WAIT_S
from tests.wire_server import (
    ANTHROPIC_PATH,
    Response,
    WireServer,
    anthropic_message,
    picture,
    text_block,
    tool_use_block,
)

FAST = RetryPolicy(attempts=1, total_s=20.0)
WIDE = picture("PNG", (2100, 8))  # within the one-picture limit (8000 px), over the many-picture one


@tool
def screenshot(n: int) -> Image:
    """Take a (wide) screenshot."""
    return Image(WIDE, "image/png")


def claude(server: WireServer) -> AnthropicModel:
    return AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="k", retry=FAST, timeout_s=WAIT_S)


def sent_pictures(body: dict[str, Any]) -> list[tuple[str, int]]:
    """``(tool_use_id, pictures)`` of each tool result of the request."""
    out = []
    for m in body["messages"]:
        for block in m["content"] if isinstance(m["content"], list) else []:
            if block.get("type") == "tool_result":
                inner = block.get("content")
                count = sum(1 for p in inner if p.get("type") == "image") if isinstance(inner, list) else 0
                out.append((block["tool_use_id"], count))
    return out


def notes(body: dict[str, Any]) -> list[str]:
    return [p["text"] for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_result" and isinstance(b.get("content"), list)
            for p in b["content"] if p.get("type") == "text" and "left out" in p["text"]] + [
        b["content"] for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
        if b.get("type") == "tool_result" and isinstance(b.get("content"), str) and "left out" in b["content"]]


def test_a_session_of_21_wide_screenshots_is_not_refused_on_later_prompts(server: WireServer, tmp_path: Path) -> None:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        system.register(screenshot)
        loop = system.start_loop("pictures")
        calls = [tool_use_block(f"t{n}", "screenshot", {"n": n}) for n in range(21)]
        server.script(ANTHROPIC_PATH, Response(200, anthropic_message(calls)),
                      Response(200, anthropic_message([text_block("seen")])),
                      Response(200, anthropic_message([text_block("again")])))
        with claude(server) as model:
            first = prompt(loop, "look", model=model)
            second = prompt(loop, "look again", model=model)
        assert first.ok and first.text == "seen", first.error
        assert second.ok and second.text == "again", second.error
        for body in server.bodies(ANTHROPIC_PATH)[1:]:
            sent = sent_pictures(body)
            assert sent[0] == ("t0", 0) and all(count == 1 for _, count in sent[1:])  # the oldest is left out
            [note] = notes(body)
            assert "2000 px" in note and "more than 20" in note
    finally:
        system.stop()


def conversation(pictures: list[bytes]) -> list[Message]:
    calls = [ToolCall(f"t{n}", "screenshot", {"n": n}) for n in range(len(pictures))]
    results = [Message.tool_result(ToolResult(f"t{n}", "screenshot", True, f"shot {n}",
                                              images=(Image(data, "image/png"),)))
               for n, data in enumerate(pictures)]
    return [Message.user("look"), Message.assistant("", calls), *results]


def test_at_most_100_pictures_go_in_one_request(server: WireServer) -> None:
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("ok")])))
    with claude(server) as model:
        reply = model.complete(conversation([picture("PNG")] * 105), [])
    assert reply.text == "ok"
    [body] = server.bodies(ANTHROPIC_PATH)
    sent = sent_pictures(body)
    assert [count for _, count in sent] == [0] * 5 + [1] * 100  # the 100 newest
    assert len(notes(body)) == 5 and "100 newest" in notes(body)[0]


def test_pictures_beyond_32_mb_in_all_are_left_out(server: WireServer) -> None:
    big = picture("PNG") + b"\0" * 4_500_000  # a readable PNG, padded to 4.5 MB (6 MB as base64)
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("ok")])))
    with claude(server) as model:
        reply = model.complete(conversation([big] * 7), [])
    assert reply.text == "ok"
    [body] = server.bodies(ANTHROPIC_PATH)
    kept = sum(count for _, count in sent_pictures(body))
    assert kept == 4 and len(notes(body)) == 3 and "32,000,000 bytes" in notes(body)[0]
    assert len(server.requests[-1].raw) < 32_000_000


@pytest.mark.parametrize("rules", [ANTHROPIC_RULES, NEUTRAL_RULES])
def test_fitting_pictures_is_idempotent_and_never_changes_a_request_within_the_limits(rules: Any) -> None:
    within = conversation([picture("PNG")] * 19 + [WIDE])  # 20 pictures: a wide one is allowed
    assert sanitise(within, rules) == sanitise(within, rules)
    assert sum(len(m.images) for m in sanitise(within, rules)) == 20
    over = sanitise(conversation([WIDE] * 22), rules)
    assert sanitise(over, rules) == over and sum(len(m.images) for m in over) == 20
