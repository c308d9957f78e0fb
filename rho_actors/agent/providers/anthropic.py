"""Anthropic Messages as a :class:`rho_actors.agent.model.Model`.

Needs the ``anthropic`` SDK: ``pip install 'rho_actors[anthropic]'``.

The conversation goes out as Messages API turns:

=====================  ==================================================================
our :class:`Message`   wire message
=====================  ==================================================================
``system``             the request's ``system`` text (several are joined by a blank line)
``user``               ``{"role": "user", "content": text}``; right after tool results it
                       is a ``text`` block in their user message instead
``assistant``          ``{"role": "assistant", "content": [{"type": "thinking"}...,
                       {"type": "text"}..., {"type": "tool_use", "id", "name", "input":
                       {...}}...]}``: its recorded ``thinking``/``redacted_thinking``
                       blocks first, exactly as they came (signatures included), then
                       text and calls (an assistant message with neither text nor calls
                       is left out: the API refuses empty content)
``tool``               a ``tool_result`` block ``{"tool_use_id", "content", "is_error":
                       true}`` (``is_error`` only on errors); the consecutive results of a
                       turn share ONE user message. ``content`` is the text, or with
                       pictures a list: a ``text`` block, then ``image`` blocks with a
                       base64 source and its ``media_type``
=====================  ==================================================================

Declarations go out as ``tools=[{"name", "description", "input_schema"}]`` (left out when
there are none), each schema the copy the Messages API takes
(:mod:`rho_actors.agent.provider_schemas`). A reply's ``tool_use`` blocks become :class:`ToolCall` values whose
``arguments`` is the block's ``input`` object (a mapping); its ``text`` blocks, joined,
are the reply's text; its ``thinking`` and ``redacted_thinking`` blocks are
:attr:`Reply.thinking`, recorded and sent back unchanged (with extended thinking on, the
API refuses a tool-use turn continued without them). Other blocks (server tools) are
not kept.

Extended thinking (``thinking=``, or ``"thinking"`` in ``extra_body``): a request that
continues a tool-use turn whose assistant message has no thinking block (a transcript
recorded before thinking blocks were kept, or a turn made with thinking off) is sent
with thinking off for that request, the documented way to continue such a turn (a
warning is logged); every other request has it on.

Every request is built from the conversation as :func:`rho_actors.agent.provider_rules.sanitise` makes it
under :data:`~rho_actors.agent.provider_rules.ANTHROPIC_RULES`, so nothing recorded can make it a 400.
With ``on_text`` the request streams (``messages.stream``) and ``on_text`` gets each text
delta.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

from loguru import logger

try:
    import anthropic
    from anthropic.types import (
        ContentBlockParam,
        ImageBlockParam,
        MessageParam,
        RedactedThinkingBlock,
        TextBlock,
        TextBlockParam,
        ThinkingBlock,
        ToolParam,
        ToolResultBlockParam,
        ToolUseBlock,
    )
    from anthropic.types import Message as AnthropicMessage
except ImportError as _err:  # pragma: no cover - exercised only without the extra
    from rho_actors.errors import missing_extra

    raise missing_extra("anthropic", "the anthropic provider", _err) from _err

from rho_actors.agent.model import Message, Reply, Usage
from rho_actors.agent.provider_rules import ANTHROPIC_RULES, replay_arguments, sanitise
from rho_actors.agent.provider_schemas import provider_tools
from rho_actors.agent.providers import (
    DEFAULT_RETRY,
    Failure,
    ModelError,
    RetryPolicy,
    retry_after_s,
    retryable_status,
    send_with_retry,
    text_or_empty,
    tokens,
)
from rho_actors.agent.transcript import thinking_blocks
from rho_actors.declarations.formats import to_dialect
from rho_actors.tool import Image, ToolCall, ToolInfo

__all__ = ["IMAGE_TYPES", "AnthropicModel", "to_anthropic_messages", "to_anthropic_tools"]

PROVIDER = "anthropic"

ImageType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
IMAGE_TYPES: tuple[ImageType, ...] = ("image/jpeg", "image/png", "image/gif", "image/webp")
"""The picture types the Messages API takes; a picture of another type is replaced by a
text block saying so."""

NO_CREDENTIALS = "no credentials: pass api_key, or set ANTHROPIC_API_KEY (or an Anthropic profile)"


class AnthropicModel:
    """A :class:`rho_actors.agent.model.Model` over Anthropic Messages.

    ``model``: the model name (``"claude-sonnet-5"``...). ``client``: an
    ``anthropic.Anthropic`` to use (it is copied with ``max_retries=0``); otherwise one
    is made from ``base_url`` (default ``ANTHROPIC_BASE_URL`` or api.anthropic.com) and
    ``api_key`` (default: the SDK's resolution, ``ANTHROPIC_API_KEY`` first).
    ``max_tokens``: the reply's token budget. ``timeout_s``: the bound on each request,
    in seconds. ``retry``: the :class:`~rho_actors.agent.providers.RetryPolicy` for
    408/429/5xx (529 "overloaded" included), timeouts and connection errors.
    ``temperature``: the default of every request (``None``: the server's).
    ``thinking``: the request's extended thinking setting (``{"type": "enabled",
    "budget_tokens": 2048}``; ``None``: not sent), see the module docstring.
    ``extra_body``: more fields for every request's JSON body (``{"top_k": 5}``...).

    Raises :class:`~rho_actors.agent.providers.ModelError` (status ``None``) when no
    credentials can be found. Usable as a context manager (closes the client it made).
    """

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.Anthropic | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 4096,
        timeout_s: float = 60.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        temperature: float | None = None,
        thinking: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.thinking = dict(thinking) if thinking is not None else None
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.retry = retry
        self.extra_body = dict(extra_body or {})
        self._owns_client = client is None
        if client is None:
            try:
                client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)
            except anthropic.AnthropicError as err:  # a profile or config that cannot be read
                raise ModelError(PROVIDER, None, f"no usable credentials: {err}") from err
            if client.api_key is None and client.auth_token is None and client.credentials is None:
                # the SDK would only fail at the first request, with a TypeError
                raise ModelError(PROVIDER, None, NO_CREDENTIALS)
        else:
            client = client.with_options(max_retries=0)
        self.client: anthropic.Anthropic = client

    wire_rules = ANTHROPIC_RULES
    """What a request must meet (:mod:`rho_actors.agent.provider_rules`)."""

    def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Reply:
        """One Messages request: ``messages`` and the neutral ``tools`` declarations
        out, the reply's text and ``tool_use`` calls back. ``temperature`` and
        ``max_tokens`` override the model's for this request; with ``on_text`` the
        request streams and ``on_text`` gets each text delta.

        Raises :class:`~rho_actors.agent.providers.ModelError` for a provider error that
        retrying did not cure.
        """
        system, wire_messages = to_anthropic_request(messages)
        wire_tools = to_anthropic_tools(tools)
        temperature = self.temperature if temperature is None else temperature
        extra = dict(self.extra_body)
        thinking = extra.pop("thinking", self.thinking)
        if thinking is not None and _thinking_on(thinking) and not _turn_has_thinking(wire_messages):
            logger.warning("anthropic: the tool-use turn this request continues has no thinking block (recorded "
                           "without one); extended thinking is off for this request")
            thinking = None
        common: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens if max_tokens is None else max_tokens,
            "messages": wire_messages,
            "system": system or anthropic.omit,
            "tools": wire_tools or anthropic.omit,
            "timeout": self.timeout_s,
            # the SDK's create() has no temperature parameter of its own: the API takes it
            "extra_body": {**({} if temperature is None else {"temperature": temperature}), **extra} or None,
        }
        if thinking is not None:
            common["thinking"] = thinking
        if on_text is None:

            def send() -> AnthropicMessage:
                message: AnthropicMessage = self.client.messages.create(**common)
                return message

            return reply_from_message(send_with_retry(PROVIDER, self.retry, send, _classify))

        def stream() -> AnthropicMessage:
            with self.client.messages.stream(**common) as events:
                for event in events:
                    if event.type == "text" and event.text:
                        on_text(event.text)
                return events.get_final_message()

        return reply_from_message(send_with_retry(PROVIDER, self.retry, stream, _classify))

    def close(self) -> None:
        """Close the HTTP client, when this model made it."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> AnthropicModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r}, base_url={str(self.client.base_url)!r})"


def reply_from_message(message: AnthropicMessage) -> Reply:
    """The :class:`Reply` in ``message``: its ``text`` blocks joined, its ``tool_use``
    blocks as calls with the ``input`` object as arguments."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    thinking: list[dict[str, Any]] = []
    for block in message.content or ():
        if isinstance(block, TextBlock) and isinstance(block.text, str):  # an unknown block type is skipped
            texts.append(block.text)
        elif isinstance(block, (ThinkingBlock, RedactedThinkingBlock)):
            thinking.extend(thinking_blocks([block.model_dump()]))
        elif isinstance(block, ToolUseBlock):
            call_id, name = text_or_empty(getattr(block, "id", None)), text_or_empty(getattr(block, "name", None))
            calls.append(ToolCall(call_id, name, _arguments(getattr(block, "input", None))))
    stop = {"max_tokens": "incomplete", "refusal": "refused"}.get(str(message.stop_reason))
    usage = message.usage
    used = None if usage is None else Usage(tokens(getattr(usage, "input_tokens", 0)),
                                            tokens(getattr(usage, "output_tokens", 0)))
    return Reply(text="".join(texts), tool_calls=tuple(calls), raw=message, stop_reason=stop, usage=used,
                 thinking=tuple(thinking))


def _arguments(value: Any) -> str | dict[str, Any]:
    """A ``tool_use`` block's ``input``: the object, or the JSON text of anything else
    (which the loop refuses as ``invalid_json``, naming its type)."""
    if isinstance(value, dict):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return ""


def to_anthropic_tools(tools: Sequence[Mapping[str, Any]]) -> list[ToolParam]:
    """Neutral declarations (``{name, description, parameters, ...}``) as Messages API
    tools, each with the schema copy the Messages API takes
    (:func:`rho_actors.agent.provider_schemas.provider_schema`; one no form can carry is left
    out, logged). Raises ``KeyError`` for a declaration without ``name``,
    ``description`` or ``parameters``."""
    wire: list[ToolParam] = []
    for decl, schema in provider_tools(tools, PROVIDER):
        info = ToolInfo(decl["name"], decl["description"], schema)
        dialect = to_dialect(info, "anthropic")
        wire.append(
            {"name": dialect["name"], "description": dialect["description"], "input_schema": dialect["input_schema"]}
        )
    return wire


def to_anthropic_messages(messages: Sequence[Message]) -> list[MessageParam]:
    """``messages``, sanitised, as Messages API turns (``system`` messages left out:
    see :func:`to_anthropic_request`). Never raises."""
    return to_anthropic_request(messages)[1]


def to_anthropic_request(messages: Sequence[Message]) -> tuple[str, list[MessageParam]]:
    """``messages``, sanitised (:func:`rho_actors.agent.provider_rules.sanitise`), as the request's
    ``system`` text and its Messages API turns (see the module docstring). Never raises."""
    wire: list[MessageParam] = []
    system: list[str] = []
    results: list[ContentBlockParam] | None = None  # the open user message of tool results

    for message in sanitise(messages, ANTHROPIC_RULES):
        if message.role == "system":
            system.append(message.text)
        elif message.role == "tool":
            if results is None:
                results = []
                wire.append({"role": "user", "content": results})
            results.append(_tool_result(message))
        elif message.role == "user":
            if results is not None:
                results.append({"type": "text", "text": message.text})
            else:
                wire.append({"role": "user", "content": message.text})
        elif message.role == "assistant":
            results = None
            blocks: list[ContentBlockParam] = [cast(ContentBlockParam, dict(b)) for b in message.thinking]
            if message.text:
                blocks.append({"type": "text", "text": message.text})
            blocks.extend(
                {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)} for c in message.tool_calls
            )
            if len(blocks) > len(message.thinking):
                wire.append({"role": "assistant", "content": blocks})
    return "\n\n".join(system), wire


def _thinking_on(setting: Any) -> bool:
    return isinstance(setting, Mapping) and setting.get("type") != "disabled"


def _turn_has_thinking(wire: Sequence[MessageParam]) -> bool:
    """Whether the request may have thinking on: unless it continues a tool-use turn
    (it ends with tool results) whose assistant message does not start with a thinking
    block, which the API refuses with thinking on."""
    if len(wire) < 2 or wire[-1]["role"] != "user":
        return True
    last = wire[-1]["content"]
    if isinstance(last, str) or not any(_block_type(b) == "tool_result" for b in last):
        return True
    assistant = wire[-2]["content"]
    if isinstance(assistant, str) or not assistant:
        return True
    return _block_type(next(iter(assistant))) in ("thinking", "redacted_thinking")


def _block_type(block: Any) -> Any:
    return block.get("type") if isinstance(block, Mapping) else getattr(block, "type", None)


def _input(call: ToolCall) -> dict[str, object]:
    """A sanitised call's arguments as the ``tool_use`` input object (text that is not
    a JSON object was already replaced by ``{}``, its result saying so)."""
    value = replay_arguments(call.arguments)
    return cast(dict[str, object], value) if value is not None else {}


def _tool_result(message: Message) -> ToolResultBlockParam:
    block: ToolResultBlockParam = {"type": "tool_result", "tool_use_id": message.tool_call_id or ""}
    if message.images:
        parts: list[TextBlockParam | ImageBlockParam] = []
        if message.text:
            parts.append({"type": "text", "text": message.text})
        parts.extend(_image(image) for image in message.images)
        block["content"] = parts
    elif message.text:
        block["content"] = message.text
    if message.is_error:
        block["is_error"] = True
    return block


def _image(image: Image) -> TextBlockParam | ImageBlockParam:
    media_type = image.mime_type.lower()
    for supported in IMAGE_TYPES:
        if media_type == supported:
            data = base64.b64encode(image.data).decode("ascii")
            return {"type": "image", "source": {"type": "base64", "media_type": supported, "data": data}}
    return {
        "type": "text",
        "text": f"[a picture of type {image.mime_type} was left out: the Messages API takes only "
        "JPEG, PNG, GIF and WebP]",
    }


def _classify(exc: Exception) -> Failure | None:
    if isinstance(exc, anthropic.APIStatusError):
        return Failure(
            retryable_status(exc.status_code),
            exc.status_code,
            exc.api_message or exc.message,
            retry_after_s(exc.response.headers),
        )
    if isinstance(exc, anthropic.APITimeoutError):
        return Failure(True, None, "the request timed out")
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__
        return Failure(True, None, f"connection error: {cause or exc.message}")
    if isinstance(exc, anthropic.APIResponseValidationError):
        return Failure(False, exc.status_code, f"the response did not have the expected shape: {exc.message}")
    if isinstance(exc, anthropic.AnthropicError):
        return Failure(False, None, str(exc))
    return None
