"""The rho sessions of MCP clients, in both protocol eras, each bound to its principal.

- **Handshake era** (protocol 2025-11-25 and before): a connection (one stdio process,
  or one ``Mcp-Session-Id``) is a rho session, started at its first request and stopped
  when the connection ends; the HTTP guard refuses a request naming another
  principal's ``Mcp-Session-Id`` (:mod:`rho_actors.mcp.guard`).
- **2026-07-28** (no handshake, no ``Mcp-Session-Id``: every request stands alone): a
  session is an *explicit state handle* (SEP-2567). A request that names none starts a
  new session (over stdio: the process's one session, the process being the client),
  and every result says which one served it in ``_meta["rho-actors/session"]``; a
  request naming that handle in its own ``_meta`` runs in the same session: its folder,
  transcript, ordering and fair share. A handle is bound to the principal that created
  it: a request from another principal naming it is refused, with the same error as a
  handle this server does not know (a restart forgets them all).
- On the client side (a source's connection to an HTTP server), a server that answers
  it does not know the connection's session (it restarted) makes the connection be
  replaced at once (:func:`session_unknown`, :class:`SessionGone`).
- A principal is who the transport says the client is: over HTTP the guard's client
  (its uid when it is local, else its address) holding the bearer token; over stdio the
  process. A tool never sees a transport id or a handle: its session id is
  ``mcp-<32 random hex digits>``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import re
import secrets
import shlex
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from loguru import logger
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from rho_actors.agent.group_commit import GroupCommit
from rho_actors.agent.model import Reply
from rho_actors.agent.transcript import Transcript, TranscriptError
from rho_actors.files import open_regular
from rho_actors.isolation.thread import on_call_thread
from rho_actors.lifecycle import PendingCall
from rho_actors.loop.decisions import ApprovalError
from rho_actors.tool import ToolCall, ToolResult

__all__ = ["HELD_MARKER", "PRINCIPAL_KEY", "SESSION_ENDED", "SESSION_META_KEY", "CallRecord", "Session", "SessionGone",
           "call_id_of", "is_modern", "new_session_id", "principal_of", "session_handle", "session_unknown"]

SESSION_META_KEY = "rho-actors/session"
"""The ``_meta`` key of a 2026-07-28 request naming its session, and of a result saying it."""
PRINCIPAL_KEY = "rho_actors.principal"
"""The ASGI scope key under which :class:`~rho_actors.mcp.guard.HTTPGuard` puts the
request's principal."""
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # a request id kept as it is in its call's id (call_id_of)
_LOCAL = "local"  # the principal of a stdio process (and of HTTP served without a guard)
_HANDLE_CHARS = 128  # the longest handle a request may name
SESSION_ENDED = "the MCP session ended before the call was decided; call it again in a new session"
"""The rejection of a call still waiting for approval when its MCP session ends."""
_DECIDED_GRACE_S = 30.0  # past a held call's expiry, how long its request waits for the expiry's result
HELD_MARKER = "mcp-client"
"""The file in a served session's folder, holding its client's principal, from its first
call that may be held for a decision or runs as a task: its end (which rejects held calls)
removes it; one found by a server starting names a session a killed server left
(:mod:`rho_actors.mcp.held_sessions`)."""


def new_session_id() -> str:
    """A session id a tool may see: random, unrelated to any transport id or handle."""
    return f"mcp-{secrets.token_hex(16)}"


def call_id_of(request_id: Any, number: int) -> str:
    """The call id of a ``tools/call`` whose JSON-RPC id is ``request_id``, the server's
    ``number``-th: ``mcp-<id>-<number>``, the id as it came when it is an integer or up
    to 64 of ``[A-Za-z0-9_.:-]``, else ``h`` and the first 16 hex digits of its SHA-256.
    The client chooses its ids: one holding a newline or shell syntax would forge lines
    in the server's log and run in the ``rho-actors approve`` command logged for a held
    call (DESIGN §6b)."""
    plain = str(request_id)
    if not (type(request_id) is int or _PLAIN_ID.fullmatch(plain)):
        plain = "h" + hashlib.sha256(plain.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"mcp-{plain}-{number}"


def is_modern(ctx: Any) -> bool:
    """Whether the request ``ctx`` is of protocol 2026-07-28 or later (no handshake)."""
    return getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS


def principal_of(ctx: Any) -> str:
    """The principal of request ``ctx``: the guard's client over HTTP, else the process."""
    scope = getattr(getattr(ctx, "request", None), "scope", None)
    found = scope.get(PRINCIPAL_KEY) if isinstance(scope, dict) else None
    return found if isinstance(found, str) else _LOCAL


def session_handle(ctx: Any) -> str | None:
    """The handle request ``ctx`` names in ``_meta["rho-actors/session"]``, or None.
    Raises ``MCPError`` (invalid params) for one that is not a short string."""
    params = getattr(ctx, "params", None)
    meta = params.get("_meta") if isinstance(params, dict) else None
    handle = meta.get(SESSION_META_KEY) if isinstance(meta, dict) else None
    if handle is None:
        return None
    if not isinstance(handle, str) or not 0 < len(handle) <= _HANDLE_CHARS:
        raise MCPError(INVALID_PARAMS, f"_meta[{SESSION_META_KEY!r}] must be a session handle "
                                       f"(a string of at most {_HANDLE_CHARS} characters)")
    return handle


def unknown_handle() -> MCPError:
    """The error for a handle this server does not know, or that is another principal's."""
    return MCPError(INVALID_PARAMS, f"unknown session handle in _meta[{SESSION_META_KEY!r}]: this server does not "
                                    "know it (it may have restarted) or it belongs to another client; call "
                                    "without one to start a new session")


class SessionGone(Exception):
    """A server answered a call that it does not know the connection's ``session`` (the
    SDK's client session the call was sent on)."""

    def __init__(self, session: Any) -> None:
        super().__init__("the server does not know this connection's session")
        self.session = session


def session_unknown(err: MCPError) -> bool:
    """Whether ``err`` says the server does not know the session: its HTTP ``404`` for a
    request naming an ``Mcp-Session-Id`` (the SDK server's "Session not found", the SDK
    client's "Session terminated", rho's guard's "no such session")."""
    message = str(err.error.message).lower()
    return err.code in (INVALID_REQUEST, -32001) and any(
        said in message for said in ("session not found", "session terminated", "no such session"))


@dataclass(slots=True, eq=False)
class Session:
    """One rho session of an MCP client: its loop, transcript (opened ``per_record``: the
    file's lock is taken for each record only) and the calls running."""

    loop: Any  # a rho_actors.loop.handle.Loop
    notify: Any = None  # a ServerSession of the connection: its standalone channel (handshake era)
    offered_version: int = -1
    transcript: Transcript | None = None  # the session's calls and results, as the agent loop records them
    steps: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    writing: threading.Lock = field(default_factory=threading.Lock)
    http_id: str | None = None  # the SDK's Mcp-Session-Id (None on stdio and for a handle)
    state: dict[str, Any] = field(default_factory=dict)  # the connection's state, which holds this session
    handle: str | None = None  # its explicit state handle (2026-07-28)
    principal: str = _LOCAL
    used: float = field(default_factory=time.monotonic)  # when a request last named it
    calls: int = 0  # tools/call requests running now
    closed: bool = False
    commits: GroupCommit | None = None  # synchronous_commit off: results synced by this group commit
    marked: bool = False  # its folder holds HELD_MARKER (it may hold a call for a decision)

    async def close(self, sessions: Any, state_key: str) -> None:
        """Stop the session's loop and close its transcript (idempotent); ``sessions``
        (a set) forgets it, and the connection state's ``state_key`` too. Its calls still
        waiting for approval are rejected first (:meth:`end_held`)."""
        if self.closed:
            return
        self.closed = True
        sessions.discard(self)
        if self.state.get(state_key) is self:
            del self.state[state_key]
        try:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.end_held)
                if self.marked:
                    await anyio.to_thread.run_sync(self.unmark)
                await anyio.to_thread.run_sync(self.loop.stop)
        finally:
            if self.transcript is not None:
                if self.commits is not None:
                    await anyio.to_thread.run_sync(self.commits.flush, self.transcript)
                self.transcript.close()

    def end_held(self) -> None:
        """Reject each call of this session that waits for approval (DESIGN §4
        "Approvals"), recorded as decided by ``rho-actors mcp serve`` with
        :data:`SESSION_ENDED`: no client can be answered once its session ended (its
        ``tools/call``, or its task, ends ``rejected``). A call being decided meanwhile is
        left to that decision. A server killed ends none: the next one takes them back
        (:mod:`rho_actors.mcp.held_sessions`)."""
        for pending in self.loop.pending():
            if pending.kind != "approval":
                continue
            try:
                self.loop.reject(pending.call_id, SESSION_ENDED, decided_by="rho-actors mcp serve")
            except (ApprovalError, OSError, ValueError) as exc:
                logger.info("MCP session {}: call {} not rejected at its end: {}", self.loop.session_id,
                            pending.call_id, exc)

    def mark(self, principal: str) -> None:
        """Before a call that may be held for a decision, or runs as a task: write
        :data:`HELD_MARKER` (naming ``principal``, its client) in the session's folder,
        once, so that a server started after this one is killed takes the session back.
        Logged when it fails."""
        if self.marked:
            return
        try:
            fd = open_regular(self.loop.data_dir / HELD_MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as marker:
                marker.write(principal)
            self.marked = True
        except OSError as exc:
            logger.warning("MCP session {}: its held calls would not be taken back after a crash: {}",
                           self.loop.session_id, exc)

    def unmark(self) -> None:
        """Remove :data:`HELD_MARKER` (the session ended) unless a call still waits for
        approval (a decision racing :meth:`end_held`) or a task is open: the next server
        takes those back (one the system's stop ends meanwhile is found ended)."""
        loop = self.loop
        try:
            if any(p.kind == "approval" for p in loop.pending()) or \
                    loop.task_registry.has_open(loop.session_id, loop.data_dir):
                return
        except Exception as exc:  # its loop is not running: the next server looks at what it holds
            logger.info("MCP session {}: {} kept: {!r}", self.loop.session_id, HELD_MARKER, exc)
            return
        try:
            (self.loop.data_dir / HELD_MARKER).unlink(missing_ok=True)
            self.marked = False
        except OSError as exc:
            logger.warning("MCP session {}: {} not removed: {}", self.loop.session_id, HELD_MARKER, exc)

    async def decided(self, pending: PendingCall, waiting: ToolResult, data_dir: Any) -> ToolResult:
        """The result of a call of this session held for a decision (DESIGN §4
        "Approvals"), once a person decided it (``rho-actors approve/reject`` from another
        process, acted on within a second, or ``loop.approve`` in the host) and, approved,
        it ran; ``waiting`` (its ``pending_approval`` result) when it expires first or was
        decided before this waits. Holds no thread: it waits on the event loop; a
        cancelled request leaves the call pending. ``data_dir``: the system's, for the log."""
        loop = self.loop
        logger.info("MCP session {}: call {} of tool {!r} waits for a decision: {} (or reject ... --message TEXT)",
                    loop.session_id, pending.call_id, pending.name,  # quoted: a data_dir with a space is one argument
                    shlex.join(["rho-actors", "approve", str(data_dir), loop.session_id, pending.call_id]))
        try:
            future = loop.when_decided(pending.call_id)
        except ApprovalError:  # decided meanwhile: its result is in the transcript
            return waiting
        bound = None if pending.expires_at is None else max(0.0, pending.expires_at - time.time()) + _DECIDED_GRACE_S
        try:
            result: ToolResult = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), bound)
        except (TimeoutError, ApprovalError):  # expired; or its loop stopped first (the call held for the next host)
            return waiting
        return result

    def call_record(self, call: ToolCall) -> CallRecord:
        """``call``'s records in the transcript, nothing written yet: written before it
        runs by :meth:`CallRecord.started` (in its call thread) or :meth:`CallRecord.begin`
        (in a worker thread), its result by :meth:`CallRecord.settled` or :meth:`CallRecord.end`."""
        return CallRecord(self, call, next(self.steps))

    def _append(self, call: ToolCall, result: ToolResult | None, step: int) -> None:
        """Append ``call``'s record (``result`` None: written, not synced) or its result's
        (synced: one ``fdatasync`` makes both durable; with :attr:`commits`, written and
        handed to the group commit, which syncs it within its delay); the caller holds
        ``writing``. A transcript that cannot be written is logged, never the call's failure."""
        if self.transcript is None:
            return
        try:
            if result is None:
                self.transcript.reply(step, Reply(tool_calls=(call,)), sync=False)
            else:
                self.transcript.result(step, 0, result, sync=self.commits is None)
                if self.commits is not None:
                    self.commits.written(self.transcript)
        except (OSError, ValueError, TranscriptError) as exc:  # busy past RECORD_WAIT_S, or replaced meanwhile
            logger.warning("MCP session {}: transcript not written: {}", self.loop.session_id, exc)


@dataclass(slots=True, eq=False)
class CallRecord:
    """A served call's two records (:meth:`Session.call_record`), in order, each once,
    never on the serving event loop: the call's, written (not synced) before it runs, by
    its own call thread (:meth:`started`, the turn's ``on_start``: no thread hop) or in a
    worker thread before the turn (:meth:`begin`, for a call run elsewhere); then its
    result's, synced, by the call's own thread as it settles (:meth:`settled`, the turn's
    ``on_result``), else by :meth:`end` in a worker thread (a result settled on the event
    loop, by a deadline, or a refusal), the call's record first when it has none yet."""

    session: Session
    call: ToolCall
    step: int
    begun: bool = False  # the call's record is written
    done: bool = False  # its result's is

    async def begin(self) -> None:
        """Write the call's record in a worker thread (a call that will not run on a call thread)."""
        await anyio.to_thread.run_sync(self._write, None)

    def started(self, index: int) -> None:
        """The turn's ``on_start``, in the call's thread just before its tool runs."""
        self._write(None)

    def settled(self, index: int, result: ToolResult) -> None:
        """The turn's ``on_result``: record ``result`` here when this is the call's thread
        and no one else holds the transcript (a decision being journaled in it)."""
        if not on_call_thread() or not self.session.writing.acquire(blocking=False):
            return
        try:
            self._write_held(result)
        finally:
            self.session.writing.release()

    async def end(self, result: ToolResult | None) -> None:
        """Record ``result`` unless :meth:`settled` did (None: only the call's record,
        for a call held for a decision), in a worker thread."""
        if not self.done and (result is not None or not self.begun):
            await anyio.to_thread.run_sync(self._write, result)

    def _write(self, result: ToolResult | None) -> None:
        with self.session.writing:
            self._write_held(result)

    def _write_held(self, result: ToolResult | None) -> None:
        if self.done:  # the result is recorded (a deadline's, say): a call starting late adds nothing
            return
        if not self.begun:
            self.begun = True
            self.session._append(self.call, None, self.step)
        if result is not None:
            self.done = True
            self.session._append(self.call, result, self.step)
