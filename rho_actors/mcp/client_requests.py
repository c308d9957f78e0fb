"""What a served tool asks of the MCP client that called it: log messages, sampling,
elicitation, and closing its SSE stream for the client to poll.

A tool served by :func:`rho_actors.mcp.serve` gets, while its ``tools/call`` runs,
``rho_actors.mcp.client_of(ctx)``: an :class:`MCPClient` bound to the request that
started the call. Its methods are synchronous (called from the tool's thread; they run
on the server's asyncio loop) and each waits at most until the call's deadline::

    from rho_actors.mcp import client_of

    def run(args, ctx):
        client = client_of(ctx)
        if client is not None:
            client.log("info", "starting")
            answer = client.sample(args["prompt"], max_tokens=100)

``client_of`` returns None for a call that is not an MCP request (a model's call, a
test's), so the same tool runs anywhere. It works for tools whose ``run`` executes in
the server's process (trusted tools, ``thread`` isolation): ``ctx`` holds no handle a
worker process could use, and none is given to untrusted code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.shared.message import ServerMessageMetadata

from rho_actors.errors import RhoError

__all__ = ["LOG_LEVELS", "ClientRequestError", "MCPClient", "client_of"]

LOG_LEVELS: tuple[str, ...] = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP's log levels (RFC 5424's severities), least severe first."""


class ClientRequestError(RhoError, RuntimeError):
    """A request to the client failed: it lacks the capability, answered an error, or
    did not answer before the call's deadline (the message says which)."""


@dataclass(slots=True)
class Bound:
    """What :mod:`rho_actors.mcp.serve` binds to a running call."""

    aloop: asyncio.AbstractEventLoop
    session: Any  # the SDK's ServerSession of the request
    request_id: Any
    level: Mapping[str, str]  # the connection's state: "rho_actors.log_level" as logging/setLevel set it
    close_stream: Any = None  # the SDK's close_sse_stream callback (streamable HTTP with an event store)


_live: dict[tuple[str, str], Bound] = {}
_lock = threading.Lock()
LEVEL_KEY = "rho_actors.log_level"


def bind(session_id: str, call_id: str, bound: Bound) -> None:
    """Make ``client_of`` find ``bound`` for the call (by :mod:`rho_actors.mcp.serve`)."""
    with _lock:
        _live[(session_id, call_id)] = bound


def unbind(session_id: str, call_id: str) -> None:
    """Forget the call (its request has ended)."""
    with _lock:
        _live.pop((session_id, call_id), None)


def client_of(ctx: Mapping[str, Any]) -> MCPClient | None:
    """The MCP client of the running call whose context is ``ctx``, or None when the
    call is not an MCP ``tools/call`` being served in this process (or has ended)."""
    key = (str(ctx.get("session_id", "")), str(ctx.get("call_id", "")))
    with _lock:
        bound = _live.get(key)
    if bound is None:
        return None
    deadline = ctx.get("deadline")
    return MCPClient(bound, float(deadline) if isinstance(deadline, (int, float)) else time.monotonic() + 30.0)


class MCPClient:
    """The client of one served call (from :func:`client_of`); see the module doc."""

    def __init__(self, bound: Bound, deadline: float) -> None:
        self._bound = bound
        self._deadline = deadline  # time.monotonic() seconds: the call's

    def _run(self, coroutine: Any) -> Any:
        bound = self._bound
        left = self._deadline - time.monotonic()
        if left <= 0:
            coroutine.close()
            raise ClientRequestError("the call's deadline has passed")
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, bound.aloop)
        except RuntimeError:  # the server's loop has closed
            coroutine.close()
            raise ClientRequestError("the MCP connection has closed") from None
        try:
            return future.result(timeout=left)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClientRequestError("the client did not answer before the call's deadline") from None
        except ClientRequestError:
            raise
        except Exception as exc:  # MCPError (the client answered an error), a closed stream...
            raise ClientRequestError(f"the client's answer: {exc}") from None

    def _metadata(self) -> ServerMessageMetadata:
        return ServerMessageMetadata(related_request_id=self._bound.request_id)

    def _has(self, capability: types.ClientCapabilities, what: str) -> None:
        if not self._bound.session.check_client_capability(capability):
            raise ClientRequestError(f"the client did not declare the {what} capability")

    def log(self, level: str, data: Any, logger: str | None = None) -> bool:
        """Send ``notifications/message`` (``level`` one of :data:`LOG_LEVELS`; ``data``
        any JSON value) on the call's stream, unless the client's ``logging/setLevel``
        asked for a more severe level. Returns whether it was sent. Raises
        ``ValueError`` for an unknown level, :class:`ClientRequestError` when the
        connection has closed."""
        if level not in LOG_LEVELS:
            raise ValueError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
        wanted = self._bound.level.get(LEVEL_KEY, "debug")
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(wanted):
            return False
        note = types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level=level, data=data, logger=logger))  # type: ignore[arg-type]
        self._run(self._bound.session.send_notification(note, related_request_id=self._bound.request_id))
        return True

    def sample(self, prompt: str, *, max_tokens: int, system_prompt: str | None = None) -> str:
        """Ask the client's model (``sampling/createMessage``) to answer ``prompt`` (one
        user message) in at most ``max_tokens`` tokens; returns the text of its answer
        ("" for an answer without text). Raises :class:`ClientRequestError`."""
        self._has(types.ClientCapabilities(sampling=types.SamplingCapability()), "sampling")
        request = types.CreateMessageRequest(params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
            max_tokens=max_tokens, system_prompt=system_prompt))
        result = self._run(self._bound.session.send_request(request, types.CreateMessageResult,
                                                            metadata=self._metadata()))
        content = result.content
        return content.text if isinstance(content, types.TextContent) else ""

    def elicit(self, message: str, schema: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """Ask the client's user (``elicitation/create``, form mode) for the fields of
        ``schema`` (an object schema of primitive properties), showing ``message``.
        Returns ``(action, content)``: ``action`` is ``"accept"``, ``"decline"`` or
        ``"cancel"``, ``content`` the fields given (``{}`` unless accepted). Raises
        :class:`ClientRequestError`."""
        self._has(types.ClientCapabilities(elicitation=types.ElicitationCapability()), "elicitation")
        request = types.ElicitRequest(params=types.ElicitRequestFormParams(message=message,
                                                                          requested_schema=dict(schema)))
        result = self._run(self._bound.session.send_request(request, types.ElicitResult, metadata=self._metadata()))
        return str(result.action), dict(result.content or {})

    def close_stream(self) -> bool:
        """Close the SSE stream of the call's HTTP request, so the client reconnects
        and polls for the result (SEP-1699; the result is replayed from the server's
        event store). Returns False where there is no such stream (stdio, JSON
        responses, no event store)."""
        close = self._bound.close_stream
        if close is None:
            return False
        self._run(_awaited(close))
        return True


async def _awaited(close: Any) -> None:
    outcome = close()
    if asyncio.iscoroutine(outcome):
        await outcome
