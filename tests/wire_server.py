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
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "ANTHROPIC_PATH",
    "OPENAI_PATH",
    "Recorded",
    "Response",
    "WireServer",
    "anthropic_error",
    "anthropic_message",
    "openai_completion",
    "openai_error",
    "picture",
    "text_block",
    "tool_use_block",
]

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
SOCKET_TIMEOUT_S = 5.0
JOIN_TIMEOUT_S = 5.0
MAX_DELAY_S = 10.0


@dataclass(frozen=True)
class Response:
    """One scripted answer: HTTP ``status``, a JSON ``body`` (a dict, or ``str`` sent as
    it is), extra ``headers``, and ``delay_s`` seconds to wait before answering (capped
    at ``MAX_DELAY_S``; to provoke a client timeout)."""

    status: int
    body: dict[str, Any] | str
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

    def __init__(self) -> None:
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
        with self._lock:
            self._requests.append(Recorded(handler.command, path, headers, body, raw, time.monotonic()))
            queue = self._scripts.get(path)
            if handler.command != "POST" or queue is None:
                response = Response(404, {"error": {"message": f"no route {handler.command} {path}"}})
            elif not queue:
                response = Response(400, _exhausted(path))
            else:
                response = queue.popleft()
        if response.delay_s > 0 and self._stopping.wait(min(response.delay_s, MAX_DELAY_S)):
            return  # stopping: drop the connection unanswered
        payload = response.body if isinstance(response.body, str) else json.dumps(response.body)
        data = payload.encode()
        try:
            handler.send_response(response.status)
            handler.send_header("content-type", "application/json")
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
