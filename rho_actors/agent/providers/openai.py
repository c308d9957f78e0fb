"""OpenAI Chat Completions (and OpenAI-compatible servers) as a :class:`rho_actors.agent.model.Model`.

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
"parameters"}}]`` (left out when there are none), each schema the copy Chat Completions
takes (:mod:`rho_actors.agent.provider_schemas`). A reply's function tool calls become
:class:`ToolCall` values whose ``arguments`` is the model's raw ``function.arguments`` text,
untouched (arguments sent as a JSON object, as llama.cpp does, are its JSON text; any
other JSON value too): the loop's strict decoding judges it.

Every request is built from the conversation as :func:`rho_actors.agent.provider_rules.sanitise` makes it
under :data:`~rho_actors.agent.provider_rules.OPENAI_RULES`, so nothing recorded can make it a 400. With
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
    from rho_actors.errors import missing_extra

    raise missing_extra("openai", "the openai provider", _err) from _err

from rho_actors.agent.model import Message, Reply, Usage
from rho_actors.agent.provider_rules import OPENAI_RULES, sanitise
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
from rho_actors.declarations.formats import to_dialect
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
    """A :class:`rho_actors.agent.model.Model` over OpenAI Chat Completions.

    ``model``: the model name (``"gpt-4o-mini"``, or a local server's model name).
    ``client``: an ``openai.OpenAI`` to use (it is copied with ``max_retries=0``);
    otherwise one is made from ``base_url`` (e.g. ``"http://localhost:11434/v1"`` for
    Ollama; default the SDK's, ``OPENAI_BASE_URL`` or api.openai.com) and ``api_key``
    (default ``OPENAI_API_KEY``; with a ``base_url`` and no key anywhere,
    :data:`LOCAL_API_KEY`). ``timeout_s``: the bound on each request, in seconds.
    ``retry``: the :class:`~rho_actors.agent.providers.RetryPolicy` for 408/429/5xx, timeouts
    and connection errors. ``temperature`` and ``max_tokens`` (sent as
    ``max_completion_tokens``): the defaults of every request (``None``: the server's).
    ``extra_body``: more fields for every request's JSON body (``{"seed": 1}``...).

    Raises :class:`~rho_actors.agent.providers.ModelError` (status ``None``) when no API key
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
        """One Chat Completions request: ``messages`` and the neutral ``tools``
        declarations out, the first choice's text and function tool calls back.
        ``temperature``/``max_tokens`` override the model's defaults for this request;
        with ``on_text`` the request streams and ``on_text`` gets each text delta.

        Raises :class:`~rho_actors.agent.providers.ModelError` for a provider error that
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

    Raises :class:`~rho_actors.agent.providers.ModelError` when there is no choice.
    """
    if not completion.choices:
        raise ModelError(PROVIDER, None, "the response has no choices")
    message = completion.choices[0].message
    calls: list[ToolCall] = []
    for call in message.tool_calls or ():
        # a function call, or a custom one (free text input, never declared by us); a
        # part the server left out is empty: the loop answers such a call with an error
        function, custom = getattr(call, "function", None), getattr(call, "custom", None)
        if function is not None:
            name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
        else:
            name, arguments = getattr(custom, "name", None), getattr(custom, "input", None)
        if arguments is None and "arguments" not in getattr(function, "model_fields_set", ()):
            arguments = ""  # none sent: the loop says the arguments were empty
        calls.append(ToolCall(text_or_empty(getattr(call, "id", None)), text_or_empty(name), arguments_text(arguments)))
    text = _text(message.content) if message.content is not None else _text(message.refusal)
    finish = completion.choices[0].finish_reason
    stop = _stop_reason(message.refusal is not None, finish)
    return Reply(text=text, tool_calls=tuple(calls), raw=completion, stop_reason=stop, usage=_usage(completion.usage))


def _text(content: Any) -> str:
    """A message's ``content`` (or ``refusal``) as text: a string, or the ``text`` of the
    parts of a list (as some OpenAI-compatible servers send); anything else is ``""``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None) for part in content]
        return "".join(part for part in parts if isinstance(part, str))
    return ""


def _stop_reason(refused: bool, finish: Any) -> str | None:
    return "refused" if refused else {"length": "incomplete", "content_filter": "refused"}.get(str(finish))


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    return Usage(tokens(getattr(usage, "prompt_tokens", 0)), tokens(getattr(usage, "completion_tokens", 0)))


def reply_from_chunks(chunks: Iterable[ChatCompletionChunk], on_text: Callable[[str], None]) -> Reply:
    """The :class:`Reply` streamed as ``chunks`` (the first choice's deltas, the usage
    of the last chunk), calling ``on_text`` with each text delta as it comes.

    Which call a part belongs to (:class:`_Assembler`): a part with an ``id`` belongs to
    the call of that id at its ``index`` (a new id on a used index starts a new call, as
    Ollama and other servers send every parallel call with ``index: 0``); one without
    an id to the latest call of its ``index``; one without an index to the latest call.
    Name pieces are joined; a piece that repeats the whole name of a call whose name is
    complete (its arguments have begun, or the part repeats its id) is not doubled.
    Arguments sent as a JSON object are taken as its JSON text. Calls keep the order in
    which they first appear. A chunk without choices or delta is skipped."""
    texts: list[str] = []
    refusal: list[str] = []
    calls = _Assembler()
    finish: Any = None
    usage: Usage | None = None
    for chunk in chunks:
        if getattr(chunk, "usage", None) is not None:
            usage = _usage(chunk.usage)
        for choice in getattr(chunk, "choices", None) or ():
            delta = getattr(choice, "delta", None)
            if getattr(choice, "index", 0) not in (0, None) or delta is None:
                continue
            if isinstance(delta.content, str) and delta.content:
                texts.append(delta.content)
                on_text(delta.content)
            if isinstance(delta.refusal, str) and delta.refusal:
                refusal.append(delta.refusal)
            for part in delta.tool_calls or ():
                calls.add(part)
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    text = "".join(texts) if texts or not refusal else "".join(refusal)
    return Reply(text, calls.calls(), None, _stop_reason(bool(refusal), finish), usage)


class _Call:
    """One streamed call being put together; ``depth``/``in_string``/``escaped`` scan its
    argument text as it comes (linear time), so :attr:`complete` says whether it is a
    whole JSON value already."""

    __slots__ = ("arguments", "began", "depth", "escaped", "id", "in_string", "index", "name")

    def __init__(self, index: Any) -> None:
        self.index = index
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []
        self.began = False  # an argument piece came: the name is complete
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def append(self, piece: str) -> None:
        self.arguments.append(piece)
        self.began = True
        for char in piece:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1

    @property
    def complete(self) -> bool:
        return self.began and self.depth <= 0 and not self.in_string


class _Assembler:
    """The calls of one streamed reply, put together from their parts (see
    :func:`reply_from_chunks`)."""

    def __init__(self) -> None:
        self._calls: list[_Call] = []
        self._latest: dict[Any, _Call] = {}  # index -> the latest call at it

    def add(self, part: Any) -> None:
        index = getattr(part, "index", None)
        if not isinstance(index, int) or isinstance(index, bool):
            index = None
        cid = getattr(part, "id", None)
        cid = cid if isinstance(cid, str) and cid else None
        call = self._call(index, cid)
        repeats_id = cid is not None and call.id == cid
        if cid is not None:
            call.id = cid
        function = getattr(part, "function", None)
        if function is None:
            return
        name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
        if isinstance(name, str) and name and not (name == call.name and (call.began or repeats_id)):
            call.name += name
        if arguments is not None:
            piece = arguments_text(arguments)
            if piece:
                call.append(piece)

    def _call(self, index: Any, cid: str | None) -> _Call:
        if index is None:
            if cid is not None:
                for call in self._calls:
                    if call.id == cid:
                        return call
                return self._new(("id", cid))
            return self._calls[-1] if self._calls else self._new(None)
        latest = self._latest.get(index)
        if cid is None:
            if latest is None:
                return self._new(index)
            if latest.complete:  # parts of calls sharing an index, interleaved: the one still open
                for call in reversed(self._calls):
                    if call.index == index and not call.complete:
                        return call
            return latest
        for call in reversed(self._calls):
            if call.index == index and call.id == cid:
                return call
        if latest is not None and not latest.id:
            return latest  # the id of a call whose first part had none
        return self._new(index)

    def _new(self, index: Any) -> _Call:
        call = _Call(index)
        self._calls.append(call)
        if index is not None:
            self._latest[index] = call
        return call

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c.id, c.name, "".join(c.arguments)) for c in self._calls)


def arguments_text(value: Any) -> str:
    """A call's ``arguments`` as the text the loop decodes: text as it is; a JSON object
    (as llama.cpp and other OpenAI-compatible servers send) as its JSON text, which is
    what is recorded and replayed; any other value as its JSON text too (``[1]``,
    ``5``, ``null``), which the loop refuses naming what arrived."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return f"<arguments of type {type(value).__name__}>"


def to_openai_tools(tools: Sequence[Mapping[str, Any]]) -> list[ChatCompletionToolUnionParam]:
    """Neutral declarations (``{name, description, parameters, ...}``) as Chat
    Completions function tools, each with the schema copy Chat Completions takes
    (:func:`rho_actors.agent.provider_schemas.provider_schema`; one no form can carry is left
    out, logged). Raises ``KeyError`` for a declaration without ``name``,
    ``description`` or ``parameters``."""
    wire: list[ChatCompletionToolUnionParam] = []
    for decl, schema in provider_tools(tools, PROVIDER):
        info = ToolInfo(decl["name"], decl["description"], schema)
        dialect = to_dialect(info, "openai")
        wire.append({"type": "function", "function": dialect["function"]})
    return wire


def to_openai_messages(messages: Sequence[Message]) -> list[ChatCompletionMessageParam]:
    """``messages``, sanitised (:func:`rho_actors.agent.provider_rules.sanitise`), as Chat Completions
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
