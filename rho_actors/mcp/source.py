"""An MCP server's tools as supervised, deadline-bound rho tools (a source: DESIGN §1).

``system.add_source(MCPServer(command=[...], env={...}))`` (stdio) or
``system.add_source(MCPServer(url=..., headers={...}))`` (streamable HTTP) offers the
server's tools like any other source's:

- The connection is owned by an :class:`MCPConnection` actor, the one ``permanent``
  child of a supervisor (``mcp:<name>``, a ``temporary`` subtree of the system's
  ``sources``: a source's actors are the system's side of the tree, DESIGN §6) with the
  restart intensity ``max_restarts`` in ``max_seconds``. The MCP
  client runs on an asyncio loop in a thread the actor owns; the actor never blocks on
  it. When the server process exits, its connection closes, or a heartbeat ``ping``
  goes unanswered (a hung server), the actor exits and is restarted (a new process):
  calls in flight get ``crashed`` results, calls while it is down ``unavailable``, and
  its tools leave the offer until the new connection has listed them. Past the
  intensity the supervisor ends and the tools stay out.
- Each tool is an :class:`MCPTool` whose ``run`` sends ``tools/call`` with the rho
  deadline as the request timeout; at the deadline (``ctx["cancel"]``) the request is
  abandoned, which sends ``notifications/cancelled``, and the loop's result is
  ``timeout`` on time whatever the server does.
- Declarations pass the checks of DESIGN §3 (a bad one is left out with its reason,
  logged once); ``notifications/tools/list_changed`` re-lists and refreshes the offer.
- Every message a server sends is bounded before any parser sees it, trusted or not
  (:mod:`rho_actors.mcp.bounds`: rho's own stdio transport, size, arrays and objects,
  depth, notification rate, ``structuredContent``, relisting cost), and ``tools/call``
  is sent bare, so the SDK never applies a server's ``outputSchema``.
- A stdio server gets a scrubbed environment: ``PATH``, ``LANG``, ``LC_*``, ``TZ`` and
  ``HOME`` from this process, plus the explicit ``env`` (the untrusted-boundary rule).
- A ``url`` on a loopback address is pinned to its owner: before each connection, the
  sockets listening on its port (the kernel's table, :mod:`rho_actors.mcp.peers`) must
  all belong to ``server_uid`` (default: this process's uid), else nothing is sent (not
  the ``headers``, no request) and the connection fails naming the uid found, so a
  process of another user that took the port while the server was down gets neither
  the token nor a call. A URL off loopback is not pinned (use ``https``: its
  certificate is checked).

Results: text, image, audio and embedded-resource content become a rho result's
blocks in order (:func:`rho_actors.mcp.content.rho_value`), other content is given as
JSON; a result's ``structuredContent`` is kept in its
``details`` (``{"structuredContent": ...}``, for the host); ``isError`` is a
``tool_error`` (an ``Error`` the tool returned). The texts of the other failures are in
:data:`rho_actors.results.TEXTS` (the ``mcp_*`` keys).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import json
import os
import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
import pykka
from loguru import logger
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from rho_actors.declarations.annotations import HINTS
from rho_actors.declarations.policy import parse_rate
from rho_actors.encoding import describe_exception
from rho_actors.mcp.bounds import (
    RELIST_MIN_S,
    bounded_http_client,
    relisting_wait,
    route_sdk_logging,
    shown_info,
    shown_text,
    stdio_transport,
)
from rho_actors.mcp.client_requests import client_of
from rho_actors.mcp.content import rho_value
from rho_actors.mcp.launch import ENV_ALLOWLIST, env_command, find_program, scrubbed_environment
from rho_actors.mcp.names import default_name
from rho_actors.mcp.peers import pin_listener
from rho_actors.mcp.relay import listen, relay_log
from rho_actors.mcp.sessions import SessionGone, session_unknown
from rho_actors.mcp.stderr_log import StderrLog
from rho_actors.otp.actor import NORMAL, Actor, kill, monitor
from rho_actors.otp.supervisor import ChildSpec, StartChild
from rho_actors.results import SENT_CANCEL, TEXTS, text
from rho_actors.tool import DEFAULT_TIMEOUT_MS, ToolFailure

__all__ = [
    "ENV_ALLOWLIST", "MAX_LISTED_BYTES", "MAX_TOOLS", "RELIST_MIN_S", "Link", "MCPConnection", "MCPServer", "MCPTool",
    "default_name", "scrubbed_environment",
]

_MAX_PAGES = 100
MAX_TOOLS = 4096
"""The tools kept of one server's listing at most (``MCPServer(max_tools=...)``); the rest are left out, logged."""
MAX_LISTED_BYTES = 32 * 2**20
"""The bytes of declarations (as JSON) kept of one server's listing at most (a sane one is
under 100 KiB: :data:`rho_actors.declarations.checks.DEFAULT_MAX_SCHEMA_BYTES`)."""
_STDERR_SETTLE_S = 0.5  # how long an ended connection waits for the last stderr lines
_SOURCES = "sources"  # the system's supervisor of sources and their own subtrees


def _fails(key: str, tool: str, **fields: Any) -> ToolFailure:
    """The :class:`ToolFailure` of situation ``key`` of the results table."""
    return ToolFailure(TEXTS[key][0], text(key, tool=tool, **fields))


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
    server_info: dict[str, Any] | None = None  # the last initialize's serverInfo (name, version...)
    given_up: str | None = None  # why its supervisor gave up on it (past the restart intensity)
    listeners: dict[int, Any] = field(default_factory=dict)  # calls in flight -> their MCP client (log relay)
    renew: Any = None  # ends the live connection at once (its session unknown to the server): a callable
    changed: threading.Condition = field(init=False)  # notified when a connection is published or an attempt ends

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)


class MCPTool:
    """One tool of an MCP server, as a rho tool (trusted: its code is this class; the
    server's code runs in its own process or host). ``run`` raises
    :class:`~rho_actors.ToolFailure` for ``unavailable``/``crashed``/``timeout``/
    ``cancelled``."""

    def __init__(self, server: MCPServer, declared: Mapping[str, Any]) -> None:
        self._server = server
        self._declared = copy.deepcopy(dict(declared))

    def name(self) -> Any:
        """The server's tool name (checked like any other: ``^[A-Za-z0-9_-]{1,64}$``)."""
        return self._declared.get("name")

    def description(self) -> Any:
        """The server's description (its title when it gives none)."""
        return self._declared.get("description") or self._declared.get("title")

    def parameter_schema(self) -> Any:
        """The server's ``inputSchema``."""
        return copy.deepcopy(self._declared.get("inputSchema"))

    def output_schema(self) -> Any:
        """The server's ``outputSchema`` (None without one): served on by ``mcp serve``."""
        return copy.deepcopy(self._declared.get("outputSchema"))

    def timeout_ms(self) -> int:
        """The server's per-call timeout (``MCPServer(timeout_ms=...)``), in milliseconds."""
        return self._server.timeout_ms

    def rate_limit(self) -> str | None:
        """The server's rate (``MCPServer(rate=...)``), shared by all its tools (:meth:`rate_group`)."""
        return self._server.rate

    def rate_group(self) -> str | None:
        """``mcp:<server>`` when the server has a rate: its tools take tokens from one bucket."""
        return None if self._server.rate is None else f"mcp:{self._server.name}"

    def idempotent(self) -> bool:
        """The tool's ``idempotentHint`` annotation, when the host trusts the server's hints
        (``MCPServer(idempotent_hints=True)``): its failed calls may then be retried."""
        annotations = self._declared.get("annotations")
        return self._server.idempotent_hints and isinstance(annotations, dict) and (
            annotations.get("idempotentHint") is True)

    def annotations(self) -> Any:
        """The server's ``annotations`` and its tool's ``title``: hints, checked as any tool's."""
        said = self._declared.get("annotations")
        kept = {k: v for k, v in said.items() if k in ("title", *HINTS)} if isinstance(said, dict) else {}
        if isinstance(self._declared.get("title"), str):
            kept["title"] = self._declared["title"]
        return kept

    def run(self, args: dict[str, Any], ctx: Mapping[str, Any]) -> Any:
        """Send ``tools/call`` and wait for its result, at most until ``ctx["deadline"]``."""
        return self._server.call(str(self._declared.get("name")), args, ctx, idempotent=self.idempotent())

    def __repr__(self) -> str:
        return f"<MCPTool {self._declared.get('name')!r} of {self._server.name}>"


class MCPServer:
    """An MCP server as a tool source (see the module doc).

    Exactly one of ``command`` (a stdio server: the program and its arguments; ``env``
    adds variables to its scrubbed environment; ``cwd`` its working folder) or ``url``
    (streamable HTTP; ``headers`` are sent with every request). ``name`` must be
    unique among a system's sources; its default is what the command runs (``python -m
    mcp_server_time`` is ``mcp_server_time``, ``uvx mcp-server-git`` is
    ``mcp-server-git``) or the URL's host and port: the rule of
    :func:`rho_actors.mcp.names.default_name`, which the gateway uses too.
    ``timeout_ms`` is each tool's per-call timeout (milliseconds); ``max_restarts`` in
    ``max_seconds`` the restart intensity of the connection; ``connect_timeout_s``
    bounds connecting and listing (seconds); ``ping_interval_s`` how often a quiet
    connection is pinged (a ping unanswered within ``connect_timeout_s`` restarts it).
    ``server_uid``: the uid that must own a loopback ``url``'s listening socket
    (default ``os.getuid()``; module doc). ``max_tools``: the tools kept of its listing
    at most (and :data:`MAX_LISTED_BYTES` of declarations); the rest are left out, logged.
    ``rate`` (``"10/s"``, ``"600/min"``...): one token bucket for all the server's tools
    (DESIGN §4 "The governor"); ``idempotent_hints=True``: the host trusts the server's
    ``idempotentHint`` annotations, and a tool so annotated is retried as an idempotent
    tool is.

    Raises ``ValueError`` for neither or both of ``command`` and ``url``, an empty
    ``command`` or a bad ``rate``.
    """

    contained = True  # tools stand for code elsewhere: registered trusted (see rho_actors.sources)

    def __init__(
        self,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        *,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        cwd: str | None = None,
        name: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        connect_timeout_s: float = 10.0,
        ping_interval_s: float = 15.0,
        server_uid: int | None = None,
        max_tools: int = MAX_TOOLS,
        rate: str | None = None,
        idempotent_hints: bool = False,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("MCPServer takes exactly one of command=[...] (stdio) or url=... (streamable HTTP)")
        if command is not None and (isinstance(command, str) or not command):
            raise ValueError(f"command must be a non-empty list of program and arguments, got {command!r}")
        self.command = list(command) if command is not None else None
        self.env = dict(env or {})
        self.url = url
        self.headers = dict(headers or {})
        self.cwd = cwd
        self.name = name or default_name(self.command, url)
        self.timeout_ms = timeout_ms
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self.connect_timeout_s = connect_timeout_s
        self.ping_interval_s = ping_interval_s
        self.server_uid = os.getuid() if server_uid is None else server_uid
        self.max_tools = max_tools
        self.rate = None if rate is None else parse_rate(rate).text  # checked now: ValueError names the forms
        self.idempotent_hints = idempotent_hints is True
        self.listing_cut = False  # whether a listing went over the bounds (logged once)
        self._link = Link()
        route_sdk_logging()  # the SDK's own log records: into loguru, escaped, never raw onto stderr
        self._tools: dict[str, tuple[str, MCPTool]] = {}  # name -> (version, tool): the same object while unchanged
        self._system: Any = None
        self.subtree: Any = None  # the connection's supervisor (its own subtree under sources), once attached

    # --- the source protocol ------------------------------------------------------------

    @property
    def child_id(self) -> str:
        """The id of the connection's subtree under ``sources``, and the name of its
        :class:`MCPConnection` (``system.whereis(child_id)``)."""
        return f"mcp:{self.name}"

    def attach(self, system: Any) -> None:
        """Start the supervised connection in its own subtree under ``system``'s
        ``sources``, with this server's restart intensity (called by
        :func:`rho_actors.sources.source_actor.add_source`), and wait until it has listed the server's
        tools, at most ``connect_timeout_s`` seconds, so that ``add_source`` returns with
        them offered (a server still down by then is offered once it connects), or
        until the first attempt fails (it is logged, with the server's last stderr lines;
        the restarts go on within the intensity). Raises ``FileNotFoundError`` at once,
        starting nothing, when a stdio server's program is not found (on the ``PATH`` it
        would get, or from ``cwd``), ``ValueError`` when another connection holds
        :attr:`child_id`."""
        if self.command is not None:
            find_program(self.command[0], scrubbed_environment(self.env).get("PATH", ""), self.cwd, self.name)
        self._system = system
        self._link.stopping = False
        with self._link.lock:
            failures = self._link.failures
            self._link.given_up = None
        spec = ChildSpec(self.child_id, StartChild(MCPConnection, (self, self._link)), restart="permanent",
                         shutdown=10_000, name=self.child_id)
        system.start_child(spec, max_restarts=self.max_restarts, max_seconds=self.max_seconds, under=_SOURCES)
        self._watch_subtree(system)
        self._wait(failures, self.connect_timeout_s)

    def _watch_subtree(self, system: Any) -> None:
        """Monitor the connection's supervisor: when it ends while this server is not
        being stopped (it gave up, past the restart intensity), record why in
        :attr:`given_up`, wake waiters and scan again."""
        sources = system.whereis(_SOURCES)
        children = sources.proxy().which_children().get(timeout=15) if sources is not None else []
        subtree = next((c.ref for c in children if c.id == self.child_id and c.ref is not None), None)
        self.subtree = subtree

        def down(_ref: Any, reason: object) -> None:
            link = self._link
            if link.stopping or reason == NORMAL:  # detached, or the system is stopping
                return
            with link.changed:
                link.given_up = describe_exception(reason) if isinstance(reason, BaseException) else str(reason)
                link.failures += 1
                link.changed.notify_all()
            self.refresh_offer()

        if subtree is not None:
            monitor(subtree, down)
        else:  # it gave up already
            try:
                system.lookup(self.child_id)
            except pykka.ActorDeadError as exc:  # NotRunningError, naming why
                down(None, getattr(exc, "reason", None) or exc)

    def detach(self) -> None:
        """Stop the connection and its subtree (called by
        :meth:`rho_actors.SourceHandle.close`); never raises."""
        self._link.stopping = True
        sources = self._system.whereis(_SOURCES) if self._system is not None else None
        if sources is not None:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                sources.proxy().terminate_child(self.child_id).get(timeout=15)

    def scan(self) -> dict[str, tuple[Any, object]]:
        """``{tool name: (MCPTool, declaration as JSON)}`` for the tools listed by the
        live connection; ``{}`` while it is down."""
        with self._link.lock:
            listed = dict(self._link.tools)
        found: dict[str, tuple[Any, object]] = {}
        for name, declared in listed.items():
            version = json.dumps(declared, sort_keys=True, default=str)
            held = self._tools.get(name)
            if held is None or held[0] != version:
                held = (version, MCPTool(self, declared))
                self._tools[name] = held
            found[name] = (held[1], version)
        for gone in set(self._tools) - set(found):
            del self._tools[gone]
        return found

    @property
    def connected(self) -> bool:
        """Whether a connection is up now (its tools listed)."""
        return self._link.session is not None

    def wait_connected(self, timeout_s: float | None = None) -> bool:
        """Wait until a connection is up (its tools listed) or the next attempt fails,
        at most ``timeout_s`` seconds (default ``connect_timeout_s``); returns
        :attr:`connected` (:attr:`last_error` says why not)."""
        with self._link.lock:
            failures = self._link.failures
        return self._wait(failures, self.connect_timeout_s if timeout_s is None else timeout_s)

    def _wait(self, failures: int, timeout_s: float) -> bool:
        link = self._link
        with link.changed:
            link.changed.wait_for(lambda: link.session is not None or link.failures != failures, timeout_s)
            return link.session is not None

    @property
    def last_error(self) -> str | None:
        """Why the last attempt to connect, or the last connection, ended (None: none did)."""
        return self._link.last_error

    @property
    def given_up(self) -> str | None:
        """Why the connection's supervisor gave up on it, past ``max_restarts`` in
        ``max_seconds`` (``None`` while it is supervised): it is not restarted again."""
        return self._link.given_up

    @property
    def server_info(self) -> dict[str, Any] | None:
        """The server's ``serverInfo`` of its last ``initialize`` (``name``,
        ``version``...; ``None`` before it connected): what it says of itself, shown,
        never its source name (:mod:`rho_actors.mcp.names`)."""
        return copy.deepcopy(self._link.server_info)

    @property
    def connections(self) -> int:
        """How many connections were made so far (the first, then one per restart)."""
        return self._link.connections

    def refresh_offer(self) -> None:
        """Ask the source's actor to scan now (without waiting)."""
        ref = self._system.whereis(f"source:{self.name}") if self._system is not None else None
        if ref is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.proxy().refresh()

    async def open_transport(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any] | None:
        """A transport of this server's own, entered into ``stack`` (closed when the
        connection ends): ``(read, write)`` streams of the SDK's ``SessionMessage``s, as
        ``stdio_client`` gives. ``None`` (this class): the stdio transport of ``command``
        or the HTTP one of ``url``. A subclass overrides it
        (:class:`rho_actors.mcp.gateway.Upstream`: a server confined as untrusted workers are)."""
        return None

    # --- calls ----------------------------------------------------------------------------

    def call(self, name: str, args: dict[str, Any], ctx: Mapping[str, Any], *, idempotent: bool = False) -> Any:
        """Send ``tools/call`` for ``name`` over the call's connection (:meth:`call_link`; from a
        call's thread); its content as rho values, or :class:`ToolFailure`. A server that no
        longer knows the session (restarted) gets a new connection at once, and the call
        again on it (once) when ``idempotent`` (the tool's declared idempotence,
        :meth:`MCPTool.idempotent`: its hint only where trusted), else ``mcp_session_gone``."""
        with self.call_link(name, ctx) as link:
            try:
                return self._call_on(link, name, args, ctx)
            except SessionGone as gone:
                if not idempotent:
                    raise _fails("mcp_session_gone", name, server=self.name) from None
                old, left = gone.session, float(ctx.get("deadline", 0.0)) - time.monotonic()
                with link.changed:
                    if not link.changed.wait_for(lambda: link.session not in (None, old), max(0.0, left)):
                        raise _fails("mcp_not_connected", name, server=self.name) from None
        return self.call(name, args, ctx, idempotent=False)

    def call_link(self, tool: str, ctx: Mapping[str, Any]) -> contextlib.AbstractContextManager[Link]:
        """The connection a call of ``tool`` in ``ctx`` goes to, held while it runs: this
        server's one connection. :class:`rho_actors.mcp.gateway.Upstream` overrides it (an
        untrusted server's process of the call's session). Raises :class:`ToolFailure`."""
        return contextlib.nullcontext(self._link)

    def _call_on(self, link: Link, name: str, args: dict[str, Any], ctx: Mapping[str, Any]) -> Any:
        with link.lock:
            session, aloop = link.session, link.aloop
        if session is None or aloop is None:
            raise _fails("mcp_not_connected", name, server=self.name)
        deadline = float(ctx.get("deadline", time.monotonic() + self.timeout_ms / 1000))
        left = max(0.001, deadline - time.monotonic())
        report = ctx.get("progress")

        async def forward(progress: float, total: float | None, message: str | None) -> None:
            if callable(report):
                report(progress, total, message)

        # sent as a bare request: the SDK's own result check (its jsonschema, Python's re on
        # the server's patterns) never runs here; rho's bounded validator checks it (mcp serve)
        request = session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args)),
            types.CallToolResult, request_read_timeout_seconds=left, progress_callback=forward)
        try:
            future = asyncio.run_coroutine_threadsafe(request, aloop)
        except RuntimeError:  # the loop closed in between
            request.close()
            raise _fails("mcp_not_connected", name, server=self.name) from None
        listen(link.lock, link.listeners, client_of(ctx), future)  # the server's log messages: to a served call
        cancel = ctx.get("cancel")
        if cancel is not None:
            cancel.add_inline_callback(future.cancel)  # abandons the request: sends notifications/cancelled
        try:
            result = future.result(timeout=left + 5.0)
        except concurrent.futures.CancelledError:
            reason = getattr(cancel, "reason", None) or "cancelled"
            if reason == "timeout":  # the deadline: the same result whichever thread answers first
                raise self._timed_out(name) from None
            raise _fails("cancelled", name, reason=reason) from None
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise self._timed_out(name) from None
        except MCPError as err:
            if err.code == REQUEST_TIMEOUT:
                raise self._timed_out(name) from None
            if session_unknown(err):  # the connection is replaced (its end logged): a new session
                if callable(link.renew) and link.session is session:
                    link.renew()
                raise SessionGone(session) from None
            raise _failure(self.name, name, err, link.stopping) from None
        return rho_value(result)

    def _timed_out(self, tool: str) -> ToolFailure:
        return _fails("timeout", tool, timeout_ms=self.timeout_ms, consequence=SENT_CANCEL)

    def __repr__(self) -> str:
        where = f"command={shlex.join(self.command)!r}" if self.command is not None else f"url={self.url!r}"
        return f"MCPServer({where}, name={self.name!r})"


def _failure(server: str, tool: str, err: MCPError, stopping: bool) -> ToolFailure:
    if err.code == CONNECTION_CLOSED:
        return _fails("mcp_stopped" if stopping else "mcp_crashed", tool, server=server)
    return _fails("mcp_refused", tool, server=server, code=err.code, message=shown_text(err.error.message, 2000))


# --------------------------------------------------------------------------- the actor


class MCPConnection(Actor):
    """Owns one connection to an MCP server (a child of the server's supervisor): an
    asyncio loop in a thread of its own connects, lists the tools, publishes them and
    keeps the connection watched. When the connection ends, this actor exits with the
    reason (:func:`~rho_actors.kill`: an abnormal exit), so its supervisor restarts it
    (a new process or connection)."""

    def __init__(self, server: MCPServer, link: Link, lister: bool = True) -> None:
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
        self._thread.join(8.0)
        self._unpublish()

    # --- the connection's own thread ---------------------------------------------------------

    def _main(self) -> None:
        reason = "the connection ended"
        try:
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
            tasks.start_soon(_relay, read, relay_send, ended, wake)
            async def on_log(params: types.LoggingMessageNotificationParams) -> None:
                relay_log(self._link.lock, self._link.listeners, server.name, params)

            session = await stack.enter_async_context(
                ClientSession(relay_receive, write, message_handler=on_message, logging_callback=on_log)
            )
            with anyio.fail_after(server.connect_timeout_s):
                initialized = await session.initialize()
                tools = await _list_tools(session, server) if self._lister else {}
            with self._link.lock:
                self._link.connections += 1
                self._link.server_info = shown_info(initialized.server_info.model_dump(mode="json", exclude_none=True))
            aloop = asyncio.get_running_loop()
            self._link.renew = lambda: aloop.call_soon_threadsafe(renew_now)
            self._publish(session, tools)
            listed_at, wait_s = time.monotonic(), RELIST_MIN_S
            try:
                while True:
                    # a list_changed flood relists ever more rarely (the host's CPU: relisting_wait)
                    early = listed_at + wait_s - time.monotonic()
                    try:
                        await asyncio.wait_for(wake.wait(), max(0.0, early) if relist.is_set()
                                               else server.ping_interval_s)
                    except TimeoutError:
                        if not relist.is_set():
                            with anyio.fail_after(server.connect_timeout_s):
                                await session.send_ping()
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
                            tools = await _list_tools(session, server)
                        flooded = bool(changed_at) and changed_at[0] < listed_at + wait_s
                        wait_s = relisting_wait(wait_s, time.monotonic() - began, flooded)
                        listed_at = time.monotonic()
                        if tools != self._link.tools:  # an unchanged listing costs the offer nothing
                            self._publish(session, tools)
            finally:
                tasks.cancel_scope.cancel()

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


async def _relay(read: Any, send: Any, ended: asyncio.Event, wake: asyncio.Event) -> None:
    """Forward the transport's messages to the session; set ``ended`` when it closes."""
    try:
        async with send:
            async for item in read:
                await send.send(item)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
        pass
    finally:
        ended.set()
        wake.set()


async def _list_tools(session: ClientSession, server: MCPServer) -> dict[str, dict[str, Any]]:
    """The server's tools (every page, at most :data:`_MAX_PAGES`), bounded: once
    ``server.max_tools`` tools or :data:`MAX_LISTED_BYTES` of declarations (as JSON)
    are kept, the rest of the listing is left out, logged once per server."""
    max_tools, max_bytes = server.max_tools, MAX_LISTED_BYTES
    tools: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    size = 0
    for _ in range(_MAX_PAGES):
        result = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        for tool in result.tools:
            declared = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
            size += len(json.dumps(declared))
            if len(tools) >= max_tools or size > max_bytes:
                if not server.listing_cut:
                    server.listing_cut = True
                    logger.warning("MCP server {} lists more than {} tools or {:,} bytes of declarations; the {} "
                                   "tools listed first are kept, the rest left out", server.name, max_tools,
                                   max_bytes, len(tools))
                return tools
            tools[tool.name] = declared
        cursor = result.next_cursor
        if not cursor:
            break
    return tools
