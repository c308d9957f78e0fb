"""Wire rules: what each provider accepts in a request, and the one sanitiser that makes
any neutral conversation meet them.

A session's transcript is replayed to the model on every request, so one element a
provider refuses with HTTP 400 would make every later prompt of the session fail. The
sanitiser is applied in two places, always the same code:

- before a reply is recorded (:func:`sanitise_calls`, by :mod:`rho_actors.agent`), so
  every recorded call has a unique, valid id and runs once;
- when a request is built (:func:`sanitise`, by each adapter), so anything recorded,
  including by an earlier version, is sent in a form the provider accepts.

The rules (each a documented 400 of the provider):

==============================  ==========================================================
element                         what is sent
==============================  ==========================================================
tool call id                    non-empty, unique in the conversation, of the provider's
                                characters and length (generated where missing; a clash
                                gets a suffix); its results follow it
exact duplicate call            (same id, name and arguments in one reply) kept once, with
                                one result
tool name                       ``[A-Za-z0-9_-]{1,64}``; other characters become ``_``
arguments                       a JSON object; text that is not one (invalid JSON, not an
                                object, ``NaN``, nested deeper than
                                :data:`MAX_REPLAY_DEPTH`) is replayed as ``{}`` and its
                                result says so (the transcript keeps what was sent)
text                            valid UTF-8 (lone surrogates replaced); a blank user or
                                system message is left out; a blank assistant text is
                                empty; an assistant message with neither text nor calls is
                                left out
tool result                     one per call, right after its call's message; an error
                                always carries text; a result of no call is left out; a
                                call without one gets a ``cancelled`` error result
images                          of the provider's types (lower case), size and dimensions
                                (:class:`WireRules`), else replaced by a text notice
pictures of one request         within the provider's per-request limits (how many, how
                                large a side when there are many, how many bytes in
                                all): the newest kept, each older one left out with a
                                text notice in its result
==============================  ==========================================================

Building a request never raises for anything a conversation can hold (#17).
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from rho_actors.agent.model import Message, Reply
from rho_actors.agent.transcript import thinking_blocks
from rho_actors.encoding import scrub_text
from rho_actors.results import text as result_text
from rho_actors.tool import Image, ToolCall

__all__ = [
    "ANTHROPIC_RULES",
    "MAX_REPLAY_DEPTH",
    "NEUTRAL_RULES",
    "OPENAI_RULES",
    "WireRules",
    "checked_reply",
    "image_problem",
    "plain_arguments",
    "replay_arguments",
    "sanitise",
    "sanitise_calls",
]

MAX_REPLAY_DEPTH: Final = 64
"""The deepest arguments object replayed to a provider (the loop's default argument
depth bound); deeper ones are replayed as ``{}``."""

REPLACED_ARGUMENTS: Final = "[the arguments sent with this call were not a JSON object; they are shown as {} here]"
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64


@dataclass(frozen=True, slots=True)
class WireRules:
    """What one provider accepts (from its API reference).

    ``provider``: its name. ``id_invalid``: a regular expression of the characters a
    tool call id must not hold (each becomes ``_``; ``None``: any text).
    ``max_id_length``: characters. ``image_types``: the MIME types taken.
    ``max_image_bytes``: the largest picture, in bytes.
    ``max_image_side``: the largest width or height, in pixels (``None``: no bound).
    Per request: ``max_images`` pictures at most; when it holds more than
    ``many_images``, none wider or taller than ``many_images_side`` pixels;
    ``max_request_bytes``: the largest request body, in bytes (pictures go base64).
    """

    provider: str
    id_invalid: str | None
    max_id_length: int
    image_types: frozenset[str]
    max_image_bytes: int
    max_image_side: int | None
    max_images: int | None = None
    many_images: int | None = None
    many_images_side: int | None = None
    max_request_bytes: int | None = None


_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})

OPENAI_RULES: Final = WireRules("openai", None, 40, _TYPES, 20 * 2**20, None, max_images=500,
                                max_request_bytes=50_000_000)
"""Chat Completions: ids of at most 40 characters; PNG, JPEG, WebP, GIF up to 20 MB; at
most 500 pictures and 50 MB in one request."""

ANTHROPIC_RULES: Final = WireRules("anthropic", r"[^A-Za-z0-9_-]", 64, _TYPES, 5 * 2**20, 8000, max_images=100,
                                   many_images=20, many_images_side=2000, max_request_bytes=32_000_000)
"""Messages API: ids of ``[A-Za-z0-9_-]``; JPEG, PNG, GIF, WebP up to 5 MB and 8000 px a
side; at most 100 pictures in one request, none over 2000 px a side when it holds more
than 20, and 32 MB in all."""

NEUTRAL_RULES: Final = WireRules("neutral", r"[^A-Za-z0-9_-]", 40, _TYPES, 5 * 2**20, 8000, max_images=100,
                                 many_images=20, many_images_side=2000, max_request_bytes=32_000_000)
"""Both providers' rules at once: what is recorded for a model without rules of its own."""

_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg"}
_PIL_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}


# --------------------------------------------------------------------------- arguments


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STRICT = json.JSONDecoder(parse_constant=_reject_constant)


def _depth_ok(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, float) and not math.isfinite(item):
            return False
    return True


def replay_arguments(arguments: Any) -> dict[str, Any] | None:
    """A call's ``arguments`` (JSON text or a mapping) as the JSON object to replay, or
    ``None`` when they are not a JSON object a provider takes (invalid JSON, another
    JSON type, ``NaN``/``Infinity``, non-string keys, nested deeper than
    :data:`MAX_REPLAY_DEPTH`). Never raises."""
    try:
        if isinstance(arguments, str):
            value = _STRICT.decode(scrub_text(arguments))
        elif isinstance(arguments, Mapping):
            value = dict(arguments)
            json.dumps(value, allow_nan=False)  # keys, types and NaN, checked by the encoder
            value = json.loads(scrub_text(json.dumps(value, allow_nan=False)))
        else:
            return None
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(value, dict) or not _depth_ok(value, MAX_REPLAY_DEPTH):
        return None
    return value


# --------------------------------------------------------------------------- ids and names


def _clean_id(raw: Any, rules: WireRules) -> str:
    text = scrub_text(raw) if isinstance(raw, str) else ""
    if rules.id_invalid is not None:
        text = re.sub(rules.id_invalid, "_", text)
    return text[: rules.max_id_length]


def _unique(base: str, taken: set[str], rules: WireRules) -> str:
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        suffix = f"_{n}"
        candidate = base[: rules.max_id_length - len(suffix)] + suffix
    taken.add(candidate)
    return candidate


def _clean_name(raw: Any) -> str:
    text = _NAME_CHARS.sub("_", raw if isinstance(raw, str) else "")[:_MAX_NAME]
    return text or "unnamed_tool"


def sanitise_calls(
    calls: Sequence[ToolCall], rules: WireRules, taken: set[str], salt: str
) -> tuple[tuple[ToolCall, ...], tuple[int, ...]]:
    """One reply's ``calls`` with unique, valid ids: ``(calls, sources)``, where
    ``sources[k]`` is the index in ``calls`` of the call kept as the k-th.

    An exact duplicate of an earlier call of the reply (same id, name and arguments) is
    left out; a call without an id, or with one already in ``taken`` (the ids used so
    far, updated here), gets a new one (``call_<salt>_<index>``, or the id with a
    suffix). Names, ids and arguments keep what the model sent otherwise (arguments are
    checked when replayed, :func:`replay_arguments`)."""
    kept: list[ToolCall] = []
    sources: list[int] = []
    seen: set[tuple[str, str, str]] = set()
    for index, call in enumerate(calls):
        key = (str(call.id), str(call.name), _arguments_key(call.arguments))
        if key in seen:
            continue
        seen.add(key)
        base = _clean_id(call.id, rules) or _clean_id(f"call_{salt}_{index}", rules)
        new_id = _unique(base, taken, rules)
        kept.append(call if new_id == call.id else ToolCall(new_id, call.name, call.arguments))
        sources.append(index)
    return tuple(kept), tuple(sources)


def _arguments_key(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(arguments, sort_keys=True, default=repr)
    except (ValueError, TypeError, RecursionError):
        return f"<{id(arguments)}>"


# --------------------------------------------------------------------------- images


def image_problem(image: Any, rules: WireRules) -> tuple[Image | None, str | None]:
    """``(image, None)`` with the type normalised when ``rules`` take it, else
    ``(None, why)``: not bytes, a type the provider does not take, too many bytes, not
    readable as its type, or a side over ``rules.max_image_side``."""
    data = getattr(image, "data", None)
    mime = getattr(image, "mime_type", None)
    if not isinstance(data, (bytes, bytearray)):
        return None, "its data is not bytes"
    if not isinstance(mime, str):
        return None, "it has no MIME type"
    mime = _ALIASES.get(mime.strip().lower(), mime.strip().lower())
    if mime not in rules.image_types:
        return None, f"its type {scrub_text(mime)[:60]} is not one of {', '.join(sorted(rules.image_types))}"
    if len(data) > rules.max_image_bytes:
        return None, f"it has {len(data):,} bytes, over the limit of {rules.max_image_bytes:,}"
    size = _pixel_size(bytes(data))
    if size is None:
        return None, f"its data is not a readable {mime} picture"
    fmt, width, height = size
    if fmt != mime:
        return None, f"its data is a {fmt} picture, not {mime}"
    if rules.max_image_side is not None and max(width, height) > rules.max_image_side:
        return None, f"it is {width}x{height} pixels, over the limit of {rules.max_image_side} a side"
    return Image(bytes(data), mime), None


def _pixel_size(data: bytes) -> tuple[str, int, int] | None:
    """The picture's type and size, read from its header by Pillow (the pixels are not
    decoded)."""
    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(data)) as picture:
            fmt = _PIL_FORMATS.get(str(picture.format))
            if fmt is None:
                return None
            width, height = picture.size
            return fmt, int(width), int(height)
    except Exception:
        return None


# --------------------------------------------------------------------------- conversations


@dataclass(slots=True)
class _Open:
    """The calls of the last assistant message still waiting for their results."""

    message_at: int
    calls: list[ToolCall]
    original_ids: list[str]
    replaced: list[bool]
    answered: list[bool]


def sanitise(messages: Sequence[Message], rules: WireRules) -> list[Message]:
    """``messages`` in a form that meets ``rules`` (see the module docstring): what a
    request is built from. Idempotent; never raises for anything a :class:`Message`
    can hold."""
    out: list[Message] = []
    taken: set[str] = set()
    open_: _Open | None = None

    def close() -> None:
        nonlocal open_
        if open_ is None:
            return
        for k, call in enumerate(open_.calls):
            if not open_.answered[k]:
                out.append(Message("tool", result_text("no_result"), (), call.id, call.name, True))
        open_ = None

    for position, message in enumerate(messages):
        role = message.role
        text = scrub_text(message.text) if isinstance(message.text, str) else ""
        if role == "tool":
            if open_ is None:
                continue  # a result of no call
            k = _match(open_, message.tool_call_id)
            if k is None:
                continue
            open_.answered[k] = True
            out.append(_tool_message(message, text, open_.calls[k], open_.replaced[k], rules))
            continue
        close()
        if role in ("user", "system"):
            if text.strip():
                out.append(Message(role, text))
        elif role == "assistant":
            calls, sources = sanitise_calls(tuple(message.tool_calls), rules, taken, f"m{position}")
            replayed: list[ToolCall] = []
            replaced: list[bool] = []
            for call in calls:
                value = replay_arguments(call.arguments)
                replaced.append(value is None)
                arguments: str | dict[str, Any]
                if value is None:
                    arguments = {}
                elif isinstance(call.arguments, str):
                    arguments = scrub_text(call.arguments)
                else:
                    arguments = value
                replayed.append(ToolCall(call.id, _clean_name(call.name), arguments))
            if not text.strip():
                text = ""
            if not text and not replayed:
                continue
            out.append(Message("assistant", text, tuple(replayed), thinking=message.thinking))
            if replayed:
                originals = [str(message.tool_calls[i].id) for i in sources]
                open_ = _Open(len(out) - 1, replayed, originals, replaced, [False] * len(replayed))
    close()
    return _within_request_limits(out, rules)


REQUEST_RESERVE_BYTES: Final = 2_000_000
"""Bytes of a request kept for what is not a picture (JSON, declarations), beyond the
conversation's text, when pictures are fitted into :attr:`WireRules.max_request_bytes`."""


def _within_request_limits(messages: list[Message], rules: WireRules) -> list[Message]:
    """``messages`` with their pictures fitted into ``rules``' per-request limits: the
    newest first, each that does not fit (with the newer ones kept) left out with a
    notice in its result's text."""
    if not any(m.images for m in messages):
        return messages
    text_bytes = sum(len(m.text) + sum(len(str(c.arguments)) for c in m.tool_calls) for m in messages)
    budget = None if rules.max_request_bytes is None else rules.max_request_bytes - REQUEST_RESERVE_BYTES - text_bytes
    count = total = 0
    large_kept = False
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if not message.images:
            continue
        kept: list[Image] = []
        notes: list[str] = []
        for image in reversed(message.images):
            size = _pixel_size(image.data)
            side = max(size[1], size[2]) if size is not None else 0
            encoded = 4 * ((len(image.data) + 2) // 3)
            large = rules.many_images_side is not None and side > rules.many_images_side
            why = None
            if rules.max_images is not None and count + 1 > rules.max_images:
                why = (f"the request already holds the {rules.max_images} newest pictures, the most "
                       f"{rules.provider} takes in one request")
            elif budget is not None and total + encoded > budget:
                why = f"with the newer pictures it would make the request larger than {rules.provider}'s " \
                      f"{rules.max_request_bytes:,} bytes"
            elif rules.many_images is not None and count + 1 > rules.many_images and (large or large_kept):
                why = (f"{rules.provider} takes no picture over {rules.many_images_side} px a side in a request of "
                       f"more than {rules.many_images} pictures, and newer ones are kept first")
            if why is None:
                kept.append(image)
                count, total, large_kept = count + 1, total + encoded, large_kept or large
            else:
                notes.append(f"[an older picture was left out of this request: {why}]")
        if notes:
            text = "\n".join([message.text, *reversed(notes)]) if message.text else "\n".join(reversed(notes))
            messages[position] = replace(message, text=text, images=tuple(reversed(kept)))
    return messages


def _match(open_: _Open, call_id: Any) -> int | None:
    for k, original in enumerate(open_.original_ids):
        if not open_.answered[k] and original == call_id:
            return k
    return None


def _tool_message(message: Message, content: str, call: ToolCall, replaced: bool, rules: WireRules) -> Message:
    images: list[Image] = []
    notes: list[str] = []
    for image in message.images:
        checked, why = image_problem(image, rules)
        if checked is None:
            notes.append(f"[a picture was left out: {why}]")
        else:
            images.append(checked)
    if replaced:
        notes.insert(0, REPLACED_ARGUMENTS)
    if message.is_error and not content.strip():
        content = result_text("empty_error", kind="not recorded")
    if notes:
        content = "\n".join([content, *notes]) if content else "\n".join(notes)
    return replace(
        message, text=content, tool_call_id=call.id, name=_clean_name(call.name), images=tuple(images),
        is_error=bool(message.is_error),
    )


def checked_reply(reply: Any) -> Reply:
    """``reply`` made safe to record and run: a :class:`Reply` with its tool calls as a
    tuple (a generator is read once), each call's id and name as ``str`` (a missing or
    non-text id becomes ``""``, for which the wire rules make one; a missing name
    becomes ``""``, an unknown tool) and its arguments as JSON text or a plain dict;
    arguments of any other type become their text (``5`` -> ``"5"``), which the loop's
    strict decoding then refuses as ``invalid_json`` for that call only. Lone
    surrogates in the text are replaced. Raises ``TypeError`` for a reply that is not a
    :class:`Reply`, text that is not a ``str``, or a call that is not a
    :class:`ToolCall`."""
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
        calls.append(ToolCall(call_id, name, plain_arguments(call.arguments)))
    return Reply(scrub_text(reply.text), tuple(calls), reply.raw, reply.stop_reason, reply.usage,
                 thinking_blocks(getattr(reply, "thinking", ())))


def plain_arguments(arguments: Any) -> str | dict[str, Any]:
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
