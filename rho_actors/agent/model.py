"""The model side of the agent loop: a neutral conversation, the :class:`Model` protocol,
and :class:`ScriptedModel`, which plays back given replies (for tests and demos).

A conversation is a list of :class:`Message`: ``system`` instructions (never recorded:
the agent loop puts them first in each request), ``user`` text, ``assistant`` replies (text
and/or tool calls, each with its id and the model's raw argument text), and ``tool``
results (one message per result, with ``tool_call_id``, ``is_error`` and pictures).
Provider adapters (``rho_actors.agent.providers``) translate it to and from their wire
formats; ``details`` never reach a model.

Example::

    model = ScriptedModel([
        Reply(tool_calls=[ToolCall("c1", "add", '{"a": 1, "b": 2}')]),
        Reply(text="1 + 2 = 3"),
    ])
    reply = model.complete([Message.user("add 1 and 2")], tools=[...])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from rho_actors.tool import Image, ToolCall, ToolResult

__all__ = ["Message", "Model", "Reply", "ScriptedModel", "Usage"]

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation.

    ``system``, ``user``: ``text``. ``assistant``: ``text`` (may be empty), ``tool_calls``
    and ``thinking`` (the provider's reasoning blocks, sent back exactly as they came;
    see :attr:`Reply.thinking`). ``tool``: ``tool_call_id``, ``name``, ``text`` (the
    result for the model), ``is_error`` and ``images``.
    """

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    images: tuple[Image, ...] = ()
    thinking: tuple[dict[str, Any], ...] = ()

    @staticmethod
    def system(text: str) -> Message:
        return Message("system", text)

    @staticmethod
    def user(text: str) -> Message:
        return Message("user", text)

    @staticmethod
    def assistant(
        text: str = "", tool_calls: Iterable[ToolCall] = (), thinking: Iterable[dict[str, Any]] = ()
    ) -> Message:
        return Message("assistant", text, tuple(tool_calls), thinking=tuple(dict(b) for b in thinking))

    @staticmethod
    def tool_result(result: ToolResult) -> Message:
        """The message carrying one :class:`ToolResult` back to the model (its
        ``details`` stay with the host)."""
        return Message(
            "tool", result.content, (), result.call_id, result.name, not result.ok, tuple(result.images)
        )


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one request (or a sum of requests) used: ``input_tokens`` (the prompt,
    OpenAI's ``prompt_tokens``) and ``output_tokens`` (the reply, OpenAI's
    ``completion_tokens``)."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)


@dataclass(frozen=True, slots=True)
class Reply:
    """A model's reply: ``text`` and/or ``tool_calls`` (an empty ``tool_calls`` ends the
    loop); ``stop_reason`` is the provider's reason for ending it, normalised to
    ``"incomplete"`` when the reply was cut short (OpenAI ``length``, Anthropic
    ``max_tokens``) and ``"refused"`` when it was withheld (``content_filter``,
    ``refusal``), else None; ``raw`` is the provider's response object, for the host's
    eyes only; ``usage``: the tokens the request used, when the provider said.
    ``thinking``: the reply's reasoning blocks a provider requires back unchanged
    (Anthropic's ``thinking`` blocks ``{"type": "thinking", "thinking", "signature"}``
    and ``redacted_thinking`` blocks ``{"type": "redacted_thinking", "data"}``, in
    their order), recorded in the transcript and replayed as they came."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    raw: Any = field(default=None, compare=False, repr=False)
    stop_reason: str | None = None
    usage: Usage | None = None
    thinking: tuple[dict[str, Any], ...] = ()


@runtime_checkable
class Model(Protocol):
    """A chat model: one call per step of the agent loop.

    ``complete(messages, tools)`` gets the conversation so far and the offered tool
    declarations in the ``"neutral"`` dialect (``name``, ``description``, ``parameters``;
    each adapter converts them), and returns the model's :class:`Reply`. It raises on a
    provider error that retrying did not cure.

    The agent loop passes keyword options only when the host gave them, so a model
    that takes none still works without them: ``temperature`` (float),
    ``max_tokens`` (int, the reply's token budget) and ``on_text`` (a callback given
    each piece of the reply's text as it streams in; a model that does not stream
    calls it once with the whole text). The adapters of ``rho_actors.agent.providers`` take
    all three.
    """

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Reply: ...


class ScriptedModel:
    """A :class:`Model` that plays back ``replies`` in order, recording what it was sent
    (``requests``: a list of ``(messages, tools)``). Raises ``IndexError`` when asked for
    more replies than it was given."""

    def __init__(self, replies: Iterable[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[list[Message], list[dict[str, Any]]]] = []
        self.options: list[dict[str, Any]] = []

    def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        on_text: Callable[[str], None] | None = None,
        **options: Any,
    ) -> Reply:
        """The next scripted reply; ``on_text`` gets its text (when not empty) at
        once; ``options`` (``temperature``, ``max_tokens``) are recorded in
        :attr:`options`."""
        self.requests.append((list(messages), [dict(t) for t in tools]))
        self.options.append(dict(options))
        step = len(self.requests) - 1
        if step >= len(self.replies):
            raise IndexError(f"the scripted model has {len(self.replies)} replies; step {step + 1} asked for one more")
        reply = self.replies[step]
        if on_text is not None and reply.text:
            on_text(reply.text)
        return reply
