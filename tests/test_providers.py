"""The provider adapters with the real ``openai`` and ``anthropic`` SDK clients talking
HTTP to a scripted server on 127.0.0.1 (tests/wire_server.py): what the SDKs really send,
what comes back, retries and errors, and whole agent conversations."""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, Image, ToolCall, declaration, tool
from rho_actors.agent.driver import prompt
from rho_actors.agent.model import Message
from rho_actors.agent.provider_rules import REPLACED_ARGUMENTS
from rho_actors.agent.providers import ModelError, RetryPolicy, model_from_spec
from rho_actors.agent.providers.anthropic import AnthropicModel
from rho_actors.agent.providers.openai import LOCAL_API_KEY, OpenAIModel
from rho_actors.tool import ErrorKind, ToolResult
from tests.conftest import WAIT_S, slack
from tests.helpers import unchecked_image
from tests.wire_server import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    Response,
    WireServer,
    anthropic_error,
    anthropic_message,
    openai_completion,
    openai_error,
    picture,
    text_block,
    tool_use_block,
)

# three quick attempts; their total bound only a hang reaches (the attempts-count tests failed at a load of 28,
# 5 s passing before the third)
FAST = RetryPolicy(attempts=3, initial_s=0.01, max_wait_s=0.2, jitter_s=0.01, total_s=WAIT_S)


def fast_within(timeout_s: float) -> RetryPolicy:
    """:data:`FAST` for requests each bounded by ``timeout_s``: its total time leaves room
    for all three (a request timed out past ``total_s`` is not retried)."""
    return dataclasses.replace(FAST, total_s=3 * timeout_s + FAST.total_s)
"""Tiny waits, so retries take milliseconds."""

PNG = picture("PNG")
PNG_B64 = base64.b64encode(PNG).decode()
GIF = picture("GIF")
JPEG = picture("JPEG")
JPEG_B64 = base64.b64encode(JPEG).decode()


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


_ADD = declaration(add, "neutral")
assert _ADD is not None
ADD: dict[str, Any] = _ADD
ADD_SCHEMA = ADD["parameters"]


@pytest.fixture
def oai(server: WireServer) -> Iterator[OpenAIModel]:
    with OpenAIModel("gpt-test", base_url=server.openai_url, api_key="dummy", retry=FAST, timeout_s=WAIT_S) as m:
        yield m


@pytest.fixture
def claude(server: WireServer) -> Iterator[AnthropicModel]:
    with AnthropicModel(
        "claude-test", base_url=server.anthropic_url, api_key="dummy", retry=FAST, timeout_s=WAIT_S, max_tokens=512
    ) as m:
        yield m


def ok(call_id: str, name: str, content: str, images: tuple[Image, ...] = ()) -> Message:
    return Message.tool_result(ToolResult(call_id, name, True, content, images=images))


def failed(call_id: str, name: str, content: str, kind: ErrorKind = ErrorKind.RAISED) -> Message:
    return Message.tool_result(ToolResult(call_id, name, False, content, kind, details={"secret": "host only"}))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- OpenAI: what is sent ---------------------------------------------------------------------


def test_openai_sends_declarations_and_the_conversation(server: WireServer, oai: OpenAIModel) -> None:
    server.script(OPENAI_PATH, Response(200, openai_completion("all done")))
    conversation = [
        Message.user("add things"),
        Message.assistant("", [ToolCall("c1", "add", '{"a": 1, "b": 2}'), ToolCall("c2", "add", {"a": "x"})]),
        ok("c1", "add", "3"),
        failed("c2", "add", "invalid arguments for tool 'add': $.a: 'x' is not of type 'integer'"),
        Message.assistant("Let me retry.", [ToolCall("c3", "add", '{"a": 5}')]),
        ok("c3", "add", "5"),
        Message.user("thanks"),
    ]

    reply = oai.complete(conversation, [ADD])

    assert reply.text == "all done" and reply.tool_calls == ()
    [req] = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer dummy"
    body = req.body
    assert body["model"] == "gpt-test"
    assert body["tools"] == [
        {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_SCHEMA}}
    ]
    assert body["messages"] == [
        {"role": "user", "content": "add things"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": "x"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": "Error: invalid arguments for tool 'add': $.a: 'x' is not of type 'integer'",
        },
        {
            "role": "assistant",
            "content": "Let me retry.",
            "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "add", "arguments": '{"a": 5}'}}],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "5"},
        {"role": "user", "content": "thanks"},
    ]
    assert "host only" not in req.raw.decode()  # details never reach the model


def test_openai_leaves_tools_out_when_there_are_none(server: WireServer, oai: OpenAIModel) -> None:
    server.script(OPENAI_PATH, Response(200, openai_completion("hi")))
    assert oai.complete([Message.user("hello")], []).text == "hi"
    assert "tools" not in server.requests[0].body


def test_openai_pictures_follow_the_turns_tool_messages_as_one_user_message(
    server: WireServer, oai: OpenAIModel
) -> None:
    server.script(OPENAI_PATH, Response(200, openai_completion("a red square")))
    conversation = [
        Message.user("look"),
        Message.assistant(
            "", [ToolCall("s1", "snap", "{}"), ToolCall("s2", "calc", "{}"), ToolCall("s3", "snap", "{}")]
        ),
        ok("s1", "snap", "the screen", (Image(PNG, "image/png"),)),
        ok("s2", "calc", "4"),
        ok("s3", "snap", "", (Image(GIF, "image/gif"), Image(PNG))),
        Message.user("what do you see?"),
    ]

    oai.complete(conversation, [])

    messages = server.requests[0].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "tool", "user", "user"]
    assert messages[2]["content"] == "the screen\n[1 picture follows in the next user message]"
    assert messages[3]["content"] == "4"
    assert messages[4]["content"] == "[2 pictures follow in the next user message]"
    gif_b64 = base64.b64encode(GIF).decode()
    assert messages[5]["content"] == [
        {"type": "text", "text": "The picture returned by tool call s1 (snap):"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
        {"type": "text", "text": "The pictures returned by tool call s3 (snap):"},
        {"type": "image_url", "image_url": {"url": f"data:image/gif;base64,{gif_b64}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
    ]
    assert messages[6] == {"role": "user", "content": "what do you see?"}


# --- OpenAI: what comes back ------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        '{"a": 1,, "b": 2',  # invalid JSON
        '{"a":1 ,  "b" : 2}  ',  # odd but valid spacing
        '{"s": "\\u00e9\\ud800", "a": 1}',  # escapes, a lone surrogate
        "[1, 2]",  # not an object
        "",
    ],
)
def test_openai_passes_the_raw_argument_text_through_untouched(
    server: WireServer, oai: OpenAIModel, arguments: str
) -> None:
    server.script(OPENAI_PATH, Response(200, openai_completion(None, [("call_9", "add", arguments)])))
    reply = oai.complete([Message.user("go")], [ADD])
    assert reply.text == ""
    assert reply.tool_calls == (ToolCall("call_9", "add", arguments),)
    assert isinstance(reply.tool_calls[0].arguments, str)
    assert reply.tool_calls[0].arguments.encode("utf-8", "surrogatepass") == arguments.encode("utf-8", "surrogatepass")
    assert reply.raw.choices[0].finish_reason == "tool_calls"


def test_openai_reply_with_text_and_several_calls(server: WireServer, oai: OpenAIModel) -> None:
    server.script(
        OPENAI_PATH,
        Response(200, openai_completion("Working on it.", [("a", "add", '{"a": 1}'), ("b", "add", '{"a": 2}')])),
    )
    reply = oai.complete([Message.user("go")], [ADD])
    assert reply.text == "Working on it."
    assert [c.id for c in reply.tool_calls] == ["a", "b"]


def test_openai_answer_without_choices_is_a_model_error(server: WireServer, oai: OpenAIModel) -> None:
    body = openai_completion("x")
    body["choices"] = []
    server.script(OPENAI_PATH, Response(200, body))
    with pytest.raises(ModelError, match="no choices"):
        oai.complete([Message.user("go")], [])


# --- OpenAI: errors and retries ---------------------------------------------------------------


def test_openai_retries_429_and_500_then_succeeds(server: WireServer, oai: OpenAIModel) -> None:
    server.script(
        OPENAI_PATH,
        Response(429, openai_error(429, "Rate limit reached", "rate_limit_error"), {"retry-after-ms": "80"}),
        Response(500, openai_error(500, "The server had an error", "server_error")),
        Response(200, openai_completion("finally")),
    )
    assert oai.complete([Message.user("go")], [ADD]).text == "finally"
    reqs = server.requests
    assert len(reqs) == 3
    assert reqs[1].at - reqs[0].at >= 0.08  # the server's retry-after-ms was honoured
    assert all(r.body == reqs[0].body for r in reqs)  # the same request each time
    # the SDK's own retries are off: each attempt is the SDK's first
    assert {r.headers["x-stainless-retry-count"] for r in reqs} == {"0"}


@pytest.mark.parametrize(("status", "message"), [(400, "Invalid schema for function 'add'"), (401, "Bad API key")])
def test_openai_client_errors_are_raised_at_once(
    server: WireServer, oai: OpenAIModel, status: int, message: str
) -> None:
    server.script(OPENAI_PATH, Response(status, openai_error(status, message)), Response(200, openai_completion("no")))
    with pytest.raises(ModelError) as caught:
        oai.complete([Message.user("go")], [ADD])
    err = caught.value
    assert (err.provider, err.status, err.message, err.attempts, err.retryable) == ("openai", status, message, 1, False)
    assert f"HTTP {status}" in str(err) and message in str(err)
    assert len(server.requests) == 1
    assert server.pending(OPENAI_PATH) == 1


def test_openai_gives_up_after_the_policy_attempts(server: WireServer, oai: OpenAIModel) -> None:
    server.script(OPENAI_PATH, *[Response(503, openai_error(503, "overloaded", "server_error"))] * 5)
    with pytest.raises(ModelError) as caught:
        oai.complete([Message.user("go")], [])
    err = caught.value
    assert (err.status, err.attempts, err.retryable, err.message) == (503, 3, True, "overloaded")
    assert "gave up after 3 attempts" in str(err)
    assert len(server.requests) == 3


def test_openai_timeout_is_retried(server: WireServer) -> None:
    quick = Response(200, openai_completion("quick"))
    # the late answer takes WAIT_S; the quick one's bound is a quiet second as this machine keeps up now, and
    # one more quick answer is there should a load peak make the first miss it (the last of FAST's 3 attempts)
    server.script(OPENAI_PATH, Response(200, openai_completion("late"), delay_s=WAIT_S), quick, quick)
    timeout_s = slack(1.0)
    with OpenAIModel("gpt-test", base_url=server.openai_url, api_key="k", retry=fast_within(timeout_s),
                     timeout_s=timeout_s) as model:
        started = time.monotonic()
        assert model.complete([Message.user("go")], []).text == "quick"
    assert time.monotonic() - started < 2 * timeout_s + slack(2.2)
    assert len(server.requests) in (2, 3)


def test_openai_connection_errors_are_retried_then_raised() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with (
        OpenAIModel("gpt-test", base_url=url, api_key="k", retry=FAST, timeout_s=2.0) as model,
        pytest.raises(ModelError) as caught,
    ):
        model.complete([Message.user("go")], [])
    err = caught.value
    assert (err.status, err.attempts, err.retryable) == (None, 3, True)
    assert "connection error" in err.message
    assert isinstance(err.__cause__, Exception) and type(err.__cause__).__module__.startswith("openai")


def test_openai_given_client_gets_its_retries_turned_off(server: WireServer) -> None:
    import openai

    client = openai.OpenAI(base_url=server.openai_url, api_key="k", max_retries=5)
    try:
        model = OpenAIModel("gpt-test", client=client, retry=RetryPolicy(attempts=1))
        assert model.client.max_retries == 0
        server.script(OPENAI_PATH, *[Response(500, openai_error(500, "down", "server_error"))] * 3)
        with pytest.raises(ModelError):
            model.complete([Message.user("go")], [])
        assert len(server.requests) == 1
    finally:
        client.close()


# --- Anthropic: what is sent ------------------------------------------------------------------


def test_anthropic_sends_declarations_and_the_conversation(server: WireServer, claude: AnthropicModel) -> None:
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("all done")])))
    conversation = [
        Message.user("add things"),
        Message.assistant(
            "On it.",
            [
                ToolCall("t1", "add", {"a": 1, "b": 2}),
                ToolCall("t2", "add", '{"a": "x"}'),
                ToolCall("t3", "add", '{"a": 1,,'),
            ],
        ),
        ok("t1", "add", "3"),
        failed("t2", "add", "invalid arguments for tool 'add': $.a: 'x' is not of type 'integer'"),
        failed("t3", "add", "invalid JSON arguments for tool 'add'", ErrorKind.INVALID_JSON),
        Message.user("and now?"),
        Message.assistant("", [ToolCall("t4", "add", {"a": 5})]),
        ok("t4", "add", ""),
    ]

    reply = claude.complete(conversation, [ADD])

    assert reply.text == "all done" and reply.tool_calls == ()
    [req] = server.requests
    assert req.path == "/v1/messages"
    assert "anthropic-version" in req.headers
    body = req.body
    assert body["model"] == "claude-test" and body["max_tokens"] == 512
    assert body["tools"] == [{"name": "add", "description": "Add two integers.", "input_schema": ADD_SCHEMA}]
    assert body["messages"] == [
        {"role": "user", "content": "add things"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "On it."},
                {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1, "b": 2}},
                {"type": "tool_use", "id": "t2", "name": "add", "input": {"a": "x"}},
                {"type": "tool_use", "id": "t3", "name": "add", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [  # one user message for the turn's results, then the user's text
                {"type": "tool_result", "tool_use_id": "t1", "content": "3"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": "invalid arguments for tool 'add': $.a: 'x' is not of type 'integer'",
                    "is_error": True,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "t3",
                    "content": "invalid JSON arguments for tool 'add'\n" + REPLACED_ARGUMENTS,
                    "is_error": True,
                },
                {"type": "text", "text": "and now?"},
            ],
        },
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t4", "name": "add", "input": {"a": 5}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t4"}]},
    ]
    assert "host only" not in req.raw.decode()


def test_anthropic_leaves_tools_and_empty_assistant_messages_out(server: WireServer, claude: AnthropicModel) -> None:
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("hi")])))
    claude.complete([Message.user("hello"), Message.assistant(""), Message.user("again")], [])
    body = server.requests[0].body
    assert "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "hello"}, {"role": "user", "content": "again"}]


def test_anthropic_pictures_are_image_blocks_inside_the_tool_result(server: WireServer, claude: AnthropicModel) -> None:
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("a red square")])))
    conversation = [
        Message.user("look"),
        Message.assistant("", [ToolCall("s1", "snap", {}), ToolCall("s2", "snap", {})]),
        ok("s1", "snap", "the screen", (Image(PNG, "image/png"),)),
        ok("s2", "snap", "", (unchecked_image(b"BM..", "image/bmp"), Image(JPEG, "image/jpeg"))),
    ]

    claude.complete(conversation, [])

    messages = server.requests[0].body["messages"]
    assert len(messages) == 3
    assert messages[2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "s1",
                "content": [
                    {"type": "text", "text": "the screen"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
                ],
            },
            {
                "type": "tool_result",
                "tool_use_id": "s2",
                "content": [
                    {
                        "type": "text",
                        "text": "[a picture was left out: its type image/bmp is not one of image/gif, "
                        "image/jpeg, image/png, image/webp]",
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": JPEG_B64},
                    },
                ],
            },
        ],
    }


# --- Anthropic: what comes back ---------------------------------------------------------------


def test_anthropic_tool_use_input_comes_back_as_a_mapping(server: WireServer, claude: AnthropicModel) -> None:
    server.script(
        ANTHROPIC_PATH,
        Response(
            200,
            anthropic_message(
                [
                    text_block("Let me "),
                    text_block("add."),
                    tool_use_block("toolu_1", "add", {"a": 1, "b": {"nested": [1, 2]}}),
                    tool_use_block("toolu_2", "nope", {}),
                ]
            ),
        ),
    )
    reply = claude.complete([Message.user("go")], [ADD])
    assert reply.text == "Let me add."
    assert [(c.id, c.name) for c in reply.tool_calls] == [("toolu_1", "add"), ("toolu_2", "nope")]
    args = reply.tool_calls[0].arguments
    assert isinstance(args, Mapping) and dict(args) == {"a": 1, "b": {"nested": [1, 2]}}
    assert reply.raw.stop_reason == "tool_use"


# --- Anthropic: errors and retries ------------------------------------------------------------


def test_anthropic_retries_429_and_529_then_succeeds(server: WireServer, claude: AnthropicModel) -> None:
    server.script(
        ANTHROPIC_PATH,
        Response(429, anthropic_error(429, "Number of requests has exceeded your rate limit"), {"retry-after": "0"}),
        Response(529, anthropic_error(529, "Overloaded")),
        Response(500, anthropic_error(500, "Internal server error")),
        Response(200, anthropic_message([text_block("finally")])),
    )
    model = AnthropicModel(
        "claude-test", client=claude.client, retry=RetryPolicy(attempts=4, initial_s=0.01, max_wait_s=0.05)
    )
    assert model.complete([Message.user("go")], [ADD]).text == "finally"
    assert len(server.requests) == 4


@pytest.mark.parametrize(
    ("status", "message"), [(400, "messages.1: tool_use ids must be unique"), (401, "invalid x-api-key")]
)
def test_anthropic_client_errors_are_raised_at_once(
    server: WireServer, claude: AnthropicModel, status: int, message: str
) -> None:
    server.script(ANTHROPIC_PATH, Response(status, anthropic_error(status, message)))
    with pytest.raises(ModelError) as caught:
        claude.complete([Message.user("go")], [ADD])
    err = caught.value
    assert (err.provider, err.status, err.message, err.attempts) == ("anthropic", status, message, 1)
    assert len(server.requests) == 1


def test_anthropic_gives_up_after_the_policy_attempts(server: WireServer, claude: AnthropicModel) -> None:
    server.script(ANTHROPIC_PATH, *[Response(529, anthropic_error(529, "Overloaded"))] * 5)
    with pytest.raises(ModelError) as caught:
        claude.complete([Message.user("go")], [])
    assert (caught.value.status, caught.value.attempts, caught.value.retryable) == (529, 3, True)
    assert len(server.requests) == 3


def test_anthropic_timeout_is_retried(server: WireServer) -> None:
    quick = Response(200, anthropic_message([text_block("quick")]))
    # as test_openai_timeout_is_retried: a quiet second for the quick answer, one more should a load peak pass it
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("late")]), delay_s=WAIT_S), quick, quick)
    timeout_s = slack(1.0)
    with AnthropicModel("claude-test", base_url=server.anthropic_url, api_key="k", retry=fast_within(timeout_s),
                        timeout_s=timeout_s) as m:
        assert m.complete([Message.user("go")], []).text == "quick"
    assert len(server.requests) in (2, 3)


def test_total_time_bounds_the_retries(server: WireServer) -> None:
    policy = RetryPolicy(attempts=50, initial_s=0.05, max_wait_s=0.05, jitter_s=0.0, total_s=0.3)
    server.script(OPENAI_PATH, *[Response(500, openai_error(500, "down", "server_error"))] * 50)
    with OpenAIModel("gpt-test", base_url=server.openai_url, api_key="k", retry=policy) as model:
        started = time.monotonic()
        with pytest.raises(ModelError) as caught:
            model.complete([Message.user("go")], [])
    assert time.monotonic() - started < 0.3 + slack(0.7)
    assert 2 <= caught.value.attempts < 50 and len(server.requests) == caught.value.attempts


# --- model_from_spec and the optional SDKs -------------------------------------------------------


def test_model_from_spec_openai_compatible_server(server: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = model_from_spec("openai:llama3.2:3b", base_url=server.openai_url)
    assert isinstance(model, OpenAIModel) and model.model == "llama3.2:3b"
    server.script(OPENAI_PATH, Response(200, openai_completion("local")))
    try:
        assert model.complete([Message.user("hi")], []).text == "local"
    finally:
        model.close()
    req = server.requests[0]
    assert req.body["model"] == "llama3.2:3b"
    assert req.headers["authorization"] == f"Bearer {LOCAL_API_KEY}"


def test_model_from_spec_anthropic(server: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    model = model_from_spec("anthropic:claude-sonnet-5", base_url=server.anthropic_url)
    assert isinstance(model, AnthropicModel) and model.model == "claude-sonnet-5"
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("hello")])))
    try:
        assert model.complete([Message.user("hi")], []).text == "hello"
    finally:
        model.close()
    assert server.requests[0].body["model"] == "claude-sonnet-5"
    assert "from-env" in json.dumps(server.requests[0].headers)


def test_missing_credentials_are_a_model_error_at_construction(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_ADMIN_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_PROFILE",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_IDENTITY_TOKEN",
        "ANTHROPIC_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # an empty config dir: no profile
    with pytest.raises(ModelError, match="OPENAI_API_KEY") as caught:
        model_from_spec("openai:gpt-4o-mini")
    assert (caught.value.provider, caught.value.status) == ("openai", None)
    with pytest.raises(ModelError) as caught:
        model_from_spec("anthropic:claude-sonnet-5")
    assert (caught.value.provider, caught.value.status) == ("anthropic", None)


@pytest.mark.parametrize("spec", ["gpt-4o", "openai:", ":gpt-4o", "mistral:large"])
def test_model_from_spec_refuses_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match=r"PROVIDER:MODEL|unknown model provider"):
        model_from_spec(spec)


@pytest.mark.parametrize("extra", ["openai", "anthropic"])
def test_a_missing_sdk_names_the_install_command(monkeypatch: pytest.MonkeyPatch, extra: str) -> None:
    monkeypatch.setitem(sys.modules, extra, None)  # makes `import <extra>` fail
    monkeypatch.delitem(sys.modules, f"rho_actors.agent.providers.{extra}")
    with pytest.raises(ImportError, match=rf"pip install 'rho_actors\[{extra}\]'"):
        importlib.import_module(f"rho_actors.agent.providers.{extra}")


def test_importing_the_providers_package_imports_no_sdk() -> None:
    code = (
        "import sys, rho_actors, rho_actors.agent.providers as p; "
        "assert 'openai' not in sys.modules and 'anthropic' not in sys.modules, 'an SDK was imported'; "
        "p.OpenAIModel; assert 'openai' in sys.modules and 'anthropic' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stderr


# --- end to end: agent.prompt, a real ActorSystem, the real SDKs ----------------------------------

RELEASE = threading.Event()  # lets the abandoned `slow` thread end when the test is over


@tool(concurrency="exclusive")
def note(text: str) -> str:
    """Write a note (one at a time)."""
    return f"noted: {text}"


@tool
def explode() -> str:
    """Always fails."""
    raise ValueError("boom")


@tool(timeout_ms=100)
def slow() -> str:
    """Takes too long."""
    RELEASE.wait(5.0)
    return "never seen"


@tool
def snapshot() -> Image:
    """Take a picture."""
    return Image(PNG, "image/png")


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Any]:
    RELEASE.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        for t in (add, note, explode, slow, snapshot):
            system.register(t)
        yield system.start_loop("e2e")
    finally:
        RELEASE.set()
        system.stop()


TOOL_NAMES = {"add", "note", "explode", "slow", "snapshot"}
SLOW_TEXT = "tool 'slow' did not finish within its timeout of 100 ms; it was cancelled"


def test_end_to_end_openai(server: WireServer, oai: OpenAIModel, loop: Any) -> None:
    server.script(
        OPENAI_PATH,
        Response(
            200,
            openai_completion(
                None,
                [("c1", "add", '{"a": 1, "b": 2}'), ("c2", "add", '{"a": 40, "b": 2}'), ("c3", "snapshot", "{}")],
            ),
        ),
        Response(
            200,
            openai_completion(
                "Trying the rest.",
                [
                    ("c4", "note", '{"text": "hi"}'),
                    ("c5", "explode", "{}"),
                    ("c6", "slow", "{}"),
                    ("c7", "teleport", '{"to": "mars"}'),
                    ("c8", "add", '{"a": 1,'),
                ],
            ),
        ),
        Response(200, openai_completion("3 and 42; noted.")),
    )

    result = prompt(loop, "Do the things.", model=oai, max_steps=5)

    assert result.error is None, result.error
    assert result.text == "3 and 42; noted."
    assert len(result.steps) == 3
    bodies = server.bodies(OPENAI_PATH)
    assert len(bodies) == 3
    for body in bodies:
        assert {t["function"]["name"] for t in body["tools"]} == TOOL_NAMES
    assert bodies[0]["messages"] == [{"role": "user", "content": "Do the things."}]

    step2 = bodies[1]["messages"]
    assert [m["role"] for m in step2] == ["user", "assistant", "tool", "tool", "tool", "user"]
    assert [(m["tool_call_id"], m["content"]) for m in step2[2:5]] == [
        ("c1", "3"),
        ("c2", "42"),
        ("c3", "[1 picture follows in the next user message]"),
    ]
    assert step2[5]["content"][1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}

    step3 = bodies[2]["messages"]
    assert step3[:6] == step2  # the conversation only grows
    assert step3[6]["content"] == "Trying the rest." and len(step3[6]["tool_calls"]) == 5
    tool_msgs = {m["tool_call_id"]: m["content"] for m in step3[7:]}
    assert list(tool_msgs) == ["c4", "c5", "c6", "c7", "c8"]  # the model's order
    assert tool_msgs["c4"] == "noted: hi"
    assert tool_msgs["c5"].startswith("Error: tool 'explode' raised ValueError") and "boom" in tool_msgs["c5"]
    assert tool_msgs["c6"] == f"Error: {SLOW_TEXT}"
    assert tool_msgs["c7"].startswith("Error: ") and "teleport" in tool_msgs["c7"]
    assert tool_msgs["c8"].startswith("Error: ") and "JSON" in tool_msgs["c8"]
    kinds = [r.error_kind for r in result.steps[1].results]
    assert kinds == [None, ErrorKind.RAISED, ErrorKind.TIMEOUT, ErrorKind.UNKNOWN_TOOL, ErrorKind.INVALID_JSON]


def test_end_to_end_anthropic(server: WireServer, claude: AnthropicModel, loop: Any) -> None:
    server.script(
        ANTHROPIC_PATH,
        Response(
            200,
            anthropic_message(
                [
                    text_block("Adding."),
                    tool_use_block("t1", "add", {"a": 1, "b": 2}),
                    tool_use_block("t2", "add", {"a": 40, "b": 2}),
                    tool_use_block("t3", "snapshot", {}),
                ]
            ),
        ),
        Response(
            200,
            anthropic_message(
                [
                    tool_use_block("t4", "note", {"text": "hi"}),
                    tool_use_block("t5", "explode", {}),
                    tool_use_block("t6", "slow", {}),
                    tool_use_block("t7", "teleport", {"to": "mars"}),
                    tool_use_block("t8", "add", {"a": "one"}),
                ]
            ),
        ),
        Response(200, anthropic_message([text_block("3 and 42; noted.")])),
    )

    result = prompt(loop, "Do the things.", model=claude, max_steps=5)

    assert result.error is None, result.error
    assert result.text == "3 and 42; noted."
    bodies = server.bodies(ANTHROPIC_PATH)
    assert len(bodies) == 3
    for body in bodies:
        assert {t["name"] for t in body["tools"]} == TOOL_NAMES
        assert all("input_schema" in t for t in body["tools"])

    step2 = bodies[1]["messages"]
    assert [m["role"] for m in step2] == ["user", "assistant", "user"]
    assert step2[1]["content"][0] == {"type": "text", "text": "Adding."}
    results = step2[2]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in results] == [("tool_result", f"t{i}") for i in (1, 2, 3)]
    assert results[0] == {"type": "tool_result", "tool_use_id": "t1", "content": "3"}
    assert results[1] == {"type": "tool_result", "tool_use_id": "t2", "content": "42"}
    assert results[2]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}
    ]

    step3 = bodies[2]["messages"]
    assert step3[:3] == step2
    assert [m["role"] for m in step3] == ["user", "assistant", "user", "assistant", "user"]
    assert [b["input"] for b in step3[3]["content"]] == [{"text": "hi"}, {}, {}, {"to": "mars"}, {"a": "one"}]
    blocks = {b["tool_use_id"]: b for b in step3[4]["content"]}  # ONE user message for the turn
    assert list(blocks) == ["t4", "t5", "t6", "t7", "t8"]
    assert blocks["t4"] == {"type": "tool_result", "tool_use_id": "t4", "content": "noted: hi"}
    for tid in ("t5", "t6", "t7", "t8"):
        assert blocks[tid]["is_error"] is True
    assert "boom" in blocks["t5"]["content"]
    assert blocks["t6"]["content"] == SLOW_TEXT
    assert "teleport" in blocks["t7"]["content"]
    assert "$.a" in blocks["t8"]["content"]
    kinds = [r.error_kind for r in result.steps[1].results]
    assert kinds == [None, ErrorKind.RAISED, ErrorKind.TIMEOUT, ErrorKind.UNKNOWN_TOOL, ErrorKind.INVALID_ARGUMENTS]


def test_end_to_end_model_error_ends_the_prompt_with_a_clear_error(
    server: WireServer, oai: OpenAIModel, loop: Any
) -> None:
    server.script(OPENAI_PATH, Response(401, openai_error(401, "Incorrect API key provided")))
    result = prompt(loop, "hi", model=oai, max_steps=3)
    assert result.error is not None and "401" in result.error and "Incorrect API key provided" in result.error
    assert len(server.requests) == 1


def test_a_reply_cut_short_or_refused_says_so(server: WireServer, oai: OpenAIModel, claude: AnthropicModel) -> None:
    server.script(OPENAI_PATH, Response(200, openai_completion("half an", finish_reason="length")))
    server.script(OPENAI_PATH, Response(200, openai_completion("", finish_reason="content_filter")))
    assert oai.complete([Message.user("go")], [ADD]).stop_reason == "incomplete"
    assert oai.complete([Message.user("go")], [ADD]).stop_reason == "refused"
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("half an")], stop_reason="max_tokens")))
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([text_block("fine")])))
    assert claude.complete([Message.user("go")], [ADD]).stop_reason == "incomplete"
    assert claude.complete([Message.user("go")], [ADD]).stop_reason is None


def test_an_unknown_anthropic_block_is_skipped(server: WireServer, claude: AnthropicModel) -> None:
    server.script(ANTHROPIC_PATH, Response(200, anthropic_message([{"type": "future_block"}, text_block("hi")])))
    assert claude.complete([Message.user("go")], [ADD]).text == "hi"
