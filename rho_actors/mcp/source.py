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
- The protocol era is settled as the SDK's ``Client(mode="auto")`` does (``mode``):
  2026-07-28 with a server that answers ``server/discover``, else the ``initialize``
  handshake (:mod:`rho_actors.mcp.connection`). At 2026-07-28 a call answered
  ``input_required`` has its questions asked of the call's own MCP client and is sent
  again with the answers, within its one deadline.
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
- A ``url`` reaching this host (loopback however spelled, one of its own addresses, a
  name resolving to one: :func:`~rho_actors.mcp.peers.local_hosts`) is pinned to its owner: before each connection, the
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
import functools
import json
import os
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import mcp_types as types
import pykka
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from rho_actors.declarations.annotations import HINTS
from rho_actors.declarations.policy import parse_rate
from rho_actors.encoding import describe_exception
from rho_actors.mcp.bounds import RELIST_MIN_S, route_sdk_logging, shown_text
from rho_actors.mcp.client_requests import ClientRequestError, client_of
from rho_actors.mcp.connection import MAX_LISTED_BYTES, Link, MCPConnection
from rho_actors.mcp.content import rho_value
from rho_actors.mcp.launch import ENV_ALLOWLIST, find_program, scrubbed_environment
from rho_actors.mcp.names import default_name
from rho_actors.mcp.relay import listen
from rho_actors.mcp.sessions import SessionGone, session_unknown
from rho_actors.mcp.upstream_tasks import MAX_INPUT_ROUNDS, CreatedTask, TaskFollowing
from rho_actors.mcp.upstream_tasks import tool_failure as _fails
from rho_actors.otp.actor import NORMAL, monitor
from rho_actors.otp.supervisor import ChildSpec, StartChild
from rho_actors.results import SENT_CANCEL, called_as, text
from rho_actors.tool import DEFAULT_TIMEOUT_MS, ToolFailure

__all__ = [
    "ENV_ALLOWLIST", "MAX_INPUT_ROUNDS", "MAX_LISTED_BYTES", "MAX_TOOLS", "RELIST_MIN_S", "Link", "MCPConnection",
    "MCPServer", "MCPTool", "default_name", "scrubbed_environment",
]

MAX_TOOLS = 4096
_RAW: Any = TypeAdapter(dict[str, Any])  # a result as JSON (the SDK's parameter is typed for models)
_CALL_RESULT: TypeAdapter[types.CallToolResult | types.InputRequiredResult] = TypeAdapter(
    types.CallToolResult | types.InputRequiredResult)
"""The tools kept of one server's listing at most (``MCPServer(max_tools=...)``); the rest are left out, logged."""
_SOURCES = "sources"  # the system's supervisor of sources and their own subtrees


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

    def background(self) -> Any:
        """``"optional"`` when the server advertised the tasks extension (SEP-2663) and the
        tool does not forbid tasks (``execution.taskSupport``): a caller may run its calls
        as rho tasks, so a served client's task follows the server's own (its status, its
        questions, its cancel, its result); else ``False``."""
        execution = self._declared.get("execution")
        forbidden = isinstance(execution, dict) and execution.get("taskSupport") == "forbidden"
        return "optional" if self._server.supports_tasks and not forbidden else False

    def run(self, args: dict[str, Any], ctx: Mapping[str, Any]) -> Any:
        """Send ``tools/call`` and wait for its result, at most until ``ctx["deadline"]``."""
        return self.run_as(None, args, ctx)

    def run_as(self, called: str | None, args: dict[str, Any], ctx: Mapping[str, Any]) -> Any:
        """:meth:`run` for a client that called this tool ``called`` (a gateway's
        namespaced name; ``None``: its own), which its error texts name."""
        return self._server.call(str(self._declared.get("name")), args, ctx, idempotent=self.idempotent(),
                                 called=called)

    def __repr__(self) -> str:
        return f"<MCPTool {self._declared.get('name')!r} of {self._server.name}>"


class MCPServer(TaskFollowing):
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
    ``server_uid``: the uid that must own the listening socket of a ``url`` reaching this host
    (default ``os.getuid()``; module doc). ``max_tools``: the tools kept of its listing
    at most (and :data:`MAX_LISTED_BYTES` of declarations); the rest are left out, logged.
    ``rate`` (``"10/s"``, ``"600/min"``...): one token bucket for all the server's tools
    (DESIGN §4 "The governor"); ``idempotent_hints=True``: the host trusts the server's
    ``idempotentHint`` annotations, and a tool so annotated is retried as an idempotent
    tool is. ``mode``: the protocol era, as the SDK's ``Client(mode=...)``: ``"auto"``
    (``server/discover`` at 2026-07-28, the ``initialize`` handshake with a server that
    does not answer it), ``"legacy"`` (the handshake) or ``"2026-07-28"``.

    Raises ``ValueError`` for neither or both of ``command`` and ``url``, an empty
    ``command``, a bad ``rate`` or an unknown ``mode``.
    """

    contained = True  # tools stand for code elsewhere: registered trusted (see rho_actors.sources)
    revive = "remove the source and add it again (SourceHandle.close(), then ActorSystem.add_source())"
    """What starts a given-up server afresh, as its tools' ``mcp_given_up`` text says."""

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
        mode: str = "auto",
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
        if mode not in ("auto", "legacy", *MODERN_PROTOCOL_VERSIONS):
            raise ValueError(f"mode must be 'auto', 'legacy' or one of {', '.join(MODERN_PROTOCOL_VERSIONS)}, "
                             f"got {mode!r}")
        self.mode = mode
        self.listing_cut = False  # whether a listing went over the bounds (logged once)
        self._link = Link()
        route_sdk_logging()  # the SDK's own log records: into loguru, escaped, never raw onto stderr
        self._tools: dict[str, tuple[str, MCPTool]] = {}  # name -> (version, tool): the same object while unchanged
        self._last_offered: set[str] = set()  # the names of its last offer that had tools (withdrawn() names)
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
        live connection; ``{}`` while it is down. Once it is given up, the tools it
        withdrew while it restarted are refused as given up from then on (:meth:`withdrawn`)."""
        with self._link.lock:
            listed, given_up = dict(self._link.tools), self._link.given_up
        if given_up is not None and self._system is not None and self._last_offered:
            for name in sorted(self._last_offered):  # in the source actor's thread
                reason = self.withdrawn(name)
                if reason is not None:  # only a name withdrawn and not registered again gets it
                    self._system.set_removed_reason(name, reason)
            self._last_offered = set()
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
        if found:
            self._last_offered = set(found)
        return found

    def withdrawn(self, key: str) -> str | None:
        """The text a call of tool ``key`` gets once this source withdrew it (the source
        protocol's option): ``mcp_given_up`` (why, its last error, :attr:`revive`) past its
        restart intensity, ``mcp_not_connected`` while it restarts, ``None`` once it is
        being removed (:data:`rho_actors.results.TEXTS`)."""
        link = self._link
        with link.lock:
            stopping, given_up, error = link.stopping, link.given_up, link.last_error
        if stopping:
            return None
        if given_up is None:
            return text("mcp_not_connected", tool=called_as(key), server=self.name)
        return text("mcp_given_up", tool=called_as(key), server=self.name, max_restarts=self.max_restarts,
                    max_seconds=self.max_seconds, error=shown_text(error or given_up, 2000), remedy=self.revive)

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
        """The server's ``serverInfo`` of its last connection (``name``,
        ``version``...; ``None`` before it connected): what it says of itself, shown,
        never its source name (:mod:`rho_actors.mcp.names`)."""
        return copy.deepcopy(self._link.server_info)

    @property
    def protocol_version(self) -> str | None:
        """The protocol version of the last connection (``"2026-07-28"`` with a server
        that answers ``server/discover``, a handshake-era one such as ``"2025-11-25"``
        otherwise; ``None`` before it connected)."""
        return self._link.protocol_version

    @property
    def supports_tasks(self) -> bool:
        """Whether the server's last connection advertised the tasks extension (SEP-2663)."""
        return self._link.tasks

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

    def call(self, name: str, args: dict[str, Any], ctx: Mapping[str, Any], *, idempotent: bool = False,
             called: str | None = None) -> Any:
        """Send ``tools/call`` for ``name`` over the call's connection (:meth:`call_link`; from a
        call's thread); its content as rho values, or :class:`ToolFailure`, whose text names
        the tool as the client ``called`` it (default ``name``) and ``name`` when they differ
        (:func:`rho_actors.results.called_as`). A server that no
        longer knows the session (restarted) gets a new connection at once, and the call
        again on it (once) when ``idempotent`` (the tool's declared idempotence,
        :meth:`MCPTool.idempotent`: its hint only where trusted), else ``mcp_session_gone``."""
        label = called_as(called or name, name, self.name)
        with self.call_link(label, ctx) as link:
            try:
                return self._call_on(link, name, args, ctx, label)
            except SessionGone as gone:
                if not idempotent:
                    raise _fails("mcp_session_gone", label, server=self.name) from None
                old, left = gone.session, float(ctx.get("deadline", 0.0)) - time.monotonic()
                with link.changed:
                    if not link.changed.wait_for(lambda: link.session not in (None, old), max(0.0, left)):
                        raise _fails("mcp_not_connected", label, server=self.name) from None
        return self.call(name, args, ctx, idempotent=False, called=called)

    def call_link(self, tool: str, ctx: Mapping[str, Any]) -> contextlib.AbstractContextManager[Link]:
        """The connection a call of ``tool`` (its label in texts) in ``ctx`` goes to, held while it runs: this
        server's one connection. :class:`rho_actors.mcp.gateway.Upstream` overrides it (an
        untrusted server's process of the call's session). Raises :class:`ToolFailure`."""
        return contextlib.nullcontext(self._link)

    def _call_on(self, link: Link, name: str, args: dict[str, Any], ctx: Mapping[str, Any], label: str) -> Any:
        """``tools/call`` on ``link``'s session. A 2026-07-28 server that answers
        ``input_required`` (SEP-2322) gets its questions asked of the call's own MCP
        client (:func:`rho_actors.mcp.client_of`), and the call again with the answers
        and its ``requestState``, at most :data:`MAX_INPUT_ROUNDS` rounds, all within
        the call's one deadline."""
        deadline = float(ctx.get("deadline", time.monotonic() + self.timeout_ms / 1000))
        answers: dict[str, Any] | None = None
        state: str | None = None
        pause = 0.05  # a round that asks nothing (requestState only): polled with backoff, as the SDK does
        for _ in range(MAX_INPUT_ROUNDS + 1):
            result = self._round(link, label, types.CallToolRequestParams(
                name=name, arguments=args, input_responses=answers, request_state=state), ctx, deadline)
            if isinstance(result, types.CallToolResult):
                return rho_value(result)
            if isinstance(result, CreatedTask):
                return self._follow(link, label, result, ctx, deadline)
            state = result.request_state
            if not result.input_requests:
                answers = None
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, 0.25)
                continue
            answers = self._answers(label, result.input_requests, ctx)
        raise _fails("mcp_input_unanswered", label, server=self.name,
                     reason=f"it asked for input more than {MAX_INPUT_ROUNDS} rounds")

    def _answers(self, label: str, asked: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
        """The call's MCP client's answers to a server's questions (its ``inputRequests``,
        under the server's keys), or :class:`ToolFailure`. A served 2026-07-28 call that
        has no answer yet ends here, and its client gets these questions in an
        ``input_required`` result of rho's own (:mod:`rho_actors.mcp.client_requests`)."""
        client = client_of(ctx)
        if client is None:
            raise _fails("mcp_input_unanswered", label, server=self.name,
                         reason="it asked for the client's input, and this call was not made by an MCP client")
        try:
            return client.ask(asked)
        except ClientRequestError as err:
            raise _fails("mcp_input_unanswered", label, server=self.name, reason=shown_text(str(err), 500)) from None

    def _round(self, link: Link, label: str, params: types.CallToolRequestParams, ctx: Mapping[str, Any],
               deadline: float) -> types.CallToolResult | types.InputRequiredResult | CreatedTask:
        """One ``tools/call``; a task the server made of it (SEP-2663) as :class:`CreatedTask`."""
        kept = functools.partial(self._cancel_late, link, label) if link.tasks else None  # a task made late
        raw = self._send(link, label, types.CallToolRequest(params=params), ctx, deadline, kept)
        if raw.get("resultType") == "task":
            return self._created(link, label, raw)
        try:
            return _CALL_RESULT.validate_python(raw)
        except ValidationError as err:
            raise _fails("mcp_malformed", label, server=self.name, what="a tools/call result",
                         problem=shown_text(str(err.errors(include_url=False)[0]), 300)) from None

    def _send(self, link: Link, label: str, request: Any, ctx: Mapping[str, Any], deadline: float,
              kept: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Send ``request`` for a call of tool ``label`` and wait for its result (a dict), at
        most until ``deadline``; a failure as :class:`ToolFailure` (or :class:`SessionGone`).
        ``kept``: a cancel sends ``notifications/cancelled`` at once but keeps listening (a
        task the server made before it read the cancel is not lost): the call's result is
        ``cancelled`` at once, and the answer, if it comes within ``connect_timeout_s``,
        goes to ``kept``."""
        with link.lock:
            session, aloop = link.session, link.aloop
        if session is None or aloop is None:
            raise _fails("mcp_not_connected", label, server=self.name)
        left = max(0.001, deadline - time.monotonic())
        report = ctx.get("progress")

        async def forward(progress: float, total: float | None, message: str | None) -> None:
            if callable(report):
                report(progress, total, message)

        # sent as a bare request: the SDK's own result check (its jsonschema, Python's re on
        # the server's patterns) never runs here; rho's bounded validator checks it (mcp serve)
        sending: Any = session.send_request(request, _RAW, request_read_timeout_seconds=left,
                                            progress_callback=forward)
        ids: concurrent.futures.Future[int | None] = concurrent.futures.Future()  # the request's id, kept ones'
        if kept is not None:
            sending = _with_id(session, sending, ids)
        heard = listen(link.lock, link.listeners, client_of(ctx))  # its log messages: to a served call, from now
        try:
            future = asyncio.run_coroutine_threadsafe(sending, aloop)
        except RuntimeError:  # the loop closed in between
            heard()
            sending.close()
            raise _fails("mcp_not_connected", label, server=self.name) from None
        future.add_done_callback(heard)
        cancel = ctx.get("cancel")
        with _on_cancel(cancel, future, kept is not None) as stop:
            try:
                if stop is not None:
                    concurrent.futures.wait((future, stop), left + 5.0, concurrent.futures.FIRST_COMPLETED)
                    if not future.done() and stop.done():
                        self._keep(future, aloop, kept)  # type: ignore[arg-type]
                        _tell_cancelled(session, aloop, ids, getattr(cancel, "reason", None) or "cancelled")
                        raise concurrent.futures.CancelledError
                return dict(future.result(timeout=0.0 if stop is not None else left + 5.0))
            except ValidationError as err:  # the SDK's own check of a result
                raise _fails("mcp_malformed", label, server=self.name, what=f"a {request.method} result",
                             problem=shown_text(str(err.errors(include_url=False)[0]), 300)) from None
            except concurrent.futures.CancelledError:
                reason = getattr(cancel, "reason", None) or "cancelled"
                if reason == "timeout":  # the deadline: the same result whichever thread answers first
                    raise self._timed_out(label) from None
                raise _fails("cancelled", label, reason=reason) from None
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise self._timed_out(label) from None
            except MCPError as err:
                if err.code == REQUEST_TIMEOUT:
                    raise self._timed_out(label) from None
                if session_unknown(err):  # the connection is replaced (its end logged): a new session
                    if callable(link.renew) and link.session is session:
                        link.renew()
                    raise SessionGone(session) from None
                raise _failure(self.name, label, err, link.stopping) from None

    def _keep(self, future: concurrent.futures.Future[Any], aloop: asyncio.AbstractEventLoop,
              kept: Callable[[dict[str, Any]], None]) -> None:
        """A cancelled request's answer goes to ``kept`` when it comes; abandoned (the
        server sent ``notifications/cancelled``) ``connect_timeout_s`` from now."""
        def landed(done: concurrent.futures.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                kept(dict(done.result()))

        future.add_done_callback(landed)
        with contextlib.suppress(RuntimeError):  # the loop closed: the request ended with it
            aloop.call_soon_threadsafe(aloop.call_later, self.connect_timeout_s, future.cancel)

    def _timed_out(self, tool: str) -> ToolFailure:
        return _fails("timeout", tool, timeout_ms=self.timeout_ms, consequence=SENT_CANCEL)

    def __repr__(self) -> str:
        where = f"command={shlex.join(self.command)!r}" if self.command is not None else f"url={self.url!r}"
        return f"MCPServer({where}, name={self.name!r})"


def _with_id(session: Any, sending: Any, ids: concurrent.futures.Future[int | None]) -> Any:
    """``sending`` (``session.send_request``'s coroutine), its request id set in ``ids``:
    read on the session's loop right before the send, which mints it with nothing run in
    between (the SDK's JSON-RPC dispatcher; another: None)."""
    async def send() -> Any:
        dispatcher = getattr(session, "_dispatcher", None)
        if isinstance(dispatcher, JSONRPCDispatcher):
            minted = dispatcher._next_id + 1
            while minted in dispatcher._pending:  # as the dispatcher mints: past ids in flight
                minted += 1
            ids.set_result(minted)
        else:
            ids.set_result(None)
        return await sending

    return send()


def _tell_cancelled(session: Any, aloop: asyncio.AbstractEventLoop, ids: concurrent.futures.Future[int | None],
                    reason: str) -> None:
    """Send ``notifications/cancelled`` for the kept request whose id is in ``ids`` (after
    the request: on the same loop, scheduled after it), its response stream kept."""
    async def tell() -> None:
        request_id = ids.result() if ids.done() else None
        if request_id is not None:
            await session.send_notification(types.CancelledNotification(
                params=types.CancelledNotificationParams(request_id=request_id, reason=reason)))

    with contextlib.suppress(RuntimeError):  # the loop closed: the request ended with it
        asyncio.run_coroutine_threadsafe(tell(), aloop)


@contextlib.contextmanager
def _on_cancel(cancel: Any, future: concurrent.futures.Future[Any], keep: bool
               ) -> Iterator[concurrent.futures.Future[None] | None]:
    """While a request is under way: what ``cancel`` (a call's token, or None) does to its
    ``future``: abandons it (the SDK sends ``notifications/cancelled``), or, ``keep``, sets
    the future yielded. The hook is taken off the token once the request is over (a call's
    token outlives each of its requests: a task followed for its whole deadline polls
    thousands of times, and each hook kept would keep its answer)."""
    if cancel is None:
        yield None
        return
    stop: concurrent.futures.Future[None] | None = None
    hook: Callable[[], object] = future.cancel
    if keep:
        stop = concurrent.futures.Future()
        hook = functools.partial(stop.set_result, None)  # a token's callbacks run once
    cancel.add_inline_callback(hook)
    try:
        yield stop
    finally:
        cancel.remove_callback(hook)


def _failure(server: str, tool: str, err: MCPError, stopping: bool) -> ToolFailure:
    if err.code == CONNECTION_CLOSED:
        return _fails("mcp_stopped" if stopping else "mcp_crashed", tool, server=server)
    return _fails("mcp_refused", tool, server=server, code=err.code, message=shown_text(err.error.message, 2000))
