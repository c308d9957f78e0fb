"""A scripted HTTP server on 127.0.0.1 that speaks enough of the OpenAI Chat Completions
and Anthropic Messages wire formats for the real SDK clients to talk to it.

Routes (``POST`` only; anything else is a 404):

==========================  ===========================================================
``/v1/chat/completions``    OpenAI: the SDK's ``base_url`` is :attr:`WireServer.openai_url`
``/v1/messages``            Anthropic: the SDK's ``base_url`` is :attr:`WireServer.anthropic_url`
==========================  ===========================================================

Each route answers from its own queue of scripted :class:`Response` values, in order
(:meth:`WireServer.script`); a request past the end of the script gets a 400 naming the
route (a non-retryable error, so a test that under-scripts fails at once and clearly).
Every request is recorded (:attr:`WireServer.requests`: path, lowercased headers, the
parsed JSON body) before it is answered.

Each route ENFORCES the provider's documented request rules (:func:`openai_violation`,
:func:`anthropic_violation`): a request that breaks one gets the 400 the real API gives
(its script is not consumed), so a conversation that would poison a real session fails
here too. ``WireServer(enforce=False)`` turns that off.

Every wait is bounded: a scripted ``delay_s`` is cut short by :meth:`WireServer.stop`,
sockets time out after ``SOCKET_TIMEOUT_S``, and ``stop`` joins the serving thread for at
most ``JOIN_TIMEOUT_S``.

Example::

    with WireServer() as server:
        server.script("/v1/chat/completions", Response(429, openai_error(429, "slow down")),
                      Response(200, openai_completion(text="hi")))
        client = openai.OpenAI(base_url=server.openai_url, api_key="dummy", max_retries=0)
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.conftest import WAIT_S

__all__ = [
    "ANTHROPIC_PATH",
    "OPENAI_PATH",
    "Recorded",
    "Response",
    "WireServer",
    "anthropic_error",
    "anthropic_message",
    "anthropic_stream",
    "openai_completion",
    "openai_error",
    "openai_stream",
    "picture",
    "redacted_thinking_block",
    "signature",
    "text_block",
    "thinking_block",
    "tool_use_block",
]

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
SOCKET_TIMEOUT_S = WAIT_S
JOIN_TIMEOUT_S = WAIT_S
MAX_DELAY_S = WAIT_S
ANTHROPIC_MAX_REQUEST_BYTES = 32_000_000
"""The Messages API's request size limit (32 MB): a larger request is a 413."""
ANTHROPIC_MAX_IMAGES = 100
ANTHROPIC_MANY_IMAGES = 20
ANTHROPIC_MANY_IMAGES_SIDE = 2000


@dataclass(frozen=True)
class Response:
    """One scripted answer: HTTP ``status``, a JSON ``body`` (a dict, or ``str`` sent as
    it is, or a list of ``(event, data)`` server-sent events), extra ``headers``, and
    ``delay_s`` seconds to wait before answering (capped at ``MAX_DELAY_S``; to provoke
    a client timeout)."""

    status: int
    body: dict[str, Any] | str | list[tuple[str | None, Any]]
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Recorded:
    """One request the server received: its ``path``, headers (names lowercased),
    ``body`` (the parsed JSON, or ``None`` when it was not JSON), ``raw`` bytes and
    ``at`` (a ``time.monotonic()`` instant of its arrival)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes
    at: float


class WireServer:
    """A threaded stdlib HTTP server on ``127.0.0.1`` and a free port; see the module
    docstring. Use it as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(self, *, enforce: bool = True) -> None:
        self.enforce = enforce
        self._lock = threading.Lock()
        self._scripts: dict[str, deque[Response]] = {OPENAI_PATH: deque(), ANTHROPIC_PATH: deque()}
        self._requests: list[Recorded] = []
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle ------------------------------------------------------------------

    def start(self) -> WireServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = SOCKET_TIMEOUT_S  # seconds a socket read may block

            def do_POST(self) -> None:
                server._handle(self)

            def do_GET(self) -> None:
                server._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="wire-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)

    def __enter__(self) -> WireServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses -------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._httpd is not None, "the server has not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """The OpenAI SDK's ``base_url`` (it appends ``/chat/completions``)."""
        return f"{self.url}/v1"

    @property
    def anthropic_url(self) -> str:
        """The Anthropic SDK's ``base_url`` (it appends ``/v1/messages``)."""
        return self.url

    # -- script and record -----------------------------------------------------------

    def script(self, path: str, *responses: Response) -> None:
        """Queue ``responses`` for ``path`` (after any still queued)."""
        with self._lock:
            self._scripts[path].extend(responses)

    def pending(self, path: str) -> int:
        """How many scripted responses for ``path`` have not been sent."""
        with self._lock:
            return len(self._scripts[path])

    @property
    def requests(self) -> list[Recorded]:
        """A copy of the requests received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def bodies(self, path: str) -> list[Any]:
        """The parsed JSON bodies of the requests to ``path``, in arrival order."""
        return [r.body for r in self.requests if r.path == path]

    # -- serving ---------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = handler.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in handler.headers.items()}
        violation = _violation(path, body) if self.enforce and handler.command == "POST" else None
        too_large = self.enforce and path == ANTHROPIC_PATH and len(raw) > ANTHROPIC_MAX_REQUEST_BYTES
        with self._lock:
            self._requests.append(Recorded(handler.command, path, headers, body, raw, time.monotonic()))
            queue = self._scripts.get(path)
            if handler.command != "POST" or queue is None:
                response = Response(404, {"error": {"message": f"no route {handler.command} {path}"}})
            elif too_large:
                response = Response(413, {"type": "error", "error": {
                    "type": "request_too_large", "message": "Request exceeds the maximum allowed number of bytes."}})
            elif violation is not None:
                error = anthropic_error(400, violation) if path == ANTHROPIC_PATH else openai_error(400, violation)
                response = Response(400, error)
            elif not queue:
                response = Response(400, _exhausted(path))
            else:
                response = queue.popleft()
        if response.delay_s > 0 and self._stopping.wait(min(response.delay_s, MAX_DELAY_S)):
            return  # stopping: drop the connection unanswered
        if isinstance(response.body, list):  # server-sent events
            payload = "".join(
                (f"event: {name}\n" if name else "")
                + f"data: {item if isinstance(item, str) else json.dumps(item)}\n\n"
                for name, item in response.body
            )
            kind = "text/event-stream"
        else:
            payload = response.body if isinstance(response.body, str) else json.dumps(response.body)
            kind = "application/json"
        data = payload.encode()
        try:
            handler.send_response(response.status)
            handler.send_header("content-type", kind)
            handler.send_header("content-length", str(len(data)))
            for name, value in response.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:  # the client gave up (its timeout) before the answer
            pass


def _exhausted(path: str) -> dict[str, Any]:
    message = f"wire server: no scripted response left for POST {path}"
    if path == ANTHROPIC_PATH:
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}


def picture(fmt: str = "PNG", size: tuple[int, int] = (2, 2)) -> bytes:
    """A real picture of ``size`` pixels in Pillow format ``fmt`` (PNG, GIF, JPEG, WEBP)."""
    import io

    from PIL import Image as PILImage

    out = io.BytesIO()
    PILImage.new("RGB", size, (200, 30, 30)).save(out, format=fmt)
    return out.getvalue()


# -- OpenAI bodies ---------------------------------------------------------------------


def openai_completion(
    text: str | None = None,
    tool_calls: Sequence[tuple[str, str, str]] = (),
    *,
    finish_reason: str | None = None,
    model: str = "gpt-test",
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice: ``text`` as the message content
    and ``tool_calls`` as ``(id, name, arguments_text)`` function calls (the arguments
    text sent exactly as given)."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in tool_calls
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """An OpenAI error body."""
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}


# -- Anthropic bodies ------------------------------------------------------------------


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(block_id: str, name: str, tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": block_id, "name": name, "input": tool_input}


def signature(thinking: str) -> str:
    """The signature this server gives a ``thinking`` block of ``thinking`` text (a
    digest, so a block changed on its way back fails the check, as the real API's does)."""
    import hashlib

    return "sig-" + hashlib.sha256(thinking.encode()).hexdigest()[:24]


def thinking_block(thinking: str) -> dict[str, Any]:
    """A ``thinking`` block with this server's signature for it."""
    return {"type": "thinking", "thinking": thinking, "signature": signature(thinking)}


def redacted_thinking_block(seed: str) -> dict[str, Any]:
    """A ``redacted_thinking`` block whose ``data`` this server can check."""
    return {"type": "redacted_thinking", "data": "redacted-" + signature(seed)}


def _thinking_violation(i: int, block: dict[str, Any]) -> str | None:
    if block.get("type") == "thinking":
        if block.get("signature") != signature(str(block.get("thinking"))):
            return f"messages.{i}.content: Invalid `signature` in `thinking` block"
    elif block.get("type") == "redacted_thinking":
        data = block.get("data")
        if not isinstance(data, str) or not data.startswith("redacted-sig-"):
            return f"messages.{i}.content: Invalid `data` in `redacted_thinking` block"
    return None


def anthropic_message(
    content: list[dict[str, Any]], *, stop_reason: str | None = None, model: str = "claude-test"
) -> dict[str, Any]:
    """A Messages API ``message`` object with ``content`` blocks; ``stop_reason``
    defaults to ``tool_use`` when a block is one, else ``end_turn``."""
    has_tool_use = any(b.get("type") == "tool_use" for b in content)
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason or ("tool_use" if has_tool_use else "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """An Anthropic error body, its ``error.type`` chosen by ``status``."""
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }
    return {"type": "error", "error": {"type": kinds.get(status, "api_error"), "message": message}}


# -- the providers' request rules -------------------------------------------------------

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")
_IMAGE_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp"}
_PIL_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}


def _violation(path: str, body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the request body is not a JSON object"
    check = openai_violation if path == OPENAI_PATH else anthropic_violation if path == ANTHROPIC_PATH else None
    return None if check is None else check(body)


def _strict_object(text: Any) -> bool:
    def no_constant(name: str) -> Any:
        raise ValueError(name)

    try:
        return isinstance(json.loads(text, parse_constant=no_constant), dict)
    except (TypeError, ValueError, RecursionError):
        return False


def _image_problem(media_type: Any, data_b64: Any, max_bytes: int, max_side: int | None) -> str | None:
    import base64
    import io

    from PIL import Image as PILImage

    if media_type not in _IMAGE_TYPES:
        return f"Image media type {media_type!r} is not supported"
    try:
        data = base64.b64decode(data_b64, validate=True)
    except Exception:
        return "Image data is not valid base64"
    if len(data) > max_bytes:
        return f"image exceeds {max_bytes} bytes maximum"
    try:
        with PILImage.open(io.BytesIO(data)) as img:
            fmt, (width, height) = _PIL_TYPES.get(str(img.format)), img.size
    except Exception:
        return "Could not process image"
    if fmt != media_type:
        return f"Image does not match the provided media type {media_type}"
    if max_side is not None and max(width, height) > max_side:
        return f"image dimensions exceed max allowed size: {max_side} pixels"
    return None


def _schema_violation(schema: Any, where: str, refused_top: Sequence[str], property_names: re.Pattern[str] | None,
                      *, needs_properties: bool) -> str | None:
    """The 400 a provider gives a tool's parameter schema: its top level an object schema
    (with ``properties`` when ``needs_properties``), none of ``refused_top`` there,
    property names of the pattern."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return f"Invalid schema for {where}: schema must be a JSON Schema of 'type: \"object\"'"
    if needs_properties and not isinstance(schema.get("properties"), dict):
        return f"Invalid schema for {where}: In context=(), object schema missing properties"
    for keyword in refused_top:
        if keyword in schema:
            return f"Invalid schema for {where}: {keyword!r} is not permitted at the top level"
    if property_names is not None:
        for name in schema.get("properties") or {}:
            if not property_names.fullmatch(name):
                return f"{where}.properties: Property keys should match pattern '^[a-zA-Z0-9_.-]{{1,64}}$'"
    return None


_ANTHROPIC_PROPERTY = re.compile(r"[a-zA-Z0-9_.-]{1,64}")


def openai_violation(body: dict[str, Any]) -> str | None:
    """The 400 message Chat Completions gives ``body``, or None when it is accepted."""
    for entry in body.get("tools") or []:
        fn = entry.get("function", {}) if isinstance(entry, dict) else {}
        problem = _schema_violation(fn.get("parameters"), f"function '{fn.get('name')}'",
                                    ("anyOf", "oneOf", "allOf", "enum", "not"), None,
                                    needs_properties=True)
        if problem:
            return problem
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    seen: set[str] = set()
    pending: list[str] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role != "tool" and pending:
            return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                    f"'tool_call_id'. The following tool_call_ids did not have response messages: {pending[0]}")
        content = m.get("content")
        if role in ("user", "system", "developer"):
            if isinstance(content, str):
                if not content.strip():
                    return f"Invalid 'messages[{i}].content': string too short (blank)"
            elif isinstance(content, list) and content:
                for part in content:
                    if part.get("type") == "text" and not str(part.get("text", "")).strip():
                        return f"Invalid 'messages[{i}].content': a text part is blank"
                    if part.get("type") == "image_url":
                        url = str(part.get("image_url", {}).get("url", ""))
                        head, _, data = url.partition(",")
                        media = head.removeprefix("data:").removesuffix(";base64")
                        problem = _image_problem(media, data, 20 * 2**20, None)
                        if problem:
                            return f"Invalid 'messages[{i}]': {problem}"
            else:
                return f"Invalid 'messages[{i}].content': expected a string or a non-empty array"
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if not calls and not (isinstance(content, str) and content.strip()):
                return f"Invalid 'messages[{i}].content': an assistant message needs content or tool_calls"
            if isinstance(content, str) and not content.strip() and content != "":
                return f"Invalid 'messages[{i}].content': blank"
            for k, call in enumerate(calls):
                cid = call.get("id")
                if not isinstance(cid, str) or not cid:
                    return f"Invalid 'messages[{i}].tool_calls[{k}].id': empty string"
                if len(cid) > 40:
                    return f"Invalid 'messages[{i}].tool_calls[{k}].id': string too long. Expected a string with " \
                        "maximum length 40"
                if cid in seen:
                    return f"Duplicate value for 'tool_call_id' of {cid} in message[{i}]"
                seen.add(cid)
                fn = call.get("function", {})
                if not isinstance(fn.get("name"), str) or not _NAME.fullmatch(fn["name"]):
                    return f"Invalid 'messages[{i}].tool_calls[{k}].function.name': string does not match pattern"
                if not _strict_object(fn.get("arguments")):
                    return f"Invalid 'messages[{i}].tool_calls[{k}].function.arguments': not a JSON object"
            pending = [c.get("id") for c in calls]
        elif role == "tool":
            tid = m.get("tool_call_id")
            if tid not in pending:
                return ("Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                        "with 'tool_calls'.")
            pending.remove(tid)
            if not isinstance(content, str):
                return f"Invalid 'messages[{i}].content': expected a string"
        else:
            return f"Invalid 'messages[{i}].role': {role!r}"
    return None


def anthropic_violation(body: dict[str, Any]) -> str | None:
    """The 400 message the Messages API gives ``body``, or None when it is accepted."""
    for k, entry in enumerate(body.get("tools") or []):
        schema = entry.get("input_schema") if isinstance(entry, dict) else None
        problem = _schema_violation(schema, f"tools.{k}.custom.input_schema", ("anyOf", "oneOf", "allOf"),
                                    _ANTHROPIC_PROPERTY, needs_properties=False)
        if problem:
            return f"tools.{k}.custom.input_schema: {problem}" if not problem.startswith("tools.") else problem
    system = body.get("system")
    if system is not None and (not isinstance(system, str) or not system.strip()):
        return "system: text content blocks must contain non-whitespace text"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    thinking = body.get("thinking")
    thinking_on = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    seen: set[str] = set()
    pending: list[str] = []
    for i, m in enumerate(messages):
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{i}: all messages must have non-empty content"
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if pending and (m.get("role") != "user" or sorted(results) != sorted(pending)):
            return (f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{pending[0]}. Each `tool_use` block must have a corresponding `tool_result` block in the "
                    "next message.")
        continues = i == len(messages) - 1 and bool(results)
        if thinking_on and continues and messages[i - 1].get("role") == "assistant":
            first = (messages[i - 1].get("content") or [{}])[0]
            if not isinstance(first, dict) or first.get("type") not in ("thinking", "redacted_thinking"):
                return (f"messages.{i - 1}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                        f"`{first.get('type') if isinstance(first, dict) else 'text'}`. When `thinking` is enabled, "
                        "a final `assistant` message must start with a thinking block (preceeding the lastmost set "
                        "of `tool_use` and `tool_result` blocks).")
        for b in blocks:
            kind = b.get("type")
            if kind in ("thinking", "redacted_thinking"):
                if m.get("role") != "assistant":
                    return f"messages.{i}: thinking blocks belong to assistant messages"
                problem = _thinking_violation(i, b)
                if problem:
                    return problem
            if kind == "text" and not str(b.get("text", "")).strip():
                return f"messages.{i}: text content blocks must contain non-whitespace text"
            if kind == "tool_use":
                if m.get("role") != "assistant":
                    return f"messages.{i}: tool_use blocks belong to assistant messages"
                tid = b.get("id")
                if not isinstance(tid, str) or not _ANTHROPIC_ID.fullmatch(tid):
                    return f"messages.{i}.content.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
                if tid in seen:
                    return f"messages.{i}: `tool_use` ids must be unique"
                seen.add(tid)
                if not isinstance(b.get("name"), str) or not _NAME.fullmatch(b["name"]):
                    return f"messages.{i}.content.tool_use.name: String should match pattern"
                if not isinstance(b.get("input"), dict):
                    return f"messages.{i}.content.tool_use.input: Input should be a valid dictionary"
            if kind == "tool_result":
                if b.get("tool_use_id") not in pending:
                    return (f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: "
                            f"{b.get('tool_use_id')}. Each `tool_result` block must have a corresponding `tool_use` "
                            "block in the previous message.")
                inner = b.get("content")
                if b.get("is_error") and not inner:
                    return f"messages.{i}: content cannot be empty if `is_error` is true"
                for part in inner if isinstance(inner, list) else []:
                    if part.get("type") == "text" and not str(part.get("text", "")).strip():
                        return f"messages.{i}: text content blocks must contain non-whitespace text"
                    if part.get("type") == "image":
                        src = part.get("source", {})
                        problem = _image_problem(src.get("media_type"), src.get("data"), 5 * 2**20, 8000)
                        if problem:
                            return f"messages.{i}: {problem}"
        pending = [b.get("id") for b in blocks if b.get("type") == "tool_use"] if m.get("role") == "assistant" else []
    if pending:
        return "the last assistant message's `tool_use` blocks have no `tool_result` blocks"
    return _anthropic_pictures_violation(messages)


def _anthropic_pictures_violation(messages: list[Any]) -> str | None:
    """The Messages API's per-request picture limits: at most 100, and none over 2000 px
    a side when a request holds more than 20."""
    import base64
    import io

    from PIL import Image as PILImage

    sides: list[int] = []
    for m in messages:
        content = m.get("content")
        for block in content if isinstance(content, list) else []:
            inner = block.get("content") if block.get("type") == "tool_result" else [block]
            for part in inner if isinstance(inner, list) else []:
                if part.get("type") == "image":
                    with PILImage.open(io.BytesIO(base64.b64decode(part["source"]["data"]))) as img:
                        sides.append(max(img.size))
    if len(sides) > ANTHROPIC_MAX_IMAGES:
        return f"messages: Too many images and documents: {len(sides)} > {ANTHROPIC_MAX_IMAGES}"
    if len(sides) > ANTHROPIC_MANY_IMAGES and max(sides) > ANTHROPIC_MANY_IMAGES_SIDE:
        return ("messages: At least one of the image dimensions exceed max allowed size for many-image requests: "
                f"{ANTHROPIC_MANY_IMAGES_SIDE} pixels")
    return None


# -- streams (server-sent events) -------------------------------------------------------


def openai_stream(
    texts: Sequence[str] = (), tool_calls: Sequence[tuple[str, str, str]] = (), *, model: str = "gpt-test"
) -> list[tuple[str | None, Any]]:
    """A streamed ``chat.completion.chunk`` sequence: one chunk per text piece, one per
    ``(id, name, arguments)`` call (arguments in two pieces), the finish, the usage, and
    ``[DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
        return None, {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": model,
                      "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events: list[tuple[str | None, Any]] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in texts]
    for index, (cid, name, args) in enumerate(tool_calls):
        half = len(args) // 2
        events.append(chunk({"tool_calls": [{"index": index, "id": cid, "type": "function",
                                             "function": {"name": name, "arguments": args[:half]}}]}))
        events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": args[half:]}}]}))
    events.append(chunk({}, "tool_calls" if tool_calls else "stop"))
    events.append((None, {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": model,
                          "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}))
    events.append((None, "[DONE]"))
    return events


def anthropic_stream(
    texts: Sequence[str] = (), tool_uses: Sequence[tuple[str, str, dict[str, Any]]] = (), *, model: str = "claude-test"
) -> list[tuple[str | None, Any]]:
    """A streamed Messages API reply: a text block of ``texts`` pieces, then a
    ``tool_use`` block per ``(id, name, input)`` (its JSON in two pieces)."""
    events: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_s", "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 7, "output_tokens": 1}}})]
    index = 0
    if texts:
        events.append(("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": piece}}) for piece in texts]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    for tid, name, tool_input in tool_uses:
        text = json.dumps(tool_input)
        half = len(text) // 2
        events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": {"type": "tool_use", "id": tid, "name": name,
                                                                 "input": {}}}))
        for piece in (text[:half], text[half:]):
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "input_json_delta", "partial_json": piece}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": "tool_use" if tool_uses else "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 3}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events
