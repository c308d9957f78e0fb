"""Request lines of MCP's stdio transport that the SDK would leave unanswered, answered.

The SDK parses each stdin line as a JSON-RPC message. A line with a ``method`` and an
``id`` that MCP does not allow (``null``, ``true``, ``1.5``, ``{}``, ``[]``) parses as a
*notification* and gets no answer, so the client waits for its own timeout; a request
with a usable id but a bad shape (``params`` not an object, ``jsonrpc`` not ``"2.0"``...)
fails to parse and is answered with ``id: null``, so the client cannot tell which of its
requests failed. :func:`early_answer` gives the JSON-RPC error for such a line: with the
request's id when it is a string or an integer, with ``id: null`` (JSON-RPC 2.0's rule
when the id cannot be read) otherwise. :class:`CheckedLines` reads the lines, hands the
others on, and sends each early answer to a stream.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import sys
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import Any, TextIO

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from loguru import logger
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR

__all__ = ["CheckedLines", "answering_bad_lines", "claimed_stdin", "early_answer"]

_MAX_SHOWN = 200


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a fraction"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def early_answer(line: str | bytes) -> types.JSONRPCError | None:
    """The error for request ``line`` when the SDK would drop it or answer it with id
    null though it has a usable id; ``None`` for every other line (a valid message, a
    notification, a response, or what is not a JSON object: the SDK's own parse error
    with ``id: null`` is right for those). Never raises."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if type(message) is not dict or "method" not in message or "id" not in message:
        return None
    ident = message["id"]
    if type(ident) not in (str, int):
        return _error(None, f"Invalid Request: the id of a request must be a string or an integer, "
                            f"got {_kind(ident)}")
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:  # pydantic's ValidationError: which field is wrong
        problems = getattr(exc, "errors", None)
        detail = str(exc)
        if callable(problems):
            with contextlib.suppress(Exception):
                detail = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'][1:]) or '$'}: {e['msg']}" for e in problems()
                    if e.get("loc") and e["loc"][0] == "JSONRPCRequest"
                ) or detail
        return _error(ident, f"Invalid Request: {detail[:_MAX_SHOWN]}")
    return None


def _error(ident: str | int | None, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=ident, error=types.ErrorData(code=INVALID_REQUEST, message=message))


class CheckedLines:
    """The lines of ``lines`` (an async iterable of text lines, stdin's) but those
    :func:`early_answer` answers: each of those answers is sent to ``answers``."""

    def __init__(self, lines: AsyncIterable[str], answers: MemoryObjectSendStream[types.JSONRPCError]) -> None:
        self._lines = lines
        self._answers = answers

    def __aiter__(self) -> AsyncIterator[str]:
        return self._read()

    async def _read(self) -> AsyncIterator[str]:
        async for line in self._lines:
            answer = early_answer(line)
            if answer is None:
                yield line
            else:
                await self._answers.send(answer)


@contextlib.contextmanager
def claimed_stdin() -> Iterator[TextIO]:
    """Standard input as UTF-8 text lines read from a private copy of fd 0, fd 0 itself
    pointed at the null device meanwhile (as the SDK does when it reads stdin itself), so
    a tool or a child that reads its stdin reads nothing of the protocol; restored at
    the end. The private copy is never closed: a reading thread may still block on it.
    Where fd 0 cannot be copied, it is read in place (as the SDK does then)."""
    try:
        private = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        yield sys.stdin
        return
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    try:
        yield io.TextIOWrapper(os.fdopen(private, "rb", closefd=False), encoding="utf-8", errors="replace")
    finally:
        os.dup2(private, 0)


@contextlib.asynccontextmanager
async def answering_bad_lines(read: Any, write: Any, early: Any = None) -> AsyncIterator[Any]:
    """The stdio read stream without its bad lines: the SDK's transport hands a line that
    is not a JSON-RPC message (not JSON, not a message, nested past the parser's limit)
    to the server as an exception, which it drops unanswered, so a client waits for its
    own timeout. Here each gets JSON-RPC's answer at once: a ``-32700`` parse error (or
    ``-32600`` for JSON that is no message) with ``id: null``; the server goes on.
    ``early``: the answers :class:`~rho_actors.mcp.stdio_lines.CheckedLines` gave
    requests with a bad id or shape (the request's id where usable), sent as they come."""
    send, checked = anyio.create_memory_object_stream[Any](16)

    async def answer_early() -> None:
        async with early:
            async for error in early:
                logger.info("MCP stdio: a bad request from the client: {}", error.error.message[:200])
                await write.send(SessionMessage(error))

    async def relay() -> None:
        async with send:
            async for item in read:
                if not isinstance(item, Exception):
                    await send.send(item)
                    continue
                code, what = (PARSE_ERROR, "Parse error") if _not_json(item) else (INVALID_REQUEST, "Invalid Request")
                logger.info("MCP stdio: a bad line from the client: {}", str(item)[:200])
                error = types.JSONRPCError(jsonrpc="2.0", id=None,
                                           error=types.ErrorData(code=code, message=f"{what}: {str(item)[:200]}"))
                await write.send(SessionMessage(error))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(relay)
        if early is not None:
            tasks.start_soon(answer_early)
        try:
            yield checked
        finally:
            tasks.cancel_scope.cancel()


def _not_json(exc: Exception) -> bool:
    """Whether the SDK's parse of a line failed as JSON (else: JSON, but no message)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return True
    try:
        return any(e.get("type") == "json_invalid" for e in errors())
    except Exception:
        return True
