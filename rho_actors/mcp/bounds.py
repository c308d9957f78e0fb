"""An upstream MCP server's messages, bounded before any parser (DESIGN §6b "What an
upstream can cost the host").

Every message an MCP server sends rho's client (a source or a gateway's upstream,
trusted or not, stdio or confined) passes :class:`MessageBounds` before the SDK's
pydantic models see it:

- a line (one JSON-RPC message) is at most :data:`MAX_MESSAGE_BYTES`, read as bytes by a
  reader that never buffers more (:func:`stdio_transport`, and the confined transport of
  :mod:`rho_actors.mcp.confined`); its arrays and objects are counted, and their depth
  measured, on the text before anything is decoded (:func:`rho_actors.bounded_json.loads_bounded`:
  at most :data:`MAX_CONTAINERS`, :data:`MAX_DEPTH` deep). A message over these bounds is
  a protocol violation: the connection ends (logged, naming the bound) and is restarted
  within its intensity; calls in flight get ``crashed`` results;
- notifications (and the server's own requests: pings, elicitations) are admitted at
  :data:`NOTIFICATIONS_PER_S` a second, after a burst of :data:`NOTIFICATION_BURST` (a
  token bucket per connection): the rest are dropped before the SDK's models see them,
  counted and logged once a window (a progress flood cannot slow a call or grow the
  host's memory; a dropped request is never answered);
- a ``tools/call`` result's ``structuredContent`` is at most :data:`MAX_STRUCTURED_BYTES`
  as JSON (the bound of a worker's result details): a larger one is answered, for that
  call, as the server's error naming the bound (the call gets ``mcp_refused``), and
  nothing of it is kept;
- a ``list_changed`` flood relists ever more rarely (:func:`relisting_wait`: a wait of
  20 times the last listing's cost, doubled while each listing is answered by another
  ``list_changed``, up to a minute).

:func:`~rho_actors.encoding.shown_text` is how an upstream's own words (its ``serverInfo``, its error
messages) are shown: control, bidi and line-breaking characters escaped, cut to a
length, so they can neither move a terminal's cursor nor forge a line of the log.
:func:`route_sdk_logging` sends the MCP SDK's own ``logging`` records to loguru (escaped,
cut, rate-bounded), never to the host's raw stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import anyio
import httpx2
import mcp
import mcp_types as types
from loguru import logger
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.message import SessionMessage

from rho_actors.bounded_json import JSONBoundError, loads_bounded
from rho_actors.encoding import describe_exception, shown_text
from rho_actors.otp.owned import owner_now
from rho_actors.otp.pidfds import PidFd

__all__ = [
    "MAX_CONTAINERS", "MAX_DEPTH", "MAX_MESSAGE_BYTES", "MAX_STRUCTURED_BYTES", "NOTIFICATIONS_PER_S",
    "NOTIFICATION_BURST", "RELIST_COST_FACTOR", "RELIST_MAX_S", "RELIST_MIN_S", "MessageBounds", "UpstreamViolation",
    "bounded_http_client", "message_streams", "relisting_wait", "route_sdk_logging", "shown_info", "shown_text",
    "stdio_transport",
]

MAX_MESSAGE_BYTES: Final = 16 * 2**20
"""The longest JSON-RPC message (one line) read from an MCP server, in bytes."""
MAX_CONTAINERS: Final = 2**17
"""The most arrays and objects of one message from an MCP server."""
MAX_DEPTH: Final = 64
"""The deepest nesting of one message from an MCP server (a declaration's schema may be
32 deep: :data:`rho_actors.declarations.checks.DEFAULT_MAX_SCHEMA_DEPTH`)."""
MAX_STRUCTURED_BYTES: Final = 2**20
"""The largest ``structuredContent`` of a result kept, as JSON bytes (a worker's result
details have the same bound)."""
NOTIFICATIONS_PER_S: Final = 20.0
"""Notifications admitted from one connection per second, past the burst."""
NOTIFICATION_BURST: Final = 100
"""Notifications one connection may send at once before the rate applies."""
_LOG_WINDOW_S: Final = 10.0
_MAX_SHOWN: Final = 2000
_SDK_LINES_PER_WINDOW: Final = 50
_TERMINATE_S: Final = 2.0  # what a stdio server gets to exit once its stdin is closed, then after SIGTERM

RELIST_MIN_S = 1.0
"""The least time between two listings of one connection (seconds): ``list_changed``
notifications closer together are answered by one listing, once that time is up."""
RELIST_MAX_S = 60.0
"""The most time a flood of ``list_changed`` can put between two listings (seconds)."""
RELIST_COST_FACTOR = 20.0
"""A listing that took ``t`` seconds is followed by the next one ``t`` times this at the
earliest: relisting takes at most about 5 % of the host's time."""


def relisting_wait(last_s: float, cost_s: float, flooded: bool) -> float:
    """The least time (seconds) before the next listing of a connection, after a listing
    that took ``cost_s`` seconds: :data:`RELIST_COST_FACTOR` times the cost, at least
    :data:`RELIST_MIN_S`; doubled from ``last_s`` when the ``list_changed`` it answered
    came before ``last_s`` was up (a flood), at most :data:`RELIST_MAX_S` then."""
    own = max(RELIST_MIN_S, cost_s * RELIST_COST_FACTOR)
    return min(RELIST_MAX_S, max(own, last_s * 2)) if flooded else own


class UpstreamViolation(ConnectionError):
    """An MCP server sent a message over a bound: its connection ends (and is restarted)."""


def shown_info(info: dict[str, Any]) -> dict[str, Any]:
    """A server's ``serverInfo`` as kept for display: its strings escaped and cut
    (:func:`shown_text`), its ``name`` and ``version`` alone kept
    with ``title`` and ``websiteUrl``."""
    return {k: shown_text(v) for k, v in info.items() if k in ("name", "version", "title", "websiteUrl")}


class MessageBounds:
    """The bounds of one connection's incoming messages (see the module doc). ``label``
    names the server in the log. :meth:`admit` takes each raw line."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.dropped = 0  # notifications dropped so far
        self.cut = 0  # structuredContent answered as too large so far
        self._tokens = float(NOTIFICATION_BURST)
        self._refilled = time.monotonic()
        self._unlogged = 0
        self._logged_at = 0.0

    def admit(self, line: bytes | str) -> SessionMessage | Exception | None:
        """The SDK message of ``line`` (a ``ValueError`` the session is told of, for a
        line that is JSON within the bounds but not a JSON-RPC message), or ``None`` for
        a notification dropped by the rate bound. Raises :class:`UpstreamViolation` for a
        line over the size, container or depth bound (the connection must end)."""
        try:
            value = loads_bounded(line, max_bytes=MAX_MESSAGE_BYTES, max_containers=MAX_CONTAINERS,
                                  max_depth=MAX_DEPTH)
        except JSONBoundError as exc:
            raise UpstreamViolation(f"{self.label} sent a message over the bounds: {exc}") from None
        except ValueError as exc:
            return exc  # not JSON: a parse error, as the SDK's own transports give
        if isinstance(value, dict):
            if "method" in value and not self._take_token():  # a notification, or a request (a ping flood)
                return None
            value = self._bounded_result(value)
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(value, by_name=False))
        except ValueError as exc:
            return exc

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(float(NOTIFICATION_BURST), self._tokens + (now - self._refilled) * NOTIFICATIONS_PER_S)
        self._refilled = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.dropped += 1
        self._unlogged += 1
        if now - self._logged_at >= _LOG_WINDOW_S:
            logger.warning("{}: {} notifications or requests dropped (more than {:g} a second after a burst of {})",
                           self.label, self._unlogged, NOTIFICATIONS_PER_S, NOTIFICATION_BURST)
            self._unlogged, self._logged_at = 0, now
        return False

    def _bounded_result(self, message: dict[str, Any]) -> dict[str, Any]:
        """``message``, or for a result whose ``structuredContent`` is over
        :data:`MAX_STRUCTURED_BYTES`, the server's error for that request naming the bound."""
        result = message.get("result")
        if not isinstance(result, dict) or "structuredContent" not in result or "id" not in message:
            return message
        size = len(json.dumps(result["structuredContent"], ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if size <= MAX_STRUCTURED_BYTES:
            return message
        self.cut += 1
        logger.warning("{}: a result's structuredContent of {:,} bytes is over the bound of {:,}: the call is "
                       "answered as an error", self.label, size, MAX_STRUCTURED_BYTES)
        error = {"code": types.INTERNAL_ERROR,
                 "message": f"the server's structuredContent of {size:,} bytes is over rho's bound of "
                            f"{MAX_STRUCTURED_BYTES:,} bytes"}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}


@contextlib.asynccontextmanager
async def message_streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          label: str) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's ``(read, write)`` ``SessionMessage`` streams over a server's byte
    streams (its stdout as ``reader``, made with ``limit=MAX_MESSAGE_BYTES``, and its
    stdin as ``writer``), every incoming line through :class:`MessageBounds`. A line
    over a bound ends the read stream (the session sees the connection close), logged
    as ``label``'s violation."""
    bounds = MessageBounds(label)
    read_send, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def from_server() -> None:
        async with read_send:
            while True:
                try:
                    line = await reader.readline()
                    if not line:
                        return
                    item = bounds.admit(line)
                except ValueError:  # asyncio's limit: a line longer than MAX_MESSAGE_BYTES
                    logger.warning("{}: connection ended: a message longer than {:,} bytes (rho's bound)", label,
                                   MAX_MESSAGE_BYTES)
                    return
                except UpstreamViolation as exc:
                    logger.warning("connection ended: {}", exc)
                    return
                except OSError as exc:  # a reset
                    logger.warning("{}: connection ended: {}", label, describe_exception(exc))
                    return
                if item is None:
                    continue
                try:
                    await read_send.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async def to_server() -> None:
        try:
            async with write_receive:
                async for message in write_receive:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    writer.write(text.encode() + b"\n")
                    await writer.drain()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_send.aclose()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(from_server)
        tasks.start_soon(to_server)
        try:
            yield read_stream, write_stream
        finally:
            tasks.cancel_scope.cancel()
            for stream in (read_stream, write_stream, read_send, write_receive):
                stream.close()


@contextlib.asynccontextmanager
async def stdio_transport(program: str, args: Sequence[str], *, cwd: str | None, stderr: Any,
                          label: str, env: Mapping[str, str] | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """Start a stdio MCP server (``program`` and ``args``, in ``cwd``, its stderr the file
    ``stderr``, leading a new session: its own process group) and yield the SDK's
    ``(read, write)`` streams of it through :func:`message_streams`. At the end its stdin
    is closed; a server still running after 2 s gets ``SIGTERM``, after 2 s more its
    process group ``SIGKILL`` (the SDK's own stdio client's order). Raises ``OSError``
    when it cannot be started."""
    process = await asyncio.create_subprocess_exec(
        program, *args, cwd=cwd, env=dict(env) if env is not None else None, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=stderr, start_new_session=True, limit=MAX_MESSAGE_BYTES,
    )
    assert process.stdout is not None and process.stdin is not None
    held = PidFd.open(process.pid)  # as it started: no signal nor wait reaches a process given its pid since
    owner = owner_now()  # a system's stop that cannot wait for this connection kills the group (otp.owned)
    owned = owner.add(held, functools.partial(held.kill, True), label) if owner is not None else -1
    try:
        async with message_streams(process.stdout, process.stdin, label) as streams:
            yield streams
    finally:
        try:
            with anyio.CancelScope(shield=True):
                await _stop(process, held)
        finally:
            if owner is not None:
                owner.discard(owned)
            held.close()


async def _stop(process: asyncio.subprocess.Process, held: PidFd) -> None:
    """Close the server's stdin, then signal its group (through ``held``, its pidfd:
    never a group given its pid since) as :func:`stdio_transport` says, and wait for it
    to be reaped (by this loop's child watcher)."""
    assert process.stdin is not None
    try:
        with contextlib.suppress(OSError, RuntimeError):
            process.stdin.close()
        for sent in (None, signal.SIGTERM):
            if sent is not None:
                held.signal(sent, group=True)
            deadline = time.monotonic() + _TERMINATE_S
            while process.returncode is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # not process.wait(): a grandchild holding the pipes would hold it
            if process.returncode is not None:
                break
    finally:  # cancelled or not: nothing of its group is left, its pipes are closed
        held.kill(group=True)  # (its leader reaped too: the rest of its group)
        reaped_by, pause = time.monotonic() + _TERMINATE_S, 0.005
        while not held.reaped() and time.monotonic() < reaped_by:  # reaped by asyncio's child watcher
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
        transport = getattr(process, "_transport", None)
        if transport is not None:
            transport.close()


class _BoundedBody(httpx2.AsyncByteStream):
    """A response body of an HTTP MCP server, ended with a ``ReadError`` once more than
    :data:`MAX_MESSAGE_BYTES` arrive in one message: for an event stream (``events``),
    without a blank line (the end of a server-sent event); any other body (a JSON one,
    whose whitespace between tokens may be blank lines too) is one message, bounded whole:
    no one message the SDK parses is larger."""

    def __init__(self, inner: Any, label: str, events: bool) -> None:
        self._inner = inner
        self._label = label
        self._events = events
        self._run = 0
        self._last = b""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            if self._events:
                data = self._last + chunk  # a blank line may be split between two chunks
                cut = max((at + len(sep) for sep in (b"\n\n", b"\n\r\n") if (at := data.rfind(sep)) >= 0),
                          default=-1)
                self._run = len(data) - cut if cut >= 0 else self._run + len(chunk)
                self._last = data[-2:]
            else:
                self._run += len(chunk)
            if self._run > MAX_MESSAGE_BYTES:
                logger.warning("{}: connection ended: a message longer than {:,} bytes (rho's bound)", self._label,
                               MAX_MESSAGE_BYTES)
                raise httpx2.ReadError(f"{self._label} sent a message longer than {MAX_MESSAGE_BYTES:,} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, label: str) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._label = label

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        events = response.headers.get("content-type", "").partition(";")[0].strip().lower() == "text/event-stream"
        return httpx2.Response(response.status_code, headers=response.headers, request=request,
                               stream=_BoundedBody(response.stream, self._label, events),
                               extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


def bounded_http_client(headers: Mapping[str, str], label: str) -> httpx2.AsyncClient:
    """The HTTP client of a streamable-HTTP MCP server (the SDK's defaults: 30 s, 300 s to
    read a stream), every response read through a bound of :data:`MAX_MESSAGE_BYTES` a
    message before the SDK parses it; ``label`` names the server in the log."""
    timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    return httpx2.AsyncClient(headers=dict(headers), timeout=timeout, transport=_BoundedTransport(label))


class _ToLoguru(logging.Handler):
    """The MCP SDK's log records, into loguru: escaped, cut, at most
    :data:`_SDK_LINES_PER_WINDOW` a window (the rest counted)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._lock = threading.Lock()
        self._window = 0.0
        self._in_window = 0
        self._skipped = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format: its bare text
            message = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            message = f"{message}: {describe_exception(record.exc_info[1])}"
        now = time.monotonic()
        with self._lock:
            skipped = 0
            if now - self._window >= _LOG_WINDOW_S:
                skipped, self._skipped, self._window, self._in_window = self._skipped, 0, now, 0
            if self._in_window >= _SDK_LINES_PER_WINDOW:
                self._skipped += 1
                return
            self._in_window += 1
        level = record.levelname if record.levelname in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "INFO"
        named = logger.bind(mcp_sdk=record.name)
        if skipped:
            named.warning("MCP SDK: {} more log records were not logged", skipped)
        named.log(level, "MCP SDK {}: {}", record.name, shown_text(message, _MAX_SHOWN))


_ROUTED = threading.Lock()
_SDK_FOLDER: Final = os.path.dirname(os.path.abspath(mcp.__file__)) + os.sep


class _SDKRecords(logging.Filter):
    """On a logger the SDK shares with others by its bare name (``client``): the SDK's
    own records (made in its package's files) go to loguru and no further; others pass."""

    def __init__(self, handler: _ToLoguru) -> None:
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        if not os.path.abspath(record.pathname).startswith(_SDK_FOLDER):
            return True
        if record.levelno >= logging.WARNING:
            self.handler.handle(record)
        return False


def route_sdk_logging() -> None:
    """Send the MCP SDK's ``logging`` records at ``WARNING`` and above to loguru through
    one :class:`_ToLoguru` (escaped, cut, rate-bounded), never to the host's stderr: the
    ``mcp`` logger's tree wholly, and the SDK's own records of the loggers it names
    ``client`` and ``server`` (a host's records there pass as before); idempotent."""
    with _ROUTED:
        sdk = logging.getLogger("mcp")
        if any(isinstance(h, _ToLoguru) for h in sdk.handlers):
            return
        handler = _ToLoguru()
        handler.setLevel(logging.WARNING)
        sdk.addHandler(handler)
        sdk.propagate = False
        for name in ("client", "server"):
            logging.getLogger(name).addFilter(_SDKRecords(handler))
