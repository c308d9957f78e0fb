"""The rho sessions one MCP server keeps for its clients (:mod:`rho_actors.mcp.serve`):
found or started for each request, made room for, stopped when their clients are gone;
and what the server shares between its connections (:class:`Served`).

- A handshake-era request's session is its connection's (one stdio process, or one
  ``Mcp-Session-Id``), started at its first use and stopped when the connection ends; a
  2026-07-28 request's is the one its handle names (refused when unknown or another
  principal's), or a new one for a request naming none (over stdio the process's one
  session): :func:`session_of`, the sessions themselves in :mod:`rho_actors.mcp.sessions`.
- Over HTTP a client starting a 2026-07-28 session past the guard's caps (sessions per
  client, or in all) stops the least recently used idle one first, and is refused while
  every one of them runs a call or has a task open.
- The reaper (:func:`reap_absent`, run in the server's lifespan) stops each session
  running no call whose client has had no open connection for ``client_gone_s``, or, a
  2026-07-28 session, that no request named for ``idle_timeout_s`` (a handshake-era
  connection whose client comes back gets the same session again, resumed).
"""

from __future__ import annotations

import functools
import itertools
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from loguru import logger
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST

from rho_actors.agent.group_commit import GroupCommit
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptError
from rho_actors.mcp.guard import HTTPGuard
from rho_actors.mcp.progress import LiveProgress
from rho_actors.mcp.sessions import Session, is_modern, new_session_id, principal_of, session_handle, unknown_handle
from rho_actors.mcp.tasks import ServedTasks
from rho_actors.otp.failure_runs import FailureRun

__all__ = ["STATE_KEY", "Served", "close_session", "connection_of", "reap_absent", "session_of"]

STATE_KEY = "rho_actors.session"
"""The key of a connection's rho session in the SDK connection's ``state`` (and the
prefix of its other keys there)."""


@dataclass(slots=True)
class Served:
    """What one :func:`~rho_actors.mcp.serve.aserve` shares between its connections."""

    system: Any
    withheld: tuple[str, ...]
    max_argument_bytes: int
    guard: HTTPGuard | None = None
    sessions: set[Session] = field(default_factory=set)
    handles: dict[str, Session] = field(default_factory=dict)  # 2026-07-28 sessions by their handle
    local: Session | None = None  # over stdio: the process's one 2026-07-28 session
    opening: anyio.Lock = field(default_factory=anyio.Lock)
    progress: dict[tuple[str, str], LiveProgress] = field(default_factory=dict)
    ids: Iterator[int] = field(default_factory=itertools.count)
    bus: InMemorySubscriptionBus = field(default_factory=InMemorySubscriptionBus)  # subscriptions/listen (2026-07-28)
    tasks: ServedTasks | None = None  # the tasks clients created (rho_actors.mcp.tasks)
    commits: GroupCommit | None = None  # synchronous_commit off: the results' group commit


def connection_of(ctx: Any) -> Any:
    """The SDK's per-connection ``Connection`` of a request (its ``state`` and
    ``exit_stack`` are the SDK's documented per-connection hooks).

    mcp 2.x gives a low-level handler a ``ServerRequestContext`` with no public way to
    it: the public ``Context.connection`` exists, but ``ServerRunner`` does not build a
    ``Context`` yet (the SDK's own TODO), so the connection is read from the request's
    ``ServerSession._connection``, the attribute its public properties
    (``client_params``, ``protocol_version``) read. ``tests/test_mcp_client_requests.py``
    fails when either changes; a public ``ctx.connection`` is used once it exists.
    """
    public = getattr(ctx, "connection", None)
    if public is not None:
        return public
    return ctx.session._connection


async def session_of(served: Served, ctx: Any) -> Session:
    """The rho session of the request: its connection's (handshake era), started at its
    first use, or the one its handle names (2026-07-28; see :mod:`rho_actors.mcp.sessions`)."""
    if is_modern(ctx):
        return await _named_session(served, ctx)
    connection = connection_of(ctx)
    state = connection.state
    found: Session | None = state.get(STATE_KEY)
    if found is not None and not found.closed:  # started: no lock (whose taking yields to the event loop)
        return found
    lock = state.setdefault(STATE_KEY + ".lock", anyio.Lock())
    async with lock:
        session: Session | None = state.get(STATE_KEY)
        if session is None:
            session_id = state.setdefault(STATE_KEY + ".id", new_session_id())  # outlives a reaped session
            steps = state.setdefault(STATE_KEY + ".steps", itertools.count(1))
            session = await _start_session(served, session_id, ctx.session, steps=steps,
                                           http_id=connection.session_id, state=state)
            state[STATE_KEY] = session
            connection.exit_stack.push_async_callback(close_session, served, session)
            logger.info("MCP connection started rho session {}", session_id)
    return session


async def _start_session(served: Served, session_id: str, notify: Any = None, **fields: Any) -> Session:
    """A new rho session: its loop started, its transcript opened (or logged why not)."""
    loop = await anyio.to_thread.run_sync(
        functools.partial(served.system.start_loop, session_id, withheld=served.withheld))
    loop.model_chooses = False  # a client asks for a task its own way (the tasks extension, bounded per client)
    session = Session(loop, notify, served.system.tool_set().version, commits=served.commits, **fields)
    transcript = Transcript(loop.data_dir / TRANSCRIPT_NAME)
    try:
        await anyio.to_thread.run_sync(functools.partial(transcript.open, per_record=True))
        session.transcript = transcript
    except (OSError, TranscriptError) as exc:
        logger.warning("MCP session {}: calls are not recorded: {}", session_id, exc)
    served.sessions.add(session)
    return session


async def _named_session(served: Served, ctx: Any) -> Session:
    """The 2026-07-28 session the request names by its handle (refused when unknown or
    another principal's), or a new one for a request naming none (over stdio the
    process's one session)."""
    principal, handle = principal_of(ctx), session_handle(ctx)
    if handle is not None:  # found without waiting for the lock: nothing awaits between here and its use
        found = served.handles.get(handle)
        if found is None or found.closed or not secrets.compare_digest(found.principal, principal):
            raise unknown_handle()
        found.used = time.monotonic()
        return found
    async with served.opening:
        if served.guard is None and served.local is not None and not served.local.closed:
            session = served.local
        else:
            await _make_room(served, principal)
            session_id = new_session_id()
            session = await _start_session(served, session_id, principal=principal,
                                           handle=secrets.token_urlsafe(24))
            assert session.handle is not None
            served.handles[session.handle] = session
            if served.guard is None:
                served.local = session
            logger.info("MCP: a 2026-07-28 client started rho session {}", session_id)
    session.used = time.monotonic()
    return session


async def _make_room(served: Served, principal: str) -> None:
    """Stop the principal's least recently used idle session when it holds as many as the
    guard allows one client (or all clients hold the most in all); raise ``MCPError``
    when every one of them is running a call."""
    guard = served.guard
    if guard is None:
        return
    mine = [s for s in served.handles.values() if s.principal == principal]
    full = [s for s in served.handles.values()] if len(served.handles) >= guard.max_sessions else []
    crowd = mine if len(mine) >= guard.max_sessions_per_client else full
    if not crowd:
        return
    idle = [s for s in crowd if not _busy(s)]
    if not idle:
        raise MCPError(INVALID_REQUEST, f"too many sessions: at most {guard.max_sessions_per_client} per client "
                                        f"and {guard.max_sessions} in all, each running a call now")
    oldest = min(idle, key=lambda s: s.used)
    logger.info("MCP session {}: stopped to make room for a new one of {}", oldest.loop.session_id, principal)
    await close_session(served, oldest)


def _busy(session: Session) -> bool:
    """Whether ``session`` runs a call now, or has a task open (which needs its loop)."""
    loop = session.loop
    return session.calls > 0 or loop.task_registry.has_open(loop.session_id, loop.data_dir)


async def close_session(served: Served, session: Session) -> None:
    """Stop ``session`` and forget it (its handle, its connection's hold on it)."""
    if session.handle is not None and served.handles.get(session.handle) is session:
        del served.handles[session.handle]
    await session.close(served.sessions, STATE_KEY)


async def reap_absent(served: Served, guard: HTTPGuard) -> None:
    """Stop each rho session running no call whose client has had no open connection for
    ``guard.client_gone_s`` seconds (checked 4 times in that time), or, a 2026-07-28
    session, that no request named for ``guard.idle_timeout_s`` seconds. A look at a
    session or its stop that raises is logged (the 1st, 2nd, 4th... failure of a run:
    :class:`~rho_actors.otp.failure_runs.FailureRun`) and the reaper goes on with the
    other sessions and the next round (it ended there: no absent client's session was
    stopped again)."""
    failures = FailureRun("MCP: the reaper of absent sessions")
    while True:
        await anyio.sleep(min(guard.client_gone_s / 4, 1.0))
        passed = True
        for session in list(served.sessions):
            try:
                await _reap_if_absent(served, guard, session)
            except Exception:
                passed = False
                failures.log_failed("MCP: reaping session {} failed; the reaper goes on",
                                    getattr(session.loop, "session_id", "?"))
        if passed:
            failures.passed()


async def _reap_if_absent(served: Served, guard: HTTPGuard, session: Session) -> None:
    """Stop ``session`` when it runs no call and its client is gone or it was not named
    for long (:func:`reap_absent`)."""
    if _busy(session):
        return
    if session.http_id and guard.absent_for(session.http_id) >= guard.client_gone_s:
        logger.info("MCP session {}: its client is gone; stopped", session.loop.session_id)
    elif session.handle and (idle_s := time.monotonic() - session.used) >= guard.idle_timeout_s:
        logger.info("MCP session {}: not named for {:.0f} s; stopped", session.loop.session_id, idle_s)
    else:
        return
    guard.reaped += 1
    await close_session(served, session)
