"""Serving a running :class:`~rho_actors.ActorSystem`'s tools to MCP clients.

:func:`serve` (blocking) and :func:`aserve` (asyncio) serve over stdio, or over
streamable HTTP with ``http=("127.0.0.1", 8000)``; ``rho-actors mcp serve`` is the
command. Built on the official SDK's low-level ``Server`` (``mcp.server.lowlevel``).

- Each MCP connection (one stdio process, or one ``Mcp-Session-Id``) is a rho session
  (kept by :mod:`rho_actors.mcp.served_sessions`): its own LoopActor and data folder
  (``data_dir/sessions/mcp-...``), stopped when the connection ends, and its transcript
  of calls (``transcript.jsonl``: each call, written before it runs, then its result,
  synced with it before it is sent, or with ``synchronous_commit=False`` within
  ``wal_writer_delay_ms`` (200) after by a group commit: DESIGN §6b; the file's lock
  taken for each record only). A held call is answered once decided
  (``rho-actors approve`` from another process: :meth:`~rho_actors.mcp.sessions.Session.decided`).
- ``tools/list`` gives the loop's checked declarations (``declaration(tool, "mcp")``),
  with an ``outputSchema`` for a trusted tool that has an ``output_schema()`` callback
  (:func:`output_schema`).
- ``tools/call`` runs as a turn of one call (``Loop.arun_turn``) with the tool's
  deadline and containment. Every failure (invalid arguments, unknown tool, timeout,
  raised, crashed...) is a ``CallToolResult`` with ``isError: true`` and the text a
  model gets; a result's blocks are served in order as text, image, audio and
  embedded-resource content (else its text, then its pictures); a result whose text is a JSON object is
  also ``structuredContent`` (checked against the tool's ``outputSchema`` if it has
  one: a mismatch is an error result); ``details`` never leave the host.
- A client's ``notifications/cancelled`` cancels the handler's task, and with it the
  turn. Progress a tool reports with ``ctx["progress"](done, total, message)`` is sent
  as ``notifications/progress`` when the client asked for it (a ``progressToken``),
  before the call's result (at most 16 waiting while one is sent, the last one made always
  among them: :mod:`rho_actors.mcp.progress`). ``rho_actors.mcp.client_of(ctx)`` gives a tool the client
  that called it: log messages (``logging/setLevel`` sets the least severe level
  sent), sampling and elicitation (:mod:`rho_actors.mcp.client_requests`).
- Over HTTP each SSE stream starts with a priming event and a ``retry`` delay, and
  its events are kept in a :class:`~rho_actors.mcp.events.BoundedEventStore`, so a
  client whose stream closed reconnects with ``Last-Event-ID`` and gets the rest
  (SEP-1699; the SDK primes clients of protocol 2025-11-25 or later); each session
  has its own view of the store, so an event id of another session replays nothing.
- A change of the system's tool set (a source's scan, ``unregister``: the registry's
  :class:`~rho_actors.ToolSetChanged` event, no polling) sends
  ``notifications/tools/list_changed`` to every connection (changes close together are
  announced once), and to each 2026-07-28 client's ``subscriptions/listen`` stream, which
  also carries ``notifications/tasks`` of the tasks it names (:mod:`rho_actors.mcp.listen`).
- Over HTTP an :class:`~rho_actors.mcp.guard.HTTPGuard` stands in front (a bearer
  token, session caps per client and in all, an idle timeout). A rho session whose
  client has had no open connection for ``client_gone_s`` and that runs no call is
  stopped by a reaper (:func:`~rho_actors.mcp.served_sessions.reap_absent`; a client
  that comes back gets it again, resumed); a call whose request's connection dropped
  runs on within its deadline, its result kept in the event store for the client to
  fetch (a disconnect is no cancellation: the 2025-11-25 spec).
- Bad input (a line that is not JSON or not a JSON-RPC message, an unknown method,
  params that fail validation, or arguments over ``max_argument_bytes``) gets a JSON-RPC
  error from the SDK or from here, at once; the server goes on. A request with an id MCP
  does not allow (``null``, ``true``, ``1.5``, ``{}``...) or with a usable id but a bad
  shape (``params`` not an object) is answered too, with its id where it is usable
  (:mod:`rho_actors.mcp.stdio_lines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import warnings
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, cast

import anyio
import mcp_types as types
from loguru import logger
from mcp.server.caching import CacheHint
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import INVALID_PARAMS, INVALID_REQUEST, MISSING_REQUIRED_CLIENT_CAPABILITY

from rho_actors.agent.group_commit import DEFAULT_WAL_WRITER_DELAY_MS, GroupCommit, wal_writer_delay_s
from rho_actors.declarations.formats import to_dialect
from rho_actors.events import ProgressEvent, ToolSetChanged
from rho_actors.lifecycle import PendingCall
from rho_actors.loop.approval_rules import approval_rule
from rho_actors.loop.inline import runs_inline
from rho_actors.mcp.call_results import call_tool_result, entry_output_schema, output_schema
from rho_actors.mcp.client_requests import LEVEL_KEY, LOG_LEVELS, Bound, bind, unbind
from rho_actors.mcp.events import BoundedEventStore, own_event_stores
from rho_actors.mcp.guard import HTTPGuard, connection_protocol
from rho_actors.mcp.held_sessions import TakenBack, may_hold
from rho_actors.mcp.listen import Listening
from rho_actors.mcp.progress import LiveProgress
from rho_actors.mcp.served_sessions import STATE_KEY, Served, close_session, connection_of, reap_absent, session_of
from rho_actors.mcp.sessions import SESSION_META_KEY, CallRecord, Session, call_id_of, is_modern, principal_of
from rho_actors.mcp.stdio_lines import CheckedLines, answering_bad_lines, claimed_stdin
from rho_actors.mcp.tasks import ServedTask, ServedTasks, as_task_call, handshake_created, up_front
from rho_actors.otp.failure_runs import FailureRun
from rho_actors.tool import ToolCall, ToolResult

__all__ = ["DEFAULT_MAX_ARGUMENT_BYTES", "HTTPGuard", "aserve", "build_server", "output_schema", "serve"]

DEFAULT_MAX_ARGUMENT_BYTES = 1_000_000
"""The largest ``tools/call`` arguments accepted (bytes of their JSON)."""

_LISTEN_BACKLOG = 64  # changes a subscriptions/listen stream may have unsent before it is ended
_STDIO_LISTENERS = 8  # subscriptions/listen streams of one stdio client at once
_STATE_TTL_S = 600.0  # how long a client may take to answer an input_required result
_PROGRESS_FLUSH_S = 2.0  # how long a result waits for its progress notifications to be sent
_SSE_RETRY_MS = 500  # the reconnection delay suggested to a client whose SSE stream closed (SEP-1699)
MAX_STATE_BYTES = 256 * 1024
"""The most JSON of earlier rounds' answers a 2026-07-28 ``requestState`` carries."""
LIST_CACHE_HINT = CacheHint(ttl_ms=10_000, scope="private")
"""How long a client may keep a ``tools/list`` result (SEP-2549): 10 s, for its own
authorization only; a change is announced before then (``list_changed``)."""
_NONE_CACHE_HINT = CacheHint(ttl_ms=3_600_000, scope="public")  # the empty listings of prompts and resources


def _input_schema(served: Served, name: str) -> dict[str, Any] | None:
    """The ``inputSchema`` of tool ``name`` as listed (for the SDK's ``Mcp-Param-*``
    header checks of a 2026-07-28 call), or None for a tool not served."""
    entry = served.system.tool_set().entries.get(name)
    if entry is None or name in served.withheld:
        return None
    schema: dict[str, Any] = to_dialect(entry.info, "mcp")["inputSchema"]
    return schema


def build_server(system: Any, *, name: str = "rho-actors", withheld: Iterable[str] = (),
                 max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES, guard: HTTPGuard | None = None,
                 synchronous_commit: bool = True,
                 wal_writer_delay_ms: float = DEFAULT_WAL_WRITER_DELAY_MS) -> Server[Any]:
    """The SDK ``Server`` serving ``system``'s tools (run it with :func:`aserve`, or
    mount its ``streamable_http_app()`` behind ``guard.wrap``). ``withheld`` names
    tools not served; ``guard`` the HTTP endpoint's :class:`HTTPGuard` (its rho
    sessions of absent clients are stopped); ``synchronous_commit`` (PostgreSQL's term):
    True, a call's result is synced to disk before it is sent; False, written to the OS
    before it is sent and synced by a group commit at most ``wal_writer_delay_ms``
    milliseconds after (PostgreSQL's ``wal_writer_delay``, default 200; a power loss may
    lose the results of that last delay: DESIGN §6b "The served transcript"). Raises
    ``ValueError`` for a ``wal_writer_delay_ms`` that is not from 1 to 10000."""
    served = Served(system, tuple(withheld), max_argument_bytes, guard,
                     commits=None if synchronous_commit else GroupCommit(wal_writer_delay_s(wal_writer_delay_ms)))
    served.tasks = ServedTasks(system.task_registry, call_tool_result)
    taken = TakenBack(system, served.withheld, served.tasks)  # what a killed server before this one left held
    listeners = guard.max_sessions if guard is not None else _STDIO_LISTENERS
    if guard is not None:
        guard.rho_sessions = lambda: len(served.sessions)

    @contextlib.asynccontextmanager
    async def lifespan(_server: Server[Any]) -> AsyncIterator[Served]:
        aloop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def on_event(event: Any) -> None:  # in the emitting actor's thread
            if isinstance(event, ToolSetChanged):
                with contextlib.suppress(RuntimeError):  # the asyncio loop has closed
                    aloop.call_soon_threadsafe(changed.set)
            elif isinstance(event, ProgressEvent):
                live = served.progress.get((event.session_id, event.call_id))
                if live is not None:  # at most one sent and one waiting: rho_actors.mcp.progress
                    live.report(event.done, event.total, event.message)

        await taken.start()
        unsubscribe = system.subscribe(on_event, only=(ToolSetChanged, ProgressEvent))  # no call's events
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_announce_changes, served, changed)
            if served.guard is not None:
                tasks.start_soon(reap_absent, served, served.guard)
            try:
                yield served
            finally:
                unsubscribe()
                tasks.cancel_scope.cancel()
                if served.tasks is not None:
                    served.tasks.close()
                for session in list(served.handles.values()):  # 2026-07-28 sessions: no connection ends them
                    await close_session(served, session)
                await taken.close()
                if served.commits is not None:  # a session closed later syncs at once
                    await anyio.to_thread.run_sync(served.commits.close)

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return await _list_tools(served, ctx)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
        return await _call_tool(served, ctx, params)

    async def track(ctx: Any, call_next: Any) -> Any:
        """Server middleware: the guard forgets a connection's session when it ends."""
        if served.guard is not None:
            connection = connection_of(ctx)
            if not connection.state.get(STATE_KEY + ".tracked"):
                connection.state[STATE_KEY + ".tracked"] = True
                connection.exit_stack.callback(served.guard.ended, connection.session_id)
        return await call_next(ctx)

    with warnings.catch_warnings():  # logging is deprecated from protocol 2026-07-28 on; clients of today use it
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = _Server(name, lifespan=lifespan, on_list_tools=list_tools, on_call_tool=call_tool,
                         on_set_logging_level=_set_level, on_list_prompts=_no_prompts, on_list_resources=_no_resources,
                         on_list_resource_templates=_no_templates, on_read_resource=_no_resource,
                         on_subscriptions_listen=Listening(
                             served.bus, served.tasks, principal_of, max_streams=listeners, backlog=_LISTEN_BACKLOG,
                             max_streams_per_client=guard.max_sessions_per_client if guard else listeners),
                         cache_hints={"tools/list": LIST_CACHE_HINT, "prompts/list": _NONE_CACHE_HINT,
                                      "resources/list": _NONE_CACHE_HINT,
                                      "resources/templates/list": _NONE_CACHE_HINT})
    server.middleware.append(track)
    return _extended(server, served, name)


def _extended(server: Server[Any], served: Served, name: str) -> Server[Any]:
    """``server`` with the tasks extension, the 2026-07-28 ``requestState`` boundary and
    the tools' listed schemas for the ``Mcp-Param-*`` header checks."""
    assert served.tasks is not None
    served.tasks.install(server, principal_of)  # tasks/get, tasks/update, tasks/cancel; the extension advertised
    # 2026-07-28's requestState: sealed (AES-GCM, a key of this process), bound to the
    # call, the tool, its arguments and the principal, checked before the handler runs
    security = RequestStateSecurity.ephemeral(ttl=_STATE_TTL_S)
    security.bind_principal = principal_of
    server.middleware.append(RequestStateBoundary(security, default_audience=name))
    server.get_tool_input_schema = functools.partial(_input_schema, served)
    return server


async def _list_tools(served: Served, ctx: Any) -> types.ListToolsResult:
    """``tools/list``: the loop's offer, with each trusted tool's ``outputSchema``."""
    entries = served.system.tool_set().entries  # read once: the schemas are the listed versions'
    if is_modern(ctx):  # 2026-07-28: a listing depends on no session (SEP-2567)
        offered = [entry.info for name, entry in entries.items() if name not in served.withheld]
    else:
        session = await session_of(served, ctx)
        offered = await anyio.to_thread.run_sync(session.loop.offered)
    tools = []
    for info in offered:
        declared = to_dialect(info, "mcp")
        schema = entry_output_schema(entries.get(info.name), info.name)
        if schema is not None:
            declared["outputSchema"] = schema
        tools.append(types.Tool.model_validate(declared))
    return types.ListToolsResult(tools=tools)


async def _no_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    """``prompts/list``: rho serves tools only, so none (listed, for clients that ask)."""
    return types.ListPromptsResult(prompts=[])


async def _no_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    """``resources/list``: none (rho serves tools only)."""
    return types.ListResourcesResult(resources=[])


async def _no_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
    """``resources/templates/list``: none (rho serves tools only)."""
    return types.ListResourceTemplatesResult(resource_templates=[])


async def _no_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    """``resources/read``: no resource is served: invalid params naming the URI (SEP-2164)."""
    uri = str(params.uri)
    raise MCPError(INVALID_PARAMS, f"resource not found: {uri[:200]!r} (this server serves tools only)",
                   {"uri": uri})


async def _set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    """``logging/setLevel``: the least severe level this connection's tools log at."""
    if params.level not in LOG_LEVELS:
        raise MCPError(INVALID_PARAMS, f"unknown log level {str(params.level)[:40]!r}; "
                                       f"expected one of {', '.join(LOG_LEVELS)}")
    connection_of(ctx).state[LEVEL_KEY] = params.level
    return types.EmptyResult()


async def _call_tool(served: Served, ctx: Any, params: types.CallToolRequestParams) -> Any:
    """``tools/call``: a turn of one call; on 2026-07-28 an ``input_required`` result when
    the tool asked the client what it has not answered yet
    (:mod:`rho_actors.mcp.client_requests`). A handshake-era request whose HTTP
    connection drops is not cancelled (the spec: a disconnect is no cancellation): the
    call runs on within its deadline and its result goes to the event store, for the
    client to fetch by reconnecting with ``Last-Event-ID``; at 2026-07-28 closing the
    response stream is the cancellation (the SDK cancels this handler)."""
    arguments = params.arguments or {}
    size = len(json.dumps(arguments, ensure_ascii=False, default=str))
    if size > served.max_argument_bytes:
        raise MCPError(INVALID_PARAMS, f"tools/call arguments for {params.name[:100]!r} are {size} bytes of JSON; "
                                       f"at most {served.max_argument_bytes} are accepted")
    modern = is_modern(ctx)
    answers = _answers(params) if modern else {}
    entry = served.system.tool_set().entries.get(params.name)  # read once: one version decides the call
    as_task = as_task_call(entry, served.withheld, ctx, params.name)
    session = await session_of(served, ctx)
    early = up_front(entry, params.name, arguments, answers) if as_task and modern else None
    if early:  # asked before the call becomes a task: its next round answers them
        return _input_required(params.name, early, answers, session)
    call_id = call_id_of(ctx.request_id, next(served.ids))  # never the client's id as it came
    key = (session.loop.session_id, call_id)
    aloop = asyncio.get_running_loop()
    task = ServedTask(principal_of(ctx), session, params.name, None if modern else connection_of(ctx), aloop,
                      bound=key) if as_task and served.tasks is not None else None
    if task is not None and served.guard is not None:
        served.tasks.admit(task, served.guard.max_tasks_per_client)  # type: ignore[union-attr]
    live = served.progress[key] = LiveProgress(aloop, ctx.session)
    close = ctx.close_sse_stream
    level = ((ctx.params or {}).get("_meta") or {}) if modern else connection_of(ctx).state
    bound = Bound(aloop, ctx.session, ctx.request_id, level, close,
                  modern=modern, answers=answers)
    if task is not None:
        bound.task_input = served.tasks.asking(task)  # type: ignore[union-attr]
    bind(*key, bound)
    session.calls += 1
    results: list[ToolResult] = []
    try:  # a dropped HTTP connection is no cancel (2025-11-25): the call runs on, its result kept to replay
        # a cancel waited for while the session started is raised here: unbound, released below as any end
        await may_hold(session, entry, task.principal if task else principal_of(ctx), task is not None)
        record = session.call_record(ToolCall(call_id, params.name, arguments))  # recorded before it runs:
        on_thread = task is None and _on_call_thread(entry, session)  # by its thread, as it starts
        if not on_thread:
            await record.begin()  # else by a worker thread first
        results = await _run_call(served, session, record, task is not None, on_thread)
    finally:
        session.calls -= 1
        session.used = time.monotonic()
        served.progress.pop(key, None)
        if task is None or not results or not _names_task(results[0]):  # a task's call keeps its client
            unbind(*key)
            if task is not None:
                served.tasks.release(task)  # type: ignore[union-attr]
    said = {SESSION_META_KEY: session.handle} if session.handle is not None else None
    created = await _task_made(served, task, results[0], said) if task is not None else None
    await live.flushed(_PROGRESS_FLUSH_S)  # the progress reported goes before the result
    if bound.missing:
        raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY,
                       f"{params.name[:100]!r} needs the client capabilities {', '.join(sorted(bound.missing))}",
                       {"requiredCapabilities": {name: {} for name in sorted(bound.missing)}})
    if bound.asked:
        return _input_required(params.name, bound.asked, bound.used, session)
    if created is not None:
        return created if modern else handshake_created(results[0], created)
    return call_tool_result(results[0], entry_output_schema(entry, params.name), said)


async def _run_call(served: Served, session: Session, record: CallRecord, as_task: bool,
                    on_thread: bool) -> list[ToolResult]:
    """The results of ``record``'s call's turn, recorded (synced with the call's own
    record: DESIGN §6b "The served transcript"; ``on_thread``: the call's record is
    written by its call thread as it starts); a held call (recorded ``pending`` by the
    loop's approvals), not a task, is answered once decided (:meth:`Session.decided`)."""
    results: list[ToolResult] = await session.loop.arun_turn(
        [record.call], background=as_task, on_result=record.settled, on_start=record.started if on_thread else None)
    details = results[0].details  # a held call's PendingCall: in a task's acknowledgement too
    held = details.get("pending") if isinstance(details, Mapping) else None
    if not isinstance(held, PendingCall):
        await record.end(results[0])
    else:
        await record.end(None)  # held, not run: its call's record all the same
        if not as_task:
            results = [await session.decided(held, results[0], served.system.data_dir)]
    return results


def _on_call_thread(entry: Any, session: Session) -> bool:
    """Whether a call of the tool whose tool-set entry is ``entry`` runs on a call thread
    (``thread`` isolation, not an ``async`` tool run on the serving loop) and is never
    held for a decision (whose journal in the transcript comes after the call's record),
    so its record is written as it starts; a name not served (None) is refused before it
    runs (both records written after)."""
    if entry is None:
        return True
    return (entry.isolation == "thread" and not runs_inline(entry) and approval_rule(entry) is False
            and session.loop.approval_policy is None)


async def _task_made(served: Served, task: ServedTask, result: ToolResult, meta: dict[str, Any] | None
                     ) -> dict[str, Any] | None:
    """The ``CreateTaskResult`` of ``task``'s call when ``result`` names its task, else
    None. Made even when the request is cancelled meanwhile: the task is then followed
    as any (its end releases its binding and its client's slot), its client not told."""
    if not _names_task(result):
        return None
    assert served.tasks is not None
    with anyio.CancelScope(shield=True):
        created: dict[str, Any] = await anyio.to_thread.run_sync(served.tasks.created, task, result, meta)
    return created


def _input_required(name: str, asked: dict[str, Any], used: dict[str, Any], session: Session) -> Any:
    """The ``input_required`` result asking ``asked``, the answers ``used`` so far kept
    in its ``requestState`` (sealed by the SDK's boundary)."""
    state = json.dumps({"answers": used}, separators=(",", ":"))
    if len(state) > MAX_STATE_BYTES:
        raise MCPError(INVALID_REQUEST, f"the answers of {name[:100]!r}'s earlier rounds are {len(state)} "
                                        f"bytes of JSON; at most {MAX_STATE_BYTES} are carried")
    said = {SESSION_META_KEY: session.handle} if session.handle is not None else None
    return types.InputRequiredResult.model_validate({"inputRequests": asked, "requestState": state, "_meta": said})


def _names_task(result: ToolResult) -> bool:
    """Whether ``result`` is a background call's acknowledgement (naming its task)."""
    return result.ok and isinstance(result.details, Mapping) and isinstance(result.details.get("task_id"), str)


def _answers(params: types.CallToolRequestParams) -> dict[str, Any]:
    """The client's answers a 2026-07-28 call carries: those of the earlier rounds (in its
    ``requestState``, sealed by the server and checked by the SDK's boundary), then its
    ``inputResponses``."""
    answers: dict[str, Any] = {}
    if params.request_state is not None:
        try:
            kept = json.loads(params.request_state)["answers"]
        except (ValueError, KeyError, TypeError):
            kept = None
        if not isinstance(kept, dict):
            raise MCPError(INVALID_PARAMS, "Invalid or expired requestState")
        answers.update(kept)
    for key, response in (params.input_responses or {}).items():
        answers[key] = response.model_dump(mode="json", by_alias=True, exclude_none=True)
    return answers


class _Server(Server[Any]):
    """The SDK's server, advertising ``tools.listChanged`` on every transport."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> Any:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), *args, **kwargs
        )


async def _announce_changes(served: Served, changed: asyncio.Event) -> None:
    """Send ``notifications/tools/list_changed`` to each connection whose last offer is
    older than the system's tool set, and to every ``subscriptions/listen`` stream
    (2026-07-28), each time ``changed`` is set (by a :class:`ToolSetChanged` event;
    several set before this wakes are announced once). An announcement that raises what
    was not expected is logged (the 1st, 2nd, 4th... of a run: ``FailureRun``) and the
    next change is announced (it ended there: no change was announced again)."""
    failures = FailureRun("MCP: the announcer of tool-list changes")
    while True:
        await changed.wait()
        changed.clear()
        try:
            await _announce(served)
        except Exception:
            failures.log_failed("MCP: announcing a change of the tool set failed; the next change is announced")
        else:
            failures.passed()


async def _announce(served: Served) -> None:
    """One announcement of :func:`_announce_changes`."""
    version = served.system.tool_set().version
    await served.bus.publish(ToolsListChanged())  # to 2026-07-28 clients' subscriptions/listen streams
    for session in list(served.sessions):
        if session.offered_version != version:
            session.offered_version = version
            try:
                await session.notify.send_tool_list_changed()
            except Exception as exc:  # a connection closing: it is dropped at its end
                logger.debug("tools/list_changed not sent: {!r}", exc)


async def aserve(system: Any, *, http: tuple[str, int] | None = None, name: str = "rho-actors",
                 withheld: Iterable[str] = (), max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
                 guard: HTTPGuard | None = None, synchronous_commit: bool = True,
                 wal_writer_delay_ms: float = DEFAULT_WAL_WRITER_DELAY_MS) -> None:
    """Serve ``system``'s tools until the client closes stdin (stdio) or the task is
    cancelled (HTTP: ``http=(host, port)``, the endpoint is ``http://host:port/mcp``,
    behind ``guard``: an :class:`HTTPGuard` with the bearer token and the caps, needed
    for HTTP). ``synchronous_commit`` and ``wal_writer_delay_ms``: as
    :func:`build_server`'s (default True: every result durable before it is sent).
    Raises ``ValueError`` for HTTP without a guard (or ``auth=False`` off loopback) and
    a bad ``wal_writer_delay_ms``, ``OSError`` when the HTTP port cannot be bound."""
    if http is not None:
        if guard is None:
            raise ValueError("serving MCP over HTTP needs guard=HTTPGuard(token=...)")
        guard.check_host(http[0])
    server = build_server(system, name=name, withheld=withheld, max_argument_bytes=max_argument_bytes,
                          guard=guard if http is not None else None, synchronous_commit=synchronous_commit,
                          wal_writer_delay_ms=wal_writer_delay_ms)
    options = server.create_initialization_options()
    if http is None:
        answers, early = anyio.create_memory_object_stream[types.JSONRPCError](16)
        with claimed_stdin() as stdin_text:
            lines = CheckedLines(anyio.wrap_file(stdin_text), answers)
            async with stdio_server(stdin=cast(Any, lines)) as (read, write), \
                    answering_bad_lines(read, write, early) as checked:
                await server.run(checked, write, options)
        return
    import uvicorn

    assert guard is not None
    host, port = http
    events = BoundedEventStore()
    app = server.streamable_http_app(host=host, session_idle_timeout=guard.idle_timeout_s,
                                     max_sessions=guard.max_sessions, event_store=events,
                                     retry_interval=_SSE_RETRY_MS)
    own_event_stores(server.session_manager, events)  # one session never replays another's events
    # the client is the connection's own peer: no X-Forwarded-For may rename it (a local
    # caller naming another's loopback port would take that uid's sessions)
    config = uvicorn.Config(guard.wrap(app), host=host, port=port, log_level="warning", lifespan="on",
                            http=connection_protocol(guard), proxy_headers=False)
    await uvicorn.Server(config).serve()


def serve(system: Any, *, http: tuple[str, int] | None = None, name: str = "rho-actors",
          withheld: Iterable[str] = (), max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
          guard: HTTPGuard | None = None, synchronous_commit: bool = True,
          wal_writer_delay_ms: float = DEFAULT_WAL_WRITER_DELAY_MS) -> None:
    """:func:`aserve` on a new asyncio loop in this thread (blocks until served)."""
    anyio.run(functools.partial(aserve, system, http=http, name=name, withheld=withheld,
                                max_argument_bytes=max_argument_bytes, guard=guard,
                                synchronous_commit=synchronous_commit, wal_writer_delay_ms=wal_writer_delay_ms))
