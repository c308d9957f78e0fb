"""OpenAI Chat Completions (and OpenAI-compatible servers) as a :class:`rho_actors.model.Model`.

Needs the ``openai`` SDK: ``pip install 'rho_actors[openai]'``.

The conversation goes out as Chat Completions messages:

=====================  ==================================================================
our :class:`Message`   wire message
=====================  ==================================================================
``system``             ``{"role": "system", "content": text}``
``user``               ``{"role": "user", "content": text}``
``assistant``          ``{"role": "assistant", "content": text or null, "tool_calls": [{"id",
                       "type": "function", "function": {"name", "arguments": <raw text>}}]}``
``tool``               ``{"role": "tool", "tool_call_id", "content": text}``; an error's text
                       starts with :data:`ERROR_PREFIX` (Chat Completions has no error flag)
pictures               tool messages cannot carry images, so after a turn's tool messages
                       come one ``user`` message with a text part per call that made
                       pictures and its ``image_url`` parts (``data:<mime>;base64,...``)
=====================  ==================================================================

Declarations go out as ``tools=[{"type": "function", "function": {"name", "description",
"parameters"}}]`` (left out when there are none). A reply's function tool calls become
:class:`ToolCall` values whose ``arguments`` is the model's raw ``function.arguments`` text,
untouched: the loop's strict decoding judges it.

Every request is built from the conversation as :func:`rho_actors.provider_rules.sanitise` makes it
under :data:`~rho_actors.provider_rules.OPENAI_RULES`, so nothing recorded can make it a 400. With
``on_text`` the request streams (``stream=True``, usage included) and the reply is put
together from its chunks.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

try:
    import openai
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionChunk,
        ChatCompletionContentPartParam,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
        ChatCompletionToolUnionParam,
    )
except ImportError as _err:  # pragma: no cover - exercised only without the extra
    from rho_actors.providers import missing_sdk

    raise missing_sdk("openai", _err) from _err

from rho_actors.formats import to_dialect
from rho_actors.model import Message, Reply, Usage
from rho_actors.provider_rules import OPENAI_RULES, sanitise
from rho_actors.providers import (
    DEFAULT_RETRY,
    Failure,
    ModelError,
    RetryPolicy,
    retry_after_s,
    retryable_status,
    send_with_retry,
)
from rho_actors.tool import Image, ToolCall, ToolInfo

__all__ = ["ERROR_PREFIX", "OpenAIModel", "to_openai_messages", "to_openai_tools"]

PROVIDER = "openai"

ERROR_PREFIX = "Error: "
"""Put before an error result's text in its ``tool`` message: Chat Completions has no
``is_error`` flag, and a tool's own ``Error(reason)`` text may not read as one."""

LOCAL_API_KEY = "unused"
"""The API key sent to a ``base_url`` server when none is given or set in the
environment (local OpenAI-compatible servers do not check it; the SDK insists on one)."""


class OpenAIModel:
    """A :class:`rho_actors.model.Model` over OpenAI Chat Completions.

    ``model``: the model name (``"gpt-4o-mini"``, or a local server's model name).
    ``client``: an ``openai.OpenAI`` to use (it is copied with ``max_retries=0``);
    otherwise one is made from ``base_url`` (e.g. ``"http://localhost:11434/v1"`` for
    Ollama; default the SDK's, ``OPENAI_BASE_URL`` or api.openai.com) and ``api_key``
    (default ``OPENAI_API_KEY``; with a ``base_url`` and no key anywhere,
    :data:`LOCAL_API_KEY`). ``timeout_s``: the bound on each request, in seconds.
    ``retry``: the :class:`~rho_actors.providers.RetryPolicy` for 408/429/5xx, timeouts
    and connection errors. ``temperature`` and ``max_tokens`` (sent as
    ``max_completion_tokens``): the defaults of every request (``None``: the server's).
    ``extra_body``: more fields for every request's JSON body (``{"seed": 1}``...).

    Raises :class:`~rho_actors.providers.ModelError` (status ``None``) when no API key
    can be found. Usable as a context
    manager (closes the client it made).
    """

    def __init__(
        self,
        model: str,
        *,
        client: openai.OpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.retry = retry
        self.extra_body = dict(extra_body or {})
        self._owns_client = client is None
        if client is None:
            if base_url is not None and api_key is None and not _env("OPENAI_API_KEY"):
                api_key = LOCAL_API_KEY
            try:
                client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)
            except openai.OpenAIError as err:  # no API key anywhere
                raise ModelError(PROVIDER, None, str(err)) from err
        else:
            client = client.with_options(max_retries=0)
        self.client: openai.OpenAI = client

    wire_rules = OPENAI_RULES
    """What a request must meet (:mod:`rho_actors.provider_rules`)."""

    def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Reply:
        """One Chat Completions request: ``messages`` and the neutral ``tools``
        declarations out, the first choice's text and function tool calls back.
        ``temperature``/``max_tokens`` override the model's defaults for this request;
        with ``on_text`` the request streams and ``on_text`` gets each text delta.

        Raises :class:`~rho_actors.providers.ModelError` for a provider error that
        retrying did not cure, or an answer without choices.
        """
        wire_messages = to_openai_messages(messages)
        wire_tools = to_openai_tools(tools)
        temperature = self.temperature if temperature is None else temperature
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        common: dict[str, Any] = {
            "model": self.model,
            "messages": wire_messages,
            "tools": wire_tools or openai.omit,
            "temperature": openai.omit if temperature is None else temperature,
            "max_completion_tokens": openai.omit if max_tokens is None else max_tokens,
            "timeout": self.timeout_s,
            "extra_body": self.extra_body or None,
        }
        if on_text is None:

            def send() -> ChatCompletion:
                completion: ChatCompletion = self.client.chat.completions.create(**common)
                return completion

            return reply_from_completion(send_with_retry(PROVIDER, self.retry, send, _classify))

        def stream() -> Reply:
            chunks = self.client.chat.completions.create(
                **common, stream=True, stream_options={"include_usage": True}
            )
            with chunks:
                return reply_from_chunks(chunks, on_text)

        return send_with_retry(PROVIDER, self.retry, stream, _classify)

    def close(self) -> None:
        """Close the HTTP client, when this model made it."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> OpenAIModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={str(self.client.base_url)!r})"


def reply_from_completion(completion: ChatCompletion) -> Reply:
    """The :class:`Reply` in ``completion``'s first choice: its text (the refusal text
    when there is no content) and its tool calls, arguments as the raw text.

    Raises :class:`~rho_actors.providers.ModelError` when there is no choice.
    """
    if not completion.choices:
        raise ModelError(PROVIDER, None, "the response has no choices")
    message = completion.choices[0].message
    calls: list[ToolCall] = []
    for call in message.tool_calls or ():
        if call.type == "function":
            calls.append(ToolCall(call.id, call.function.name, call.function.arguments))
        else:  # a custom tool call: free text input, never declared by us; answered as a call
            calls.append(ToolCall(call.id, call.custom.name, call.custom.input))
    text = message.content if message.content is not None else (message.refusal or "")
    finish = completion.choices[0].finish_reason
    stop = _stop_reason(message.refusal is not None, finish)
    return Reply(text=text, tool_calls=tuple(calls), raw=completion, stop_reason=stop, usage=_usage(completion.usage))


def _stop_reason(refused: bool, finish: Any) -> str | None:
    return "refused" if refused else {"length": "incomplete", "content_filter": "refused"}.get(str(finish))


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    return Usage(int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0))


def reply_from_chunks(chunks: Iterable[ChatCompletionChunk], on_text: Callable[[str], None]) -> Reply:
    """The :class:`Reply` streamed as ``chunks`` (the first choice's deltas, the usage
    of the last chunk), calling ``on_text`` with each text delta as it comes."""
    texts: list[str] = []
    refusal: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    finish: Any = None
    usage: Usage | None = None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = _usage(chunk.usage)
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                texts.append(delta.content)
                on_text(delta.content)
            if delta.refusal:
                refusal.append(delta.refusal)
            for part in delta.tool_calls or ():
                slot = calls.setdefault(part.index, ["", "", ""])
                slot[0] = part.id or slot[0]
                if part.function is not None:
                    slot[1] += part.function.name or ""
                    slot[2] += part.function.arguments or ""
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    tool_calls = tuple(ToolCall(cid, name, args) for cid, name, args in (calls[i] for i in sorted(calls)))
    text = "".join(texts) if texts or not refusal else "".join(refusal)
    return Reply(text, tool_calls, None, _stop_reason(bool(refusal), finish), usage)


def to_openai_tools(tools: Sequence[Mapping[str, Any]]) -> list[ChatCompletionToolUnionParam]:
    """Neutral declarations (``{name, description, parameters, ...}``) as Chat
    Completions function tools. Raises ``KeyError`` for a declaration without
    ``name``, ``description`` or ``parameters``."""
    wire: list[ChatCompletionToolUnionParam] = []
    for decl in tools:
        info = ToolInfo(decl["name"], decl["description"], dict(decl["parameters"]))
        dialect = to_dialect(info, "openai")
        wire.append({"type": "function", "function": dialect["function"]})
    return wire


def to_openai_messages(messages: Sequence[Message]) -> list[ChatCompletionMessageParam]:
    """``messages``, sanitised (:func:`rho_actors.provider_rules.sanitise`), as Chat Completions
    messages (see the module docstring). Never raises."""
    messages = sanitise(messages, OPENAI_RULES)
    wire: list[ChatCompletionMessageParam] = []
    pictures: list[Message] = []  # the current run of tool messages that carry images

    def flush_pictures() -> None:
        if pictures:
            wire.append({"role": "user", "content": list(_picture_parts(pictures))})
            pictures.clear()

    for message in messages:
        if message.role != "tool":
            flush_pictures()
        if message.role == "user":
            wire.append({"role": "user", "content": message.text})
        elif message.role == "system":
            wire.append({"role": "system", "content": message.text})
        elif message.role == "assistant":
            wire.append(_assistant(message))
        elif message.role == "tool":
            wire.append({"role": "tool", "tool_call_id": message.tool_call_id or "", "content": _tool_text(message)})
            if message.images:
                pictures.append(message)
    flush_pictures()
    return wire


def _assistant(message: Message) -> ChatCompletionMessageParam:
    if not message.tool_calls:
        return {"role": "assistant", "content": message.text}
    calls: list[ChatCompletionMessageFunctionToolCallParam] = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_text(c)}}
        for c in message.tool_calls
    ]
    return {"role": "assistant", "content": message.text or None, "tool_calls": calls}


def _arguments_text(call: ToolCall) -> str:
    if isinstance(call.arguments, str):
        return call.arguments
    return json.dumps(dict(call.arguments), ensure_ascii=False)


def _tool_text(message: Message) -> str:
    text = message.text
    if message.images:
        n = len(message.images)
        note = f"[{n} {'pictures follow' if n > 1 else 'picture follows'} in the next user message]"
        text = f"{text}\n{note}" if text else note
    return f"{ERROR_PREFIX}{text}" if message.is_error else text


def _picture_parts(messages: Sequence[Message]) -> Iterator[ChatCompletionContentPartParam]:
    for message in messages:
        n = len(message.images)
        yield {
            "type": "text",
            "text": f"The {'pictures' if n > 1 else 'picture'} returned by tool call "
            f"{message.tool_call_id} ({message.name}):",
        }
        for image in message.images:
            yield {"type": "image_url", "image_url": {"url": data_url(image)}}


def data_url(image: Image) -> str:
    """``image`` as a ``data:<mime type>;base64,<data>`` URL."""
    return f"data:{image.mime_type};base64,{base64.b64encode(image.data).decode('ascii')}"


def _classify(exc: Exception) -> Failure | None:
    if isinstance(exc, openai.APIStatusError):
        return Failure(
            retryable_status(exc.status_code),
            exc.status_code,
            _api_message(exc),
            retry_after_s(exc.response.headers),
        )
    if isinstance(exc, openai.APITimeoutError):
        return Failure(True, None, "the request timed out")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return Failure(True, None, f"connection error: {cause or exc.message}")
    if isinstance(exc, openai.APIResponseValidationError):
        return Failure(False, exc.status_code, f"the response did not have the expected shape: {exc.message}")
    if isinstance(exc, openai.OpenAIError):
        return Failure(False, None, str(exc))
    return None


def _api_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
    return exc.message


def _env(name: str) -> str | None:
    import os

    return os.environ.get(name) or None
