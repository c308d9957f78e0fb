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

The same tool code serves both protocol eras. On a handshake-era connection each
question is a server-initiated request, answered while the tool waits. Protocol
2026-07-28 has no server-initiated requests: a question the client has not answered
yet ends the run (the method raises :class:`InputRequired`, a
:class:`ClientRequestError`) and the client gets an ``input_required`` result asking
every question the run asked (SEP-2322); the client answers them and sends the call
again, which runs the tool again from its start, each question now answered from the
client's ``inputResponses`` or from the answers the earlier rounds carried in the
sealed ``requestState``. A question is known by its ``key`` (default: its kind and
its place among the run's questions, ``elicitation-1``, ``sampling-2``...), so a tool
asks its questions in the same order each run, and does its side effects after them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import mcp_types as types
from mcp.server.connection import allowed_log_levels
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from rho_actors.encoding import scrub_strings, scrub_text
from rho_actors.errors import RhoError

__all__ = ["LOG_LEVELS", "ClientRequestError", "InputRequired", "MCPClient", "client_of"]

LOG_LEVELS: tuple[str, ...] = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP's log levels (RFC 5424's severities), least severe first."""


class ClientRequestError(RhoError, RuntimeError):
    """A request to the client failed: it lacks the capability, answered an error, or
    did not answer before the call's deadline (the message says which)."""


class InputRequired(ClientRequestError):
    """Protocol 2026-07-28: the client has not answered the run's question(s) yet; the
    call is answered with an ``input_required`` result and run again with the answers
    (see the module doc). A tool that catches it is answered the same way."""


@dataclass(slots=True)
class Bound:
    """What :mod:`rho_actors.mcp.serve` binds to a running call."""

    aloop: asyncio.AbstractEventLoop
    session: Any  # the SDK's ServerSession of the request
    request_id: Any
    level: Mapping[str, str]  # the connection's state: "rho_actors.log_level" as logging/setLevel set it
    close_stream: Any = None  # the SDK's close_sse_stream callback (streamable HTTP with an event store)
    modern: bool = False  # protocol 2026-07-28: questions become an input_required result
    answers: Mapping[str, Any] = field(default_factory=dict)  # key -> the client's answer (wire JSON), known now
    asked: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> an unanswered question (wire JSON)
    used: dict[str, Any] = field(default_factory=dict)  # key -> an answer the run read (kept in requestState)
    missing: set[str] = field(default_factory=set)  # capabilities asked for that the client did not declare
    questions: Iterator[int] = field(default_factory=lambda: itertools.count(1))  # the default keys' numbers
    # a call served as an MCP task: asks its unanswered questions (key -> wire JSON) and waits for the answers
    # until a deadline (time.monotonic() s), the task input_required meanwhile (rho_actors.mcp.tasks)
    task_input: Any = None


_R = TypeVar("_R", bound=BaseModel)
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


def _sendable(requests: Mapping[str, Any]) -> Mapping[str, Any]:
    """``requests`` (key -> an SDK request) as valid JSON text: as they are unless a key or
    a request holds a lone surrogate, else a copy with each replaced (U+FFFD; the request
    made again from its scrubbed wire form). Raises ``ValueError`` when two keys become one."""
    clean: dict[str, Any] = {}
    for key, asked in requests.items():
        name = scrub_text(key) if isinstance(key, str) else key
        if name in clean:
            raise ValueError(f"the question keys {key!r} and another both become {name!r} once scrubbed")
        request = asked
        if isinstance(asked, BaseModel):
            try:
                asked.model_dump_json(by_alias=True, exclude_none=True)
            except PydanticSerializationError:  # a lone surrogate (or another value JSON cannot hold)
                wire = scrub_strings(asked.model_dump(mode="python", by_alias=True, exclude_none=True))
                request = type(asked).model_validate(wire)
        clean[name] = request
    return clean


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

    def _has(self, capability: str) -> None:
        if not self.supports(capability):
            if self._bound.modern:  # 2026-07-28: the request is answered MissingRequiredClientCapabilityError
                self._bound.missing.add(capability)
            raise ClientRequestError(f"the client did not declare the {capability} capability")

    def log(self, level: str, data: Any, logger: str | None = None, *, wait: bool = True) -> bool:
        """Send ``notifications/message`` (``level`` one of :data:`LOG_LEVELS`; ``data``
        any JSON value, its strings' lone surrogates replaced, as ``logger``'s: one
        reaching the SDK's JSON writer ended the served stream, the call's result with it)
        on the call's stream, unless the client's ``logging/setLevel`` asked for a more
        severe level. Returns whether it was sent (``wait=False``: handed to the server's
        loop, not waited for: from an asyncio loop's thread). Raises ``ValueError`` for an
        unknown level or two keys of a dict that become one once scrubbed,
        :class:`ClientRequestError` when the connection has closed."""
        if level not in LOG_LEVELS:
            raise ValueError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
        bound = self._bound
        wanted = bound.level.get(LEVEL_KEY, "debug")
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(wanted):
            return False
        if bound.modern and level not in allowed_log_levels(bound.session.protocol_version, bound.level):
            return False  # 2026-07-28: only what the request's _meta logLevel opted in to
        data = scrub_strings(data)
        logger = None if logger is None else scrub_text(logger)
        with warnings.catch_warnings():  # logging is deprecated from 2026-07-28 on; clients of today use it
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            sending = bound.session.send_log_message(level, data, logger, related_request_id=bound.request_id)
        if not wait:
            try:
                asyncio.run_coroutine_threadsafe(sending, bound.aloop)
            except RuntimeError:  # the server's loop has closed
                sending.close()
                raise ClientRequestError("the MCP connection has closed") from None
            return True
        self._run(sending)
        return True

    def supports(self, capability: str) -> bool:
        """Whether the client declared ``capability`` (``"sampling"``, ``"elicitation"``
        or ``"roots"``), so a tool asks only what it can be answered. Raises
        ``ValueError`` for another name."""
        kinds = {"sampling": types.ClientCapabilities(sampling=types.SamplingCapability()),
                 "elicitation": types.ClientCapabilities(elicitation=types.ElicitationCapability()),
                 "roots": types.ClientCapabilities(roots=types.RootsCapability())}
        if capability not in kinds:
            raise ValueError(f"capability {capability!r} is not one of {', '.join(kinds)}")
        return bool(self._bound.session.check_client_capability(kinds[capability]))

    def sample(self, prompt: str, *, max_tokens: int, system_prompt: str | None = None,
               key: str | None = None) -> str:
        """Ask the client's model (``sampling/createMessage``) to answer ``prompt`` (one
        user message) in at most ``max_tokens`` tokens; returns the text of its answer
        ("" for an answer without text). ``key`` names the question (2026-07-28; see the
        module doc). Raises :class:`ClientRequestError` (:class:`InputRequired` too)."""
        self._has("sampling")
        request = types.CreateMessageRequest(params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
            max_tokens=max_tokens, system_prompt=system_prompt))
        result = self.ask({self._key(key, "sampling"): request}, types.CreateMessageResult)
        content = next(iter(result.values())).content
        return content.text if isinstance(content, types.TextContent) else ""

    def elicit(self, message: str, schema: Mapping[str, Any], *, key: str | None = None) -> tuple[str, dict[str, Any]]:
        """Ask the client's user (``elicitation/create``, form mode) for the fields of
        ``schema`` (an object schema of primitive properties), showing ``message``.
        Returns ``(action, content)``: ``action`` is ``"accept"``, ``"decline"`` or
        ``"cancel"``, ``content`` the fields given (``{}`` unless accepted). ``key``
        names the question (2026-07-28; see the module doc). Raises
        :class:`ClientRequestError` (:class:`InputRequired` too)."""
        self._has("elicitation")
        request = types.ElicitRequest(params=types.ElicitRequestFormParams(message=message,
                                                                          requested_schema=dict(schema)))
        result = next(iter(self.ask({self._key(key, "elicitation"): request}, types.ElicitResult).values()))
        return str(result.action), dict(result.content or {})

    def list_roots(self, *, key: str | None = None) -> list[dict[str, Any]]:
        """The client's roots (``roots/list``): ``[{"uri": str, "name": str?}]``. ``key``
        names the question (2026-07-28). Raises :class:`ClientRequestError`."""
        self._has("roots")
        asked = self.ask({self._key(key, "roots"): types.ListRootsRequest()}, types.ListRootsResult)
        result = next(iter(asked.values()))
        return [root.model_dump(mode="json", by_alias=True, exclude_none=True) for root in result.roots]

    def ask(self, requests: Mapping[str, Any], result_type: type[_R] | None = None) -> dict[str, Any]:
        """Ask several questions at once: ``requests`` maps each key to an SDK request
        (``types.ElicitRequest``, ``CreateMessageRequest``, ``ListRootsRequest``); returns
        ``{key: its result}`` (of ``result_type`` when given, else the result type of its
        method). On 2026-07-28 the unanswered ones go to the client together, in one
        ``input_required`` result. A request or key with a lone surrogate is sent with it
        replaced (one reaching the SDK's JSON writer ended the served stream, the call's
        result with it). Raises :class:`ClientRequestError` (``InputRequired``), and
        ``ValueError`` when two keys become one so."""
        bound = self._bound
        answers: dict[str, Any] = {}
        requests = _sendable(requests)
        if bound.task_input is not None:  # a task: it waits (input_required) for the answers of tasks/update
            return self._task_answers(requests, result_type)
        for key, request in requests.items():
            wanted = result_type or _RESULT_TYPES[request.method]
            if not bound.modern:
                answers[key] = self._run(bound.session.send_request(request, wanted, metadata=self._metadata()))
            elif key in bound.answers:
                try:
                    answers[key] = wanted.model_validate(bound.answers[key])
                except ValidationError:
                    raise ClientRequestError(f"the client's answer to {key!r} is not a "
                                             f"{request.method} result") from None
                bound.used[key] = bound.answers[key]
            else:
                bound.asked[key] = request.model_dump(mode="json", by_alias=True, exclude_none=True)
        missing = [key for key in requests if key not in answers]
        if missing:
            raise InputRequired(f"the client's input is required ({', '.join(missing)}): the call is answered "
                                "input_required and runs again with the answers")
        return answers

    def _task_answers(self, requests: Mapping[str, Any], result_type: type[_R] | None) -> dict[str, Any]:
        known = self._bound.answers  # answered before the task started (its input_requests, SEP-2322)
        asked = {key: request.model_dump(mode="json", by_alias=True, exclude_none=True)
                 for key, request in requests.items() if key not in known}
        got = {**{key: known[key] for key in requests if key in known},
               **(self._bound.task_input(asked, self._deadline) if asked else {})}
        answers: dict[str, Any] = {}
        for key, request in requests.items():
            try:
                answers[key] = (result_type or _RESULT_TYPES[request.method]).model_validate(got[key])
            except (ValidationError, KeyError):
                raise ClientRequestError(f"the client's answer to {key!r} is not a {request.method} result") from None
        return answers

    def _key(self, key: str | None, kind: str) -> str:
        return key if key is not None else f"{kind}-{next(self._bound.questions)}"

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


_RESULT_TYPES: dict[str, type[BaseModel]] = {"sampling/createMessage": types.CreateMessageResult,
                                            "elicitation/create": types.ElicitResult,
                                            "roots/list": types.ListRootsResult}


async def _awaited(close: Any) -> None:
    outcome = close()
    if asyncio.iscoroutine(outcome):
        await outcome
