"""The gate of ``mcp serve --http``: a bearer token, caps on sessions, and who is still
there (an ASGI middleware in front of the SDK's streamable HTTP app).

- Every HTTP request needs ``Authorization: Bearer <token>`` (compared in constant
  time); any other is answered ``401`` (with ``WWW-Authenticate: Bearer``) before the
  SDK sees it, so no session is made for it. ``auth=False`` turns this off, only on a
  loopback address, with a warning logged at start (for local conformance suites).
- A request that would open a session (a ``POST`` without ``Mcp-Session-Id``) is
  refused ``429`` while its client holds ``max_sessions_per_client`` sessions; the SDK
  refuses ``503`` past ``max_sessions`` in all, and closes a session that had no
  request in flight for ``idle_timeout_s``. A client is its uid when it is local (from
  the kernel's socket table, which has a local peer's socket: every loopback client is
  127.0.0.1, and every local one connecting through one of this host's own addresses
  is that address), else its address; asked
  once per connection when served by :func:`connection_protocol` (a connection's peer
  cannot change: the answer is kept on that connection's own peer object, made when
  the socket is accepted and gone with it, never keyed by an address and port, which
  a later connection may reuse), else once per request.
- One client has at most ``max_connections_per_client`` HTTP connections open at once
  (counted from when a socket is accepted, before anything is read from it): one past
  it is answered ``503`` naming the bound and closed (served by
  :func:`connection_protocol`). A connection costs the server a descriptor before its
  request, and the token, is read: a client holding requests it never finishes
  (slowloris) would otherwise hold descriptors until no other client could connect.
- A request's headers must arrive whole within ``header_timeout_s`` and its body within
  ``body_timeout_s`` (:mod:`rho_actors.mcp.read_deadlines`): past either the connection
  is answered ``408`` and closed, so a connection is held at most that long by a client
  that sends slowly. What the server sends must be taken: when none of the bytes
  waiting for a client leaves within ``send_timeout_s`` the connection is closed
  (:mod:`rho_actors.mcp.send_deadline`), so a client that stops reading holds no
  request's task, connection or server stop for longer.
- One client has at most ``max_tasks_per_client`` MCP tasks open over all its sessions
  (:meth:`rho_actors.mcp.tasks.ServedTasks.admit`: a call past it is refused ``-32600``).
- A session is its client's: a request naming another client's ``Mcp-Session-Id`` is
  answered ``404`` (as an unknown one is); a request sending a header the guard or the
  SDK reads for whose session it is (``_SINGLE``) more than once is answered ``400``
  (the guard would check one value, the SDK route by the first); and the client is the principal a 2026-07-28
  session handle is bound to (:mod:`rho_actors.mcp.sessions`).
- A session's client is *present* while one of its HTTP requests is open and its
  connection not closed (the SDK client keeps a ``GET`` stream open between calls).
  When the last one closes, :meth:`HTTPGuard.absent_for` counts the seconds since;
  :mod:`rho_actors.mcp.serve` stops the rho session of a client absent for
  ``client_gone_s`` (its loop, threads, transcript descriptor; a client that comes back
  gets it again, resumed from its transcript) once it runs no call: a call whose
  request's connection closed runs on within its deadline (:func:`request_gone` tells
  when a request's connection closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any

import anyio
from loguru import logger

from rho_actors.mcp.peers import is_loopback, socket_uid
from rho_actors.mcp.plain_answers import answer_and_close
from rho_actors.mcp.read_deadlines import DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, ReadDeadlines
from rho_actors.mcp.send_deadline import DEFAULT_SEND_TIMEOUT_S, SendDeadline
from rho_actors.mcp.sessions import PRINCIPAL_KEY

__all__ = [
    "DEFAULT_CLIENT_GONE_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS_PER_CLIENT",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_SESSIONS_PER_CLIENT",
    "DEFAULT_MAX_TASKS_PER_CLIENT",
    "HTTPGuard",
    "connection_protocol",
    "request_gone",
]

DEFAULT_MAX_SESSIONS = 64
"""Sessions open at once over HTTP, all clients together."""
DEFAULT_MAX_SESSIONS_PER_CLIENT = 8
"""Sessions open at once per client (a uid for a local client, else an address)."""
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 128
"""HTTP connections open at once per client (a uid for a local client, else an address):
one past it is answered ``503`` and closed before anything is read from it."""
DEFAULT_MAX_TASKS_PER_CLIENT = 32
"""MCP tasks open at once per client, all its sessions together (a client past it is
refused ``-32600`` naming it; the system's ``max_tasks`` is shared by every client)."""
DEFAULT_IDLE_TIMEOUT_S = 300.0
"""Seconds a session may have no request in flight before the SDK closes it."""
DEFAULT_CLIENT_GONE_S = 5.0
"""Seconds after a session's last connection closed before its rho session is stopped."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

_GONE_KEY = "rho_actors.gone"
_SESSION_HEADER = b"mcp-session-id"
_SINGLE = frozenset({b"authorization", _SESSION_HEADER, b"mcp-protocol-version", b"last-event-id", b"host"})
"""Headers a request may send at most once: the guard or the SDK reads each of them to
know whose session (and which of its streams) a request is for."""


def request_gone(request: Any) -> anyio.Event | None:
    """The event set when the HTTP connection of ``request`` (a Starlette request, the
    MCP handler's ``ctx.request``) closes; None outside :class:`HTTPGuard`."""
    scope = getattr(request, "scope", None)
    event = scope.get(_GONE_KEY) if isinstance(scope, dict) else None
    return event if isinstance(event, anyio.Event) else None


class HTTPGuard:
    """The settings and the live state of one HTTP endpoint (see the module doc); give
    it to :func:`rho_actors.mcp.aserve` as ``guard=``.

    ``token``: the bearer token clients send (at least 16 characters; make one with
    ``secrets.token_hex(32)``). ``auth=False`` serves without one (``token`` then
    None), for a loopback address only. ``max_sessions``, ``max_sessions_per_client``,
    ``idle_timeout_s`` and ``client_gone_s`` (seconds) as the module doc says;
    ``max_tasks_per_client``: the MCP tasks one client may have open at once;
    ``max_connections_per_client``: its HTTP connections open at once;
    ``header_timeout_s`` and ``body_timeout_s``: the seconds a request's headers, then its
    body, may take to arrive; ``send_timeout_s``: the seconds the bytes waiting for a
    client may wait with none of them taken (these four enforced by
    :func:`connection_protocol` made with this guard).
    Raises ``ValueError`` for a missing or short token, or a bound not more than 0.
    """

    def __init__(self, token: str | None = None, *, auth: bool = True, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 client_gone_s: float = DEFAULT_CLIENT_GONE_S,
                 max_tasks_per_client: int = DEFAULT_MAX_TASKS_PER_CLIENT,
                 max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
                 send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> None:
        if auth and (not isinstance(token, str) or len(token) < 16):
            raise ValueError("HTTP serving needs token=... of at least 16 characters "
                             "(secrets.token_hex(32)), or auth=False on a loopback address")
        for name, value in (("max_sessions", max_sessions), ("max_sessions_per_client", max_sessions_per_client),
                            ("idle_timeout_s", idle_timeout_s), ("client_gone_s", client_gone_s),
                            ("max_tasks_per_client", max_tasks_per_client),
                            ("max_connections_per_client", max_connections_per_client),
                            ("header_timeout_s", header_timeout_s), ("body_timeout_s", body_timeout_s),
                            ("send_timeout_s", send_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be more than 0, got {value!r}")
        self.token = token if auth else None
        self.auth = auth
        self.max_sessions = max_sessions
        self.max_sessions_per_client = max_sessions_per_client
        self.idle_timeout_s = idle_timeout_s
        self.client_gone_s = client_gone_s
        self.max_tasks_per_client = max_tasks_per_client
        self.max_connections_per_client = max_connections_per_client
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.send_timeout_s = send_timeout_s
        self._connections: dict[str, int] = {}  # client -> its HTTP connections open now
        self.refused_connections = 0  # connections closed past a client's share
        self._expected = f"Bearer {token}".encode() if auth and token else b""
        self._owner: dict[str, str] = {}  # SDK session id -> client
        self._opening: dict[str, int] = {}  # client -> requests that may open a session, in flight
        self._present: dict[str, int] = {}  # SDK session id -> open requests whose connection is up
        self._absent_since: dict[str, float] = {}  # SDK session id -> monotonic time its last one closed
        self.refused_unauthenticated = 0
        self.refused_at_cap = 0
        self.refused_foreign = 0  # requests naming another client's session
        self.reaped = 0  # rho sessions stopped because their client was gone
        self.rho_sessions: Callable[[], int] = lambda: 0  # set by serve: rho sessions open now

    def check_host(self, host: str) -> None:
        """Raise ``ValueError`` when auth is off and ``host`` is no loopback address; log
        a warning when it is off."""
        if self.auth:
            return
        if not is_loopback(host):
            raise ValueError(f"auth=False is only allowed on a loopback address, not {host!r}")
        logger.warning("MCP over HTTP at {} WITHOUT AUTHENTICATION: any local process can call the tools "
                       "(auth=False is for loopback testing only)", host)

    # --- what serve asks ---------------------------------------------------------------

    def absent_for(self, session_id: str | None) -> float:
        """Seconds since the last open request of SDK session ``session_id`` closed (0 while
        one is open, or for a session this guard does not know)."""
        since = self._absent_since.get(session_id or "")
        return 0.0 if since is None or self._present.get(session_id or "", 0) else time.monotonic() - since

    def ended(self, session_id: str | None) -> None:
        """Forget SDK session ``session_id`` (it has ended): its place is its client's again."""
        if session_id:
            self._owner.pop(session_id, None)
            self._present.pop(session_id, None)
            self._absent_since.pop(session_id, None)

    def stats(self) -> dict[str, Any]:
        """``{"auth": bool, "sessions": int, "max_sessions": int, "clients": {client:
        sessions}, "max_sessions_per_client": int, "rho_sessions": int, "idle_timeout_s":
        float, "client_gone_s": float, "refused_unauthenticated": int, "refused_at_cap":
        int, "refused_foreign": int, "reaped": int, "connections": {client: connections},
        "max_connections_per_client": int, "refused_connections": int, "header_timeout_s":
        float, "body_timeout_s": float, "send_timeout_s": float}``: open SDK
        sessions (by client), rho sessions and HTTP connections now, the caps, and what
        was refused or reaped so far."""
        clients: dict[str, int] = {}
        for client in self._owner.values():
            clients[client] = clients.get(client, 0) + 1
        return {"auth": self.auth, "sessions": len(self._owner), "max_sessions": self.max_sessions,
                "clients": clients, "max_sessions_per_client": self.max_sessions_per_client,
                "rho_sessions": self.rho_sessions(), "idle_timeout_s": self.idle_timeout_s,
                "client_gone_s": self.client_gone_s, "refused_unauthenticated": self.refused_unauthenticated,
                "refused_at_cap": self.refused_at_cap, "refused_foreign": self.refused_foreign,
                "reaped": self.reaped, "connections": dict(self._connections),
                "max_connections_per_client": self.max_connections_per_client,
                "refused_connections": self.refused_connections, "header_timeout_s": self.header_timeout_s,
                "body_timeout_s": self.body_timeout_s, "send_timeout_s": self.send_timeout_s}

    def connected(self, client: str) -> bool:
        """A connection of ``client`` was accepted: whether it is within the client's
        share (then counted until :meth:`disconnected`; else counted refused). In the
        serving event loop's thread only."""
        held = self._connections.get(client, 0)
        if held >= self.max_connections_per_client:
            self.refused_connections += 1
            return False
        self._connections[client] = held + 1
        return True

    def disconnected(self, client: str) -> None:
        """A connection :meth:`connected` counted has closed."""
        held = self._connections.get(client, 0) - 1
        if held > 0:
            self._connections[client] = held
        else:
            self._connections.pop(client, None)

    # --- the middleware ------------------------------------------------------------------

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` behind this guard (an ASGI app; lifespan messages pass through)."""

        async def guarded(scope: Scope, receive: Callable[[], Awaitable[Message]],
                          send: Callable[[Message], Awaitable[None]]) -> None:
            if scope.get("type") != "http":
                await app(scope, receive, send)
                return
            pairs = scope.get("headers") or []
            headers = dict(pairs)
            if self.auth and not secrets.compare_digest(headers.get(b"authorization", b""), self._expected):
                self.refused_unauthenticated += 1
                await _answer(send, 401, "Unauthorized: send Authorization: Bearer <token>",
                              [(b"www-authenticate", b'Bearer realm="rho-actors"')])
                return
            named = [name for name, _ in pairs if name in _SINGLE]
            repeated = sorted({name.decode("latin-1") for name in named if named.count(name) > 1})
            if repeated:  # the guard reads one value, the SDK (Starlette) the first: both must see the same
                await _answer(send, 400, f"Bad Request: header {', '.join(repeated)} sent more than once", [])
                return
            session_id = headers.get(_SESSION_HEADER, b"").decode("latin-1") or None
            principal = scope[PRINCIPAL_KEY] = _client(scope)  # a 2026-07-28 session's owner too
            owner = self._owner.get(session_id or "")
            if owner is not None and not secrets.compare_digest(owner, principal):
                self.refused_foreign += 1
                logger.warning("MCP over HTTP: refused {}: it named a session of another client", principal)
                await _answer(send, 404, "Not Found: no such session for this client", [])
                return
            client = None
            if session_id is None and scope.get("method") == "POST":
                client = principal
                held = sum(1 for c in self._owner.values() if c == client) + self._opening.get(client, 0)
                if held >= self.max_sessions_per_client:
                    self.refused_at_cap += 1
                    logger.warning("MCP over HTTP: refused a new session of {}: it holds {} (at most {})",
                                   client, held, self.max_sessions_per_client)
                    await _answer(send, 429, f"Too many sessions: at most {self.max_sessions_per_client} "
                                             "per client are open at once", [(b"retry-after", b"5")])
                    return
                self._opening[client] = self._opening.get(client, 0) + 1
            await self._serve(app, scope, receive, send, session_id, client)

        return guarded

    async def _serve(self, app: ASGIApp, scope: Scope, receive: Callable[[], Awaitable[Message]],
                     send: Callable[[Message], Awaitable[None]], session_id: str | None, client: str | None) -> None:
        gone = anyio.Event()
        scope[_GONE_KEY] = gone
        held = [session_id] if session_id in self._owner else []
        if held:
            self._arrive(held[0])
        opening = [client] if client is not None else []  # this request's place among its client's opening ones

        def opened_or_done() -> None:
            if opening:
                who = opening.pop()
                self._opening[who] -= 1
                if not self._opening[who]:
                    del self._opening[who]

        def leave() -> None:
            if not gone.is_set():
                gone.set()
                if held:
                    self._leave(held[0])

        async def watched_receive() -> Message:
            message = await receive()
            if message.get("type") == "http.disconnect":
                leave()
            return message

        async def watched_send(message: Message) -> None:
            if client is not None and message.get("type") == "http.response.start" and message.get("status", 500) < 400:
                opened = dict(message.get("headers") or []).get(_SESSION_HEADER, b"").decode("latin-1")
                if opened and opened not in self._owner:
                    self._owner[opened] = client  # the place moves from opening to the session
                    opened_or_done()
                    held.append(opened)
                    self._arrive(opened)
            await send(message)

        try:
            await app(scope, watched_receive, watched_send)
        finally:
            leave()
            opened_or_done()

    def _arrive(self, session_id: str) -> None:
        self._present[session_id] = self._present.get(session_id, 0) + 1

    def _leave(self, session_id: str) -> None:
        if session_id not in self._owner:
            return
        left = self._present.get(session_id, 1) - 1
        self._present[session_id] = left
        if not left:
            self._absent_since[session_id] = time.monotonic()


class _Peer(tuple):  # type: ignore[type-arg]
    """A connection's peer ``(host, port)``, the ``client`` of each of its requests'
    scopes, made once per accepted socket (:func:`connection_protocol`): the client it
    is, once the kernel named its uid, is kept on it (``principal``), so the answer
    lives and dies with that one connection."""

    principal: str | None = None


def connection_protocol(guard: HTTPGuard | None = None) -> type[asyncio.Protocol]:
    """The uvicorn HTTP protocol (h11) whose connections each give their requests one
    :class:`_Peer` as ``scope["client"]``, so :class:`HTTPGuard` asks the kernel for a
    loopback peer's uid once per connection (``uvicorn.Config(http=...)``). With
    ``guard``, the client is asked when its socket is accepted and each connection is
    counted in its share (:meth:`HTTPGuard.connected`): one past it is answered ``503``
    and closed before anything is read from it. Each connection's request is read within
    the guard's ``header_timeout_s`` and ``body_timeout_s`` (without a guard, the
    defaults): :class:`~rho_actors.mcp.read_deadlines.ReadDeadlines`; what it sends must
    be taken within ``send_timeout_s``: :class:`~rho_actors.mcp.send_deadline.SendDeadline`."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    timeouts = ((guard.header_timeout_s, guard.body_timeout_s) if guard is not None
                else (DEFAULT_HEADER_TIMEOUT_S, DEFAULT_BODY_TIMEOUT_S))
    send_timeout_s = guard.send_timeout_s if guard is not None else DEFAULT_SEND_TIMEOUT_S

    class PeerKeeping(H11Protocol):
        counted: str | None = None  # the client whose share this connection is counted in
        deadlines: ReadDeadlines | None = None
        sending: SendDeadline | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.sending = SendDeadline(self, send_timeout_s)
            transport = self.sending.watch(transport)
            super().connection_made(transport)
            self.deadlines = ReadDeadlines(self, *timeouts)
            self.deadlines.check()
            if self.client is None:
                return
            self.client = peer = _Peer(self.client)
            if guard is None:
                return
            client = _looked_up({"client": peer, "server": self.server})
            if client.startswith("uid:"):  # a failed lookup is asked again at each request
                peer.principal = client
            if guard.connected(client):
                self.counted = client
                return
            answer_and_close(transport, HTTPStatus.SERVICE_UNAVAILABLE,
                             f"too many connections from this client: at most {guard.max_connections_per_client} "
                             "open at once (max_connections_per_client)")

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.deadlines is not None:
                self.deadlines.check()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.deadlines is not None:
                self.deadlines.check()

        def shutdown(self) -> None:
            super().shutdown()
            if self.sending is not None:  # the stop waits for untaken bytes only a little
                self.sending.stopping()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.deadlines is not None:
                self.deadlines.close()
            if self.sending is not None:
                self.sending.close()
            try:
                super().connection_lost(exc)
            finally:
                if guard is not None and self.counted is not None:
                    guard.disconnected(self.counted)
                    self.counted = None

    return PeerKeeping


def _client(scope: Scope) -> str:
    """``uid:N`` for a peer whose socket the kernel's table shows (a local one, whatever
    address it connected through), else ``ip:ADDRESS``; a uid found is kept on the
    connection's :class:`_Peer`."""
    peer = scope.get("client")
    if type(peer) is _Peer:
        if peer.principal is None:
            found = _looked_up(scope)
            if found.startswith("uid:"):  # a failed lookup is asked again at the next request
                peer.principal = found
            return found
        return peer.principal
    return _looked_up(scope)


def _looked_up(scope: Scope) -> str:
    """:func:`_client`, asked of the kernel: of every peer, not only a loopback one (a
    local user connecting through one of this host's own addresses is as local, and its
    address is every local user's); a remote peer's socket is not in the table."""
    peer, server = scope.get("client"), scope.get("server")
    if not peer:
        return "unknown"
    host = str(peer[0])
    if server:
        with contextlib.suppress(OSError, ValueError):
            uid = socket_uid((host, int(peer[1])), (str(server[0]), int(server[1])))
            if uid is not None:
                return f"uid:{uid}"
    return f"ip:{host}"


async def _answer(send: Callable[[Message], Awaitable[None]], status: int, message: str,
                  headers: list[tuple[bytes, bytes]]) -> None:
    """A JSON-RPC error body (``id`` null) with HTTP ``status``."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})
