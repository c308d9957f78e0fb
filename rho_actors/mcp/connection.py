"""The connection to an MCP server of a source (:class:`rho_actors.mcp.MCPServer`): the
protocol side of a source, split from its tool catalogue (:mod:`rho_actors.mcp.source`).

An :class:`MCPConnection` actor owns one connection: an asyncio loop in a thread of its
own opens the transport (rho's bounded stdio or HTTP one, or the server's own), opens
the SDK's ``ClientSession`` on it, settles the protocol era the way the SDK's default
client does (``server/discover`` at 2026-07-28, the ``initialize`` handshake with a
server that does not answer it), lists the tools and publishes them in a :class:`Link`,
and keeps the connection watched (pings, ``list_changed``, a lost session). When the
connection ends, the actor exits with the reason and its supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from loguru import logger
from mcp.client._probe import negotiate_auto
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged, listen
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from rho_actors.encoding import describe_exception
from rho_actors.mcp.bounds import (
    RELIST_MIN_S,
    bounded_http_client,
    relisting_wait,
    shown_info,
    shown_text,
    stdio_transport,
)
from rho_actors.mcp.launch import env_command
from rho_actors.mcp.peers import pin_listener
from rho_actors.mcp.relay import relay_log, relay_question
from rho_actors.mcp.stderr_log import StderrLog
from rho_actors.otp.actor import Actor, kill
from rho_actors.otp.owned import owner_now, owning

__all__ = ["MAX_LISTED_BYTES", "TASKS_EXTENSION", "Link", "MCPConnection"]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""MCP Tasks (SEP-2663), declared by every connection: a server may answer a call with a
task, which the call follows (:meth:`rho_actors.mcp.MCPServer.call`)."""

_MAX_PAGES = 100
MAX_LISTED_BYTES = 32 * 2**20
"""The bytes of declarations (as JSON) kept of one server's listing at most (a sane one is
under 100 KiB: :data:`rho_actors.declarations.checks.DEFAULT_MAX_SCHEMA_BYTES`)."""
_LISTEN_WAIT_MAX_S = 300.0  # the longest wait before a subscriptions/listen stream is opened again
_STDERR_SETTLE_S = 0.5  # how long an ended connection waits for the last stderr lines
_HALT_WAIT_S = 8.0  # how long a stopping connection waits for its client thread to end


@dataclass(slots=True)
class Link:
    """What the connection actor publishes for the tools (outlives its restarts)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    session: ClientSession | None = None
    aloop: asyncio.AbstractEventLoop | None = None
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> MCP Tool (wire shape)
    stopping: bool = False
    connections: int = 0  # connections made so far (1 + restarts that connected)
    failures: int = 0  # attempts that ended (failed to connect, or the connection was lost)
    last_error: str | None = None
    server_info: dict[str, Any] | None = None  # the last connection's serverInfo (name, version...)
    protocol_version: str | None = None  # the last connection's protocol version (2026-07-28, 2025-11-25...)
    tasks: bool = False  # whether the last connection's server advertised the tasks extension (SEP-2663)
    given_up: str | None = None  # why its supervisor gave up on it (past the restart intensity)
    listeners: dict[int, Any] = field(default_factory=dict)  # calls in flight -> their MCP client (log relay)
    renew: Any = None  # ends the live connection at once (its session unknown to the server): a callable
    changed: threading.Condition = field(init=False)  # notified when a connection is published or an attempt ends

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)



class MCPConnection(Actor):
    """Owns one connection to an MCP server (a child of the server's supervisor): an
    asyncio loop in a thread of its own connects, lists the tools, publishes them and
    keeps the connection watched. When the connection ends, this actor exits with the
    reason (:func:`~rho_actors.kill`: an abnormal exit), so its supervisor restarts it
    (a new process or connection)."""

    def __init__(self, server: Any, link: Link, lister: bool = True) -> None:
        super().__init__()
        self._server = server
        self._link = link
        self._lister = lister  # False: a connection for calls only (a session's own process), never listed
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._halting = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"{server.name}-client", daemon=True)
        self._stderr: StderrLog | None = None
        self._owner = owner_now()  # its system's owned processes: the server's process is entered there

    def on_start(self) -> None:
        self._thread.start()
        self._ready.wait(5.0)

    def on_stop(self) -> None:
        self._halt()

    def on_failure(self, *exc_info: Any) -> None:
        self._halt()

    def _halt(self) -> None:
        self._halting.set()
        aloop, task = self._aloop, self._task
        if aloop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                aloop.call_soon_threadsafe(task.cancel)
        self._thread.join(_HALT_WAIT_S)
        if self._thread.is_alive():
            logger.warning("MCP server {}: its client thread did not end within {:g} s of being told to stop; it is "
                           "left running (a transport or server that does not let go)", self._server.name,
                           _HALT_WAIT_S)
        self._unpublish()

    # --- the connection's own thread ---------------------------------------------------------

    def _main(self) -> None:
        reason = "the connection ended"
        try:
            with owning(self._owner):  # a process this thread starts is its system's (rho_actors.otp.owned)
                asyncio.run(self._connect())
        except BaseException as exc:  # whatever ends the connection: this actor exits with it
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # anyio's task groups wrap it
                exc = exc.exceptions[0]
            reason = describe_exception(exc)
        finally:
            self._ready.set()
        self._unpublish()
        if not self._halting.is_set():
            said = ""
            if self._stderr is not None:
                self._stderr.done.wait(_STDERR_SETTLE_S)  # an exited process's last lines, read
                said = self._stderr.last()
            if said:
                reason = f"{reason} (its stderr: {said})"
            logger.warning("MCP server {}: {}; {}", self._server.name, reason,
                           "restarting it" if self._lister else "a session's process: the next call starts another")
            with self._link.changed:
                self._link.last_error = reason
                self._link.failures += 1
                self._link.changed.notify_all()
            kill(self.actor_ref, f"MCP server {self._server.name}: {reason}")

    def _unpublish(self) -> None:
        with self._link.lock:
            had = self._link.session is not None or bool(self._link.tools)
            self._link.session, self._link.aloop, self._link.tools = None, None, {}
        if had and self._lister:
            self._server.refresh_offer()

    async def _connect(self) -> None:  # noqa: PLR0915 (one linear story: transport, session, watch)
        self._aloop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._ready.set()
        if self._halting.is_set():
            return
        server = self._server
        relist = asyncio.Event()
        wake = asyncio.Event()
        changed_at: list[float] = []  # when the first list_changed since the last listing came
        renewing = asyncio.Event()

        def renew_now() -> None:
            renewing.set()
            wake.set()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification) and self._lister:
                if not relist.is_set():
                    changed_at[:] = [time.monotonic()]
                relist.set()
                wake.set()

        async with contextlib.AsyncExitStack() as stack:
            opened = await server.open_transport(stack)
            if opened is not None:  # a transport of the server's own (the gateway's confined servers)
                read, write = opened
            elif server.command is not None:
                read, write = await self._open_stdio(stack)
            else:
                assert server.url is not None
                pin_listener(server.url, server.server_uid)
                label = f"MCP server {server.name}"
                client = await stack.enter_async_context(bounded_http_client(server.headers, label))
                read, write = await stack.enter_async_context(streamable_http_client(server.url, http_client=client))
            ended = asyncio.Event()
            relay_send, relay_receive = anyio.create_memory_object_stream[Any](16)
            tasks = await stack.enter_async_context(anyio.create_task_group())

            def on_log(params: types.LoggingMessageNotificationParams) -> None:
                relay_log(self._link.lock, self._link.listeners, server.name, params)

            tasks.start_soon(_relay, read, relay_send, ended, wake, on_log, server.name)
            session = await stack.enter_async_context(
                ClientSession(relay_receive, write, message_handler=on_message,
                              elicitation_callback=self._elicited, sampling_callback=self._sampled,
                              list_roots_callback=self._roots_asked, log_level="debug",
                              extensions={TASKS_EXTENSION: {}})
            )
            with anyio.fail_after(server.connect_timeout_s):
                await _negotiate(session, server.mode)
                tools, ttl_s = await _list_tools(session, server) if self._lister else ({}, None)
            modern = session.protocol_version in MODERN_PROTOCOL_VERSIONS
            if modern and self._lister:  # 2026-07-28: list changes come on a subscriptions/listen stream
                tasks.start_soon(_listen_changes, session, on_message, server.ping_interval_s)
            info = session.server_info
            with self._link.lock:
                self._link.connections += 1
                self._link.protocol_version = session.protocol_version
                self._link.tasks = _advertises_tasks(session)
                self._link.server_info = shown_info(info.model_dump(mode="json", exclude_none=True)) if info else {}
            aloop = asyncio.get_running_loop()
            self._link.renew = lambda: aloop.call_soon_threadsafe(renew_now)
            self._publish(session, tools)
            listed_at, wait_s = time.monotonic(), RELIST_MIN_S
            try:
                while True:
                    # a list_changed flood relists ever more rarely (the host's CPU: relisting_wait)
                    early = listed_at + wait_s - time.monotonic()
                    quiet = server.ping_interval_s if ttl_s is None else min(server.ping_interval_s,
                                                                              listed_at + ttl_s - time.monotonic())
                    try:
                        await asyncio.wait_for(wake.wait(), max(0.0, early) if relist.is_set() else max(0.0, quiet))
                    except TimeoutError:
                        if ttl_s is not None and time.monotonic() >= listed_at + ttl_s:
                            relist.set()  # the listing's cache hint (ttlMs) has run out: list again
                        elif not relist.is_set():
                            with anyio.fail_after(server.connect_timeout_s):
                                await _heartbeat(session, modern)
                            continue
                    wake.clear()
                    if renewing.is_set():
                        raise ConnectionError("the server no longer knows this connection's session "
                                              "(it restarted?)")
                    if ended.is_set():
                        raise ConnectionError("the server closed the connection (its process exited?)")
                    if relist.is_set() and time.monotonic() >= listed_at + wait_s:
                        relist.clear()
                        began = time.monotonic()
                        with anyio.fail_after(server.connect_timeout_s):
                            tools, ttl_s = await _list_tools(session, server)
                        flooded = bool(changed_at) and changed_at[0] < listed_at + wait_s
                        wait_s = relisting_wait(wait_s, time.monotonic() - began, flooded)
                        listed_at = time.monotonic()
                        if tools != self._link.tools:  # an unchanged listing costs the offer nothing
                            self._publish(session, tools)
            finally:
                tasks.cancel_scope.cancel()

    # a handshake-era server's own questions: to the client of the one call in flight (relay_question)

    async def _elicited(self, context: Any, params: types.ElicitRequestParams) -> Any:
        return await self._relay_question(types.ElicitRequest(params=params))

    async def _sampled(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        return await self._relay_question(types.CreateMessageRequest(params=params))

    async def _roots_asked(self, context: Any) -> Any:
        return await self._relay_question(types.ListRootsRequest())

    async def _relay_question(self, request: Any) -> Any:
        return await asyncio.to_thread(relay_question, self._link.lock, self._link.listeners, request)

    async def _open_stdio(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        """Start the stdio server (through ``env -i``: the scrubbed environment), its
        stderr a pipe into the log; its streams, every message bounded before it is
        parsed (:func:`rho_actors.mcp.bounds.stdio_transport`)."""
        server = self._server
        assert server.command is not None
        program, args = env_command(server.env, server.command)
        self._stderr = StderrLog(server.name)
        stack.callback(self._stderr.close_writer)
        streams = await stack.enter_async_context(stdio_transport(
            program, args, cwd=server.cwd, stderr=self._stderr.writer, label=f"MCP server {server.name}"))
        self._stderr.close_writer()  # the process has its copy: the reader sees EOF when it exits
        return streams[0], streams[1]

    def _publish(self, session: ClientSession, tools: dict[str, dict[str, Any]]) -> None:
        with self._link.changed:
            self._link.session, self._link.aloop, self._link.tools = session, self._aloop, tools
            self._link.changed.notify_all()
        if self._lister:
            self._server.refresh_offer()


async def _relay(read: Any, send: Any, ended: asyncio.Event, wake: asyncio.Event,
                 on_log: Callable[[types.LoggingMessageNotificationParams], None], server: str) -> None:
    """Forward the transport's messages to the session; set ``ended`` when it closes.
    A log message (``notifications/message``) goes to ``on_log`` here, in the order it
    was read: before a response read after it ends the call it belongs to (the session
    would hand it to a task of its own, which a response can overtake)."""
    try:
        async with send:
            async for item in read:
                message = getattr(item, "message", None)
                if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/message":
                    try:
                        on_log(types.LoggingMessageNotificationParams.model_validate(message.params or {}))
                    except ValidationError as err:
                        logger.warning("MCP server {} sent a malformed log message: {}", server,
                                       shown_text(str(err), 300))
                    continue
                await send.send(item)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
        pass
    finally:
        ended.set()
        wake.set()


def _advertises_tasks(session: ClientSession) -> bool:
    """Whether the server advertised the tasks extension (``capabilities.extensions``)."""
    capabilities = session.server_capabilities
    extensions = getattr(capabilities, "extensions", None)
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


async def _negotiate(session: ClientSession, mode: str) -> None:
    """Settle the protocol era as the SDK's ``Client(mode=...)`` does: ``"auto"`` the
    SDK's own probe (``server/discover``, else the ``initialize`` handshake),
    ``"legacy"`` the handshake, a 2026-07-28 version ``server/discover`` at it."""
    if mode == "auto":
        await negotiate_auto(session)
    elif mode == "legacy":
        await session.initialize()
    else:
        session.adopt(types.DiscoverResult.model_validate(await session.send_discover(mode)))


async def _heartbeat(session: ClientSession, modern: bool) -> None:
    """Ask a quiet server whether it still answers: ``ping`` in the handshake era, a
    ``server/discover`` at 2026-07-28 (which has no ``ping``)."""
    if modern:
        version = session.protocol_version
        assert version is not None
        await session.send_discover(version)
    else:
        await session.send_ping()


async def _listen_changes(session: ClientSession, on_message: Any, quiet_s: float) -> None:
    """A 2026-07-28 server's ``tools/list_changed``, from its ``subscriptions/listen``
    stream (the SDK's :func:`mcp.client.subscriptions.listen`), fed to ``on_message`` as
    the handshake era's notification is. A server that does not serve the stream is
    listed again when its listing's ``ttlMs`` runs out. A stream that ends (the server
    restarted: 2026-07-28 has no session to lose, and calls go on meanwhile) is opened
    again ``quiet_s`` later (the heartbeat's interval: over HTTP a request to a server
    still down ends the connection, which is then restarted), then ever more rarely while
    it keeps ending (at most :data:`_LISTEN_WAIT_MAX_S` apart), and once open the server
    is listed again (a change may have been missed)."""
    wait_s, opened = quiet_s, False
    while True:
        try:
            async with listen(session, tools_list_changed=True) as subscription:
                if opened:
                    await on_message(types.ToolListChangedNotification())
                opened = True
                async for event in subscription:
                    if isinstance(event, ToolsListChanged):
                        wait_s = quiet_s
                        await on_message(types.ToolListChangedNotification())
        except (MCPError, TimeoutError) as exc:
            if not opened:  # not served (refused, never acknowledged): the ttl stands
                return
            logger.debug("MCP subscriptions/listen: {}", describe_exception(exc))
        except Exception as exc:  # dropped
            logger.debug("MCP subscriptions/listen stream ended: {}", describe_exception(exc))
        await asyncio.sleep(wait_s)
        wait_s = min(wait_s * 2, max(quiet_s, _LISTEN_WAIT_MAX_S))


async def _list_tools(session: ClientSession, server: Any) -> tuple[dict[str, dict[str, Any]], float | None]:
    """The server's tools (every page, at most :data:`_MAX_PAGES`), bounded: once
    ``server.max_tools`` tools or :data:`MAX_LISTED_BYTES` of declarations (as JSON)
    are kept, the rest of the listing is left out, logged once per server. With them,
    how long the listing is fresh (seconds: the least ``ttlMs`` of its pages, at least
    :data:`RELIST_MIN_S`; None: no hint, or ``ttlMs`` 0, which asks no caching: listed
    again on a change only)."""
    ttl_s: float | None = None
    max_tools, max_bytes = server.max_tools, MAX_LISTED_BYTES
    tools: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    size = 0
    for _ in range(_MAX_PAGES):
        result = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        if result.ttl_ms > 0 and session.protocol_version in MODERN_PROTOCOL_VERSIONS:  # a 2026-07-28 cache hint
            ttl_s = max(RELIST_MIN_S, min(ttl_s or math.inf, result.ttl_ms / 1000))
        for tool in result.tools:
            declared = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
            size += len(json.dumps(declared))
            if len(tools) >= max_tools or size > max_bytes:
                if not server.listing_cut:
                    server.listing_cut = True
                    logger.warning("MCP server {} lists more than {} tools or {:,} bytes of declarations; the {} "
                                   "tools listed first are kept, the rest left out", server.name, max_tools,
                                   max_bytes, len(tools))
                return tools, ttl_s
            tools[tool.name] = declared
        cursor = result.next_cursor
        if not cursor:
            break
    return tools, ttl_s
