"""A model's reply made safe to record and run (the agent loop's first step with any
reply, whatever a :class:`~rho_actors.agent.model.Model` returned)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rho_actors.agent.model import Reply
from rho_actors.agent.provider_rules import replay_arguments
from rho_actors.agent.transcript import thinking_blocks
from rho_actors.encoding import scrub_text
from rho_actors.tool import ToolCall

__all__ = ["checked_reply"]


def checked_reply(reply: Any) -> Reply:
    """``reply`` made safe to record and run: a :class:`Reply` with its tool calls as a tuple (a generator is read
    once), each call's id and name as ``str`` (a missing or non-text id becomes ``""``, for which the wire rules
    make one; a missing name becomes ``""``, an unknown tool) and its arguments as JSON text or a plain dict;
    arguments of any other type become their text (``5`` -> ``"5"``), which the loop's strict decoding then refuses
    as ``invalid_json`` for that call only. Lone surrogates in the text are replaced. Raises ``TypeError`` for a
    reply that is not a :class:`Reply`, text that is not a ``str``, or a call that is not a :class:`ToolCall`."""
    if not isinstance(reply, Reply):
        raise TypeError(f"the model returned a {type(reply).__name__}, not a Reply")
    if not isinstance(reply.text, str):
        raise TypeError(f"the model's reply text is a {type(reply.text).__name__}, not a str")
    calls = []
    for index, call in enumerate(tuple(reply.tool_calls)):
        if not isinstance(call, ToolCall):
            raise TypeError(f"the model's tool call {index} is not a ToolCall: {call!r}")
        call_id = call.id if isinstance(call.id, str) else ""
        name = call.name if isinstance(call.name, str) else ""
        calls.append(ToolCall(call_id, name, _plain_arguments(call.arguments)))
    return Reply(scrub_text(reply.text), tuple(calls), reply.raw, reply.stop_reason, reply.usage,
                 thinking_blocks(getattr(reply, "thinking", ())))


def _plain_arguments(arguments: Any) -> str | dict[str, Any]:
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, Mapping):
        plain = dict(arguments)
        if replay_arguments(plain) is not None:  # a JSON object the transcript and a provider take
            return plain
        try:  # NaN, Infinity or nested too deep: recorded as the text, which the loop refuses
            return json.dumps(plain)
        except (TypeError, ValueError, RecursionError):
            return f"<arguments of type {type(arguments).__name__} that cannot be written as JSON>"
    if isinstance(arguments, (bytes, bytearray)):
        try:
            return bytes(arguments).decode("utf-8")
        except UnicodeDecodeError:
            pass
    try:
        return repr(arguments)
    except BaseException:
        return f"<{type(arguments).__name__}>"
