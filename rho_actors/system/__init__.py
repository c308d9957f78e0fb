"""The ActorSystem: the root of a host's tool-call runtime (DESIGN §6).

Its supervision tree, started in this order and stopped in reverse (DESIGN §6 says why
each node has its strategy and intensity)::

    root                    Supervisor one_for_one, intensity I       the system's own actors
    ├── declarations        DeclarationActor      permanent  checked declarations, retry timers
    ├── registry            ToolRegistry          permanent  tools; publishes the tool set
    ├── calls               Supervisor            permanent  CallActors: temporary
    ├── workers             IsolationOwner        permanent  the isolations: processes for ``process`` isolation
    ├── sources             Supervisor, I         permanent  SourceActors (add_source): permanent;
    │                                                        a source's own subtrees: temporary
    ├── sessions            LazySupervisor        permanent  one subtree per session: temporary
    │   └── <session id>    Supervisor, I, auto_shutdown     the session's own children (lazy: started
    │       └── loop        LoopActor             transient, significant   at the loop's first crash)
    ├── servers             Supervisor            permanent  one subtree per host server: temporary
    │   └── <spec id>       Supervisor, its own intensity    (start_child's, default I)
    │       └── <spec id>   the host's actor      its spec's restart type
    └── tasks               TaskRegistry          permanent  background calls, each in its isolation: temporary

``I`` is ``ActorSystem(max_restarts=..., max_seconds=...)``. A session or server that crash-loops exhausts the
intensity of its own subtree only: that subtree is given up (reported, and its handle's errors say so) and nothing
else is touched. The state of the DeclarationActor and of the registry is kept by the system, so either one
restarted by the root loses no tool and no checked declaration; calls in flight do not depend on them. A failure
escalating past the root's restart intensity stops the system: :attr:`ActorSystem.stopped` turns true and
:attr:`ActorSystem.exit_reason` holds the cause. Every supervisor's reports are :class:`rho_actors.SupervisorEvent`
values on :meth:`ActorSystem.subscribe`, and are logged.

This module builds the tree, starts sessions' loops and stops the system; the rest of
:class:`ActorSystem` is its parts: registering tools (:mod:`rho_actors.system.tools`),
the host's own actors and the asks of the system's (:mod:`rho_actors.system.host_actors`),
what keeps a stop's promises (:mod:`rho_actors.system.stopping`) and the settings'
checks (:mod:`rho_actors.system.settings_checks`).

Example::

    with ActorSystem(data_dir="/tmp/agent") as system:
        system.register(add)
        loop = system.start_loop("session-1")
        [result] = loop.run_turn([ToolCall("c1", "add", '{"a": 1, "b": 2}')])
        assert result.ok and result.content == "3"
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pykka
from loguru import logger

from rho_actors.agent.session_lease import release_all
from rho_actors.agent.transcript import TRANSCRIPT_NAME
from rho_actors.budgets import DEFAULT_MAX_SESSION_RESULT_BYTES, DEFAULT_MAX_TURN_RESULT_BYTES, ResultBudgets
from rho_actors.declarations import checks as _decl
from rho_actors.declarations.arguments import DEFAULT_MAX_ARGUMENT_DEPTH
from rho_actors.declarations.toolset import ToolSetView
from rho_actors.encoding import DEFAULT_MAX_OUTPUT_CHARS
from rho_actors.events import CallEvent, EventBus, SupervisorEvent
from rho_actors.files import UnsafePathError, child_path, folder_identity
from rho_actors.governor import Governor, GovernorSettings
from rho_actors.isolation import IsolationOwner, IsolationServices, start_isolations
from rho_actors.isolation.call import CallActor
from rho_actors.loop.actor import LoopActor
from rho_actors.loop.approvals import DEFAULT_APPROVAL_TIMEOUT_S, CallInfo, SessionApprovals
from rho_actors.loop.handle import Loop, withheld_names
from rho_actors.loop.messages import FolderAtStart, SessionWithheld, allowlist, checked_session_id, leased, loop_name
from rho_actors.otp.actor import NORMAL, monitor, start_link
from rho_actors.otp.lazy import LazyStarter, LazySupervisor, SessionSubtrees
from rho_actors.otp.names import Names
from rho_actors.otp.owned import OwnedProcesses
from rho_actors.otp.starters import ChildStarter
from rho_actors.otp.supervisor import ChildSpec, StartChild, Supervisor
from rho_actors.otp.threads import ThreadPool
from rho_actors.otp.timers import Timers
from rho_actors.registry.declaration_actor import DECLARATIONS, DeclarationActor, DeclarationState
from rho_actors.registry.tool_registry import RegistryState, ToolRegistry
from rho_actors.runtime import DEFAULT_MAX_TIMEOUT_MS, Limits, Runtime, UntrustedReads, fair_shares
from rho_actors.sandbox import (
    DEFAULT_HEAP_BYTES,
    KILLED_REAP_S,
    Confinement,
    ConfinePolicy,
    default_start_timeout_ms,
    hold_servers,
    make_session_dir,
    refuse_unguarded_start,
    release_servers,
    sweep_leftovers,
    system_policy,
)
from rho_actors.system.host_actors import (
    CALLS,
    REGISTRY,
    ROOT,
    SERVERS,
    SESSIONS,
    SOURCES,
    WORKERS,
    HostActors,
)
from rho_actors.system.settings_checks import check_settings
from rho_actors.system.stopping import StopOnce, end_workers
from rho_actors.system.tools import SystemTools
from rho_actors.tasks import TaskRegistry, TaskSettings, records
from rho_actors.telemetry import Telemetry

if TYPE_CHECKING:
    from rho_actors.observe.observer import Observer
    from rho_actors.selftest import SelftestRow
    from rho_actors.sources.source_actor import Source, SourceHandle

__all__ = ["ActorSystem"]


class ActorSystem(HostActors, SystemTools):
    """A supervised runtime for tool calls. Use it as a context manager, or call
    :meth:`stop` when done.

    Arguments: ``data_dir`` holds one private folder per session (default: a new
    temporary folder, removed at :meth:`stop`); ``max_output_chars`` caps each result's text (characters);
    ``max_argument_depth`` and ``max_schema_depth`` bound nesting of call arguments and
    parameter schemas; ``max_description_chars`` (16,384), ``max_schema_bytes`` (65,536)
    and ``max_schema_nodes`` (2,048) bound every declaration (DESIGN §3);
    ``max_turn_result_bytes`` (64 MiB) and ``max_session_result_bytes`` (512 MiB) budget
    results: past either, an ``output_limit`` error (:mod:`rho_actors.runtime`);
    ``shutdown_ms`` is how long running calls get to stop on :meth:`stop` (milliseconds)
    before their threads are abandoned; ``max_restarts`` in ``max_seconds`` seconds is the
    restart intensity of the root (the system's own actors), of the sources' supervisor,
    of each session's supervisor, and the default of each server's
    (see :meth:`start_child`): past it, that supervisor gives up (DESIGN §6); ``untrusted`` says
    how untrusted declarations are read (time and heap bounds, retry schedule, start
    method; see :class:`rho_actors.UntrustedReads`); ``warm_workers`` worker processes are
    kept for ``process`` isolation once it is first used, an untrusted tool's under the
    same heap bound (its whole tree), a trusted ``process`` tool's under
    ``process_heap_bytes`` (bytes, default 256 MiB, ``0`` for none: the one memory setting
    of trusted process tools; ``resources={"memory": ...}`` is refused and names it);
    ``tracing`` turns OpenTelemetry spans and metrics off (``False``) or sets how they are
    recorded (a :class:`rho_actors.Telemetry`); they go to the host's global providers
    (see :mod:`rho_actors.telemetry`).

    Untrusted workers are confined (DESIGN §5 "Confinement"; :meth:`stats` says which
    mechanisms are active here): ``confinement`` is the
    :class:`rho_actors.sandbox.confine.confinement.Confinement` each starts from (default: drop to
    a uid of its own when the host is root, own PID, IPC, mount and network namespaces with a 64 MiB
    tmpfs private folder, Landlock, a seccomp filter, process/file/core limits;
    ``Confinement(network=True)`` lets workers use the host's network; pass
    ``Confinement(uid=None, gid=None)`` to keep the host's uid, or ``False`` for no OS
    confinement at all: children then only get a scrubbed environment). ``max_workers``
    caps the worker processes of the whole system, running or idle (default: as many idle
    workers as fit in 1/16 of the host's memory at 16 MiB each, and at least
    ``max_running_workers``; e.g. 32 on an 8 GiB host, 96 on 24 GiB).
    ``max_running_workers`` caps the calls running in worker processes at once (default:
    ``max_workers`` when that is given, else 4 per core and at least 32, so that one
    session's default share, half of it, holds a wide turn of 16 parallel calls on a small
    machine); calls beyond it wait, within ``start_timeout_ms``. The rest of the
    ``max_workers`` keeps idle workers: an untrusted tool's worker serves one (tool,
    session) pair only, so more sessions than ``max_running_workers`` each keep theirs warm
    instead of evicting each other's in turn (a full cap retires the longest idle worker
    first). ``worker_idle_s`` is
    how long an untrusted tool's idle worker is kept for its (tool, session) pair, and an idle worker beyond
    ``warm_workers`` of the trusted pool (seconds). ``abandoned_threads_per_tool``
    (of one tool in one session), ``abandoned_threads_per_session`` and
    ``abandoned_threads`` (the system; past it only sessions holding abandoned threads are
    refused) cap the threads of timed-out ``thread`` calls still running: past one, that
    tool's calls in that session are ``unavailable`` until its threads end.
    ``max_workers_per_session`` is one session's share of ``max_running_workers``
    (default: half, at least 1); waiting calls are served fairly across sessions. ``max_timeout_ms``
    bounds every tool's declared timeout (milliseconds; default 10 minutes): a tool
    declaring more is registered with it, and a warning says so (DESIGN §5 "Fair
    shares"). ``start_timeout_ms``: how long a ``process`` call may wait for a worker
    apart from its ``timeout_ms`` (DESIGN §5 "Starting a worker"; default 10 s, or
    ``RHO_ACTORS_START_TIMEOUT_MS``: :func:`rho_actors.sandbox.default_start_timeout_ms`). Raises
    ``ValueError`` naming a bad count, size, time, fair-share setting or ``start_timeout_ms``, and
    ``TypeError`` for a ``governor`` or ``tasks`` of another type, before anything starts
    (:mod:`rho_actors.system.settings_checks`). ``ray``
    says how ``isolation="ray"`` and RayActor servers reach Ray (connecting in the background
    from the start, within ``connect_timeout_s``): ``{"address": ...}`` for a cluster, else a
    local Ray on loopback (``num_cpus``, ``resources``...), stopped with the system; see
    :class:`rho_actors.isolation.ray_tasks.RayRuntime`.
    A tool that raises gives the host its traceback: in the result's host-only
    ``details["traceback"]`` and in an error-level log line (``log_tracebacks=False``
    turns the line off); the model gets one line naming the exception. ``governor``:
    the system's bounds on calls (:class:`rho_actors.GovernorSettings`: ``max_thread_calls``,
    ``max_calls_per_session``, ``max_repeats``; DESIGN §4 "The governor"); ``tasks``: the bounds on background
    calls (:class:`rho_actors.TaskSettings`; DESIGN §4 "Background calls").
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_argument_depth: int = DEFAULT_MAX_ARGUMENT_DEPTH,
        max_schema_depth: int = _decl.DEFAULT_MAX_SCHEMA_DEPTH,
        max_description_chars: int = _decl.DEFAULT_MAX_DESCRIPTION_CHARS,
        max_schema_bytes: int = _decl.DEFAULT_MAX_SCHEMA_BYTES,
        max_schema_nodes: int = _decl.DEFAULT_MAX_SCHEMA_NODES,
        max_turn_result_bytes: int = DEFAULT_MAX_TURN_RESULT_BYTES,
        max_session_result_bytes: int = DEFAULT_MAX_SESSION_RESULT_BYTES,
        shutdown_ms: int = 5_000,
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        untrusted: UntrustedReads | None = None,
        warm_workers: int = 2,
        tracing: bool | Telemetry = True,
        confinement: Confinement | bool | None = None,
        max_workers: int | None = None,
        worker_idle_s: float = 30.0,
        abandoned_threads_per_tool: int = 8,
        abandoned_threads: int = 64,
        ray: Mapping[str, Any] | None = None,
        log_tracebacks: bool = True,
        process_heap_bytes: int = DEFAULT_HEAP_BYTES,
        max_workers_per_session: int | None = None,
        abandoned_threads_per_session: int = 16,
        max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS,
        governor: GovernorSettings | None = None,
        tasks: TaskSettings | None = None,
        start_timeout_ms: int | None = None,
        max_running_workers: int | None = None,
    ) -> None:
        refuse_unguarded_start()  # a child importing an unguarded main script: stop it, saying why
        check_settings(locals())  # before anything starts: a bad one leaves nothing behind
        budgets = ResultBudgets(max_turn_result_bytes, max_session_result_bytes)
        cap, running, share = fair_shares(max_workers, max_running_workers, max_workers_per_session,
                                          abandoned_threads_per_session, max_timeout_ms)
        start_timeout_ms = default_start_timeout_ms() if start_timeout_ms is None else start_timeout_ms
        self._own_data_dir = data_dir is None  # a temporary folder of ours: removed at stop
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="rho_actors-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._sessions_path = self.data_dir / "sessions"  # each session's folder is in it (made on first use)
        self._sessions_dir = self._sessions_path.resolve()
        make_session_dir(str(self._sessions_dir))  # a session's own folder: on first use
        self._tools = ToolSetView()
        self._names, self._owned = Names(), OwnedProcesses()  # the processes its actors own: ended by stop
        self._timers = Timers()
        self._stopped = False
        self._stop_once = StopOnce()
        self.exit_reason: object = None
        """``None`` unless the root supervisor gave up: then its exit reason (a
        :class:`rho_actors.RestartIntensityExceeded` naming the last failure)."""
        self._ask_timeout_s = 60.0
        self._proxies: dict[str, tuple[pykka.ActorRef[Any], Any]] = {}
        self._untrusted = untrusted or UntrustedReads()
        self._declarations = DeclarationState()  # the state of the DeclarationActor and the registry
        self._registry = RegistryState()  # outlives their restarts
        # CallActors and LoopActors run on reused threads: a fresh actor, not a fresh thread.
        self._threads = ThreadPool()
        self._calls = ChildStarter(  # CallActor.start, not start_link: it has no on_start to wait for
            ChildSpec("call", functools.partial(CallActor.start, self._threads), restart="temporary",
                      shutdown=shutdown_ms)
        )
        self._confine = system_policy(confinement, (str(self.data_dir.resolve()),), process_heap_bytes)
        sweep_leftovers()  # what a host killed from outside left behind
        events = EventBus()
        services = IsolationServices(
            self._calls, self._timers, warm_workers, self._untrusted.heap_bytes, process_heap_bytes,
            self._untrusted.start_method,
            max_workers=cap, max_running_workers=running, max_workers_per_session=share,
            threads_per_session=abandoned_threads_per_session,
            confine=self._confine, worker_idle_s=worker_idle_s, tools=self._tools, events=events,
            threads_per_tool=abandoned_threads_per_tool, threads_total=abandoned_threads,
            ray=dict(ray) if ray is not None else None, threads=self._threads, start_timeout_ms=start_timeout_ms,
        )
        hold_servers()
        self._holding = True
        self._runtime = Runtime(
            names=self._names,
            timers=self._timers,
            events=events,
            tools=self._tools,
            calls=self._calls,
            threads=self._threads,
            isolations=start_isolations(services),
            limits=Limits(max_output_chars, max_argument_depth, max_schema_depth, 10.0, max_description_chars,
                          max_schema_bytes, max_schema_nodes, log_tracebacks=bool(log_tracebacks),
                          max_timeout_ms=max_timeout_ms),
            untrusted=self._untrusted,
            telemetry=tracing if isinstance(tracing, Telemetry) else Telemetry(enabled=tracing),
            governor=Governor(governor or GovernorSettings(), self._timers, events, self._threads),
            tasks=TaskRegistry(tasks or TaskSettings(), budgets,
                               functools.partial(events.subscribe, only=(CallEvent,)), owner=self),
            confine=self._confine,
            budgets=budgets,
            sessions=(lazy_sessions := LazyStarter()),  # session subtrees started and stopped in the caller's thread
        )
        self._events = self._runtime.events
        self._telemetry = self._runtime.telemetry
        self._telemetry.bind(uuid.uuid4().hex[:12], self.stats)
        if self._telemetry.enabled:
            self._events.subscribe(self._telemetry.report, only=(SupervisorEvent,))  # counted and traced
        self._observers: list[Observer] = []

        def supervisor(label: str, **kwargs: Any) -> StartChild:
            return StartChild(Supervisor, kwargs={"names": self._names, "label": label, "report": self._events.emit,
                                                  "thread_pool": self._threads, **kwargs})

        self._supervisor = supervisor
        self._shutdown_ms = shutdown_ms
        self._intensity = intensity = {"max_restarts": max_restarts, "max_seconds": max_seconds}
        self._sessions = lazy_sessions
        self._subtrees = SessionSubtrees({**supervisor("").kwargs, **intensity}, shutdown_ms + 1_000)  # a session's
        sessions = dataclasses.replace(supervisor(SESSIONS, starter=self._sessions), actor_class=LazySupervisor)
        children = [
            ChildSpec(DECLARATIONS, StartChild(DeclarationActor, (self._declarations, self._runtime, REGISTRY)),
                      name=DECLARATIONS),
            ChildSpec(REGISTRY, StartChild(ToolRegistry, (self._runtime, self._registry)), name=REGISTRY),
            ChildSpec(CALLS, supervisor(CALLS, starter=self._calls), type="supervisor", name=CALLS,
                      shutdown=shutdown_ms + 1_000),
            # its two pools each wait KILLED_REAP_S at least for their killed workers (their cgroups removed then)
            ChildSpec(WORKERS, StartChild(IsolationOwner, (self._runtime.isolations, shutdown_ms / 1000)), name=WORKERS,
                      shutdown=shutdown_ms + int(2 * KILLED_REAP_S * 1000) + 1_000),
            ChildSpec(SOURCES, supervisor(SOURCES, **intensity), type="supervisor", name=SOURCES,
                      shutdown=shutdown_ms + 1_000),
            # Only temporary children below: nothing is restarted here, so the intensity is moot.
            ChildSpec(SESSIONS, sessions, type="supervisor", name=SESSIONS, shutdown=shutdown_ms + 2_000),
            ChildSpec(SERVERS, supervisor(SERVERS), type="supervisor", name=SERVERS, shutdown=shutdown_ms + 2_000),
        ]
        with self._owned.starting():  # every supervisor below keeps it (rho_actors.otp.owned)
            self._root = start_link(Supervisor, children, names=self._names, label=ROOT, report=self._events.emit,
                                    **intensity)
        monitor(self._root, self._root_down)

    def _root_down(self, _ref: pykka.ActorRef[Any], reason: object) -> None:
        self._stop_once.root_ended.set()
        if reason != NORMAL:
            self.exit_reason = reason
            logger.error("the actor system stopped: its root supervisor exited ({})", reason)
        self._closed()

    def _closed(self) -> None:
        """The tree is down: fail what still waits on it."""
        self._stopped = True
        self._calls.close()
        self._sessions.close()
        self._declarations.closed.set()  # cancels declaration reads in flight
        for waiting in list(self._registry.waiting.values()):
            if not waiting.done():
                waiting.set_exception(RuntimeError("the actor system stopped before the declaration was read"))

    @property
    def confine_policy(self) -> ConfinePolicy:
        """How this system confines children that run untrusted code (workers,
        declaration reads, plugin discovery, selftests; DESIGN §5)."""
        return self._confine

    @property
    def task_registry(self) -> TaskRegistry:
        """The system's background calls (:class:`rho_actors.tasks.TaskRegistry`)."""
        return self._runtime.tasks

    @property
    def timers(self) -> Timers:
        """The system's timer service (``send_after`` for actors)."""
        return self._timers

    # --- loops --------------------------------------------------------------------------

    def start_loop(
        self, session_id: str | None = None, *, withheld: Iterable[str] = (), deps: Any = None,
        tools: Iterable[Any] | None = None, approval: Callable[[CallInfo], Any] | None = None,
        approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S, max_calls_per_session: int | None = None,
        max_repeats: int | None = None) -> Loop:
        """Start one session's subtree under ``sessions``: a session supervisor (the
        system's restart intensity; started at the loop's first crash, :mod:`rho_actors.otp.lazy`)
        over its LoopActor (``transient``: restarted after a crash, with the same arguments,
        started in this thread), and return the :class:`Loop` handle. A session
        whose loop crashes more often than the intensity allows is given up alone: its
        handle then raises :class:`rho_actors.NotRunningError` naming why, and
        ``loop.exit_reason`` is the :class:`rho_actors.RestartIntensityExceeded`. A
        normal stop of the loop ends its subtree too.

        ``session_id`` (default: a new random id) names the session's private folder
        ``data_dir/sessions/<session_id>``; it must match
        ``[A-Za-z0-9_][A-Za-z0-9_.@:-]{0,127}`` without ``..``, so it cannot escape
        ``data_dir`` (``ValueError`` otherwise, and also when a loop of that session is
        running). The folder is created with mode ``0700`` on first use (before the
        session's first call, or by ``loop.data_dir``); one that already exists is
        checked now (``ValueError`` when it, or ``sessions``, is a symlink or no folder)
        and tightened to ``0700``. ``withheld`` names tools this loop does not offer;
        ``deps`` reaches every call of a trusted tool as ``ctx["deps"]`` (untrusted tools
        get the ``deps`` given to :meth:`register`). ``tools`` (default: every registered
        tool) is this loop's allowlist: tool names, tools (by their name) and sources (a
        :class:`SourceHandle` or a source: every tool it serves, now and later); a tool
        off the list is not offered, and a call to it is refused as ``withheld``
        (``TypeError`` for a lone string or an item of another kind). ``approval(call_info) -> bool`` (a
        :class:`CallInfo`) requires a decision for a call it says ``True`` to (or raises for), beside each tool's
        ``requires_approval``; a pending call expires after ``approval_timeout_s`` seconds (DESIGN §4 "Approvals";
        ``TypeError``/``ValueError`` for a bad one). ``max_calls_per_session`` and ``max_repeats``: this session's
        own budget of calls and repeated-call breaker (DESIGN §4 "The governor"), each an ``int`` >= 1, at most the
        system's (``GovernorSettings``: the host's ceiling; ``ValueError`` for a looser one, naming both); ``None``:
        the system's. Raises ``RuntimeError`` once the system has stopped, and :class:`rho_actors.SessionLeaseError`
        naming the session, its folder and the pid holding it when another host serves it (docs: one host a session)."""
        if self._stopped:
            raise RuntimeError("the actor system has stopped")
        bounds = self._runtime.governor.session_bounds(max_calls_per_session, max_repeats)
        session_id = checked_session_id(session_id if session_id is not None else uuid.uuid4().hex)
        running = self._names.whereis(name := loop_name(session_id))
        if running is not None:
            raise ValueError(f"a loop of session {session_id!r} is running: its name is held by {running}")
        session_dir = child_path(self._sessions_path, session_id)  # the pattern admits no separator and no ".."
        found: list[str] = []  # which of them it holds: the first Turns read task records, a transcript only if there
        try:  # an existing folder is checked now: each component a real folder, no symlink followed, 0700
            folder = folder_identity(self.data_dir, "sessions", session_id, names=found,  # None: made on first use
                                     look_for=(records.FOLDER, TRANSCRIPT_NAME))
        except UnsafePathError as exc:
            raise ValueError(f"session {session_id!r} cannot use its folder: {exc}") from None
        kwargs = dict(session_id=session_id, data_dir=session_dir, folder=folder, deps=deps, runtime=self._runtime,
                      at_start=FolderAtStart(frozenset(found)),
                      withheld=SessionWithheld(withheld_names(withheld)), allowed=allowlist(tools),
                      approvals=SessionApprovals(session_id, session_dir, approval, approval_timeout_s),
                      lease=(lease := leased(session_id, session_dir, folder, self)))  # held from here: one host
        start = self._runtime.governor.bounded(session_id, bounds, functools.partial(LoopActor.start, **kwargs))
        ref = self._sessions.start(self._subtrees.make(session_id, start, name))  # its supervisor: at its first crash
        handle = Loop(session_id, session_dir, self._runtime, folder, lease)
        handle.found(ref)  # its first turn needs no look-up by name
        return handle

    # --- sources and selftests -------------------------------------------------------------

    def add_source(self, source: Source, *, trusted: bool = False, poll_s: float | None = 2.0) -> SourceHandle:
        """Serve a source's changing set of tools (a plugin folder, an entry-point group),
        kept in step by a supervised SourceActor polling every ``poll_s`` seconds; its
        tools are untrusted unless ``trusted``. Returns once the first scan is applied.
        See :func:`rho_actors.sources.source_actor.add_source`."""
        from rho_actors.sources.source_actor import add_source

        return add_source(self, source, trusted=trusted, poll_s=poll_s)

    def selftest(self, timeout_s: float = 10.0) -> list[SelftestRow]:
        """Run every offered tool's ``selftest()`` in a throwaway process with its working
        directory, ``TMPDIR`` and ``HOME`` in a fresh temp folder, each within
        ``timeout_s`` seconds; an untrusted tool's is confined as its workers are (scrubbed
        environment, its whole tree bounded to ``UntrustedReads.heap_bytes`` and killed
        after it). See
        :func:`rho_actors.selftest.run_selftests`."""
        from rho_actors.selftest import selftest_system

        return selftest_system(self, timeout_s, confine=self._confine, heap_bytes=self._untrusted.heap_bytes)

    # --- events and state -----------------------------------------------------------------

    def subscribe(self, callback: Callable[[Any], None], *, only: tuple[type, ...] | None = None
                  ) -> Callable[[], None]:
        """Call ``callback(event)`` for every :class:`rho_actors.CallEvent`, :class:`rho_actors.DeclarationEvent`,
        :class:`rho_actors.SupervisorEvent`, :class:`rho_actors.IsolationEvent`, :class:`rho_actors.ProgressEvent`
        and :class:`rho_actors.ToolSetChanged` (from actor threads: keep it quick), or only for those of the
        types in ``only`` (a subscriber without ``CallEvent`` in it spares every call building its
        events). Returns a function that unsubscribes."""
        return self._events.subscribe(callback, only=only)

    @property
    def telemetry(self) -> Telemetry:
        """The system's OpenTelemetry settings (see :mod:`rho_actors.telemetry`)."""
        return self._telemetry

    def worker_pids(self) -> list[int]:
        """The pids of the isolations' worker processes alive now (``process`` isolation's; [] before a call)."""
        return [pid for isolation in self._runtime.isolations.values() for pid in isolation.pids()]

    def observe(self, address: str | Path | int, *, interval_s: float = 1.0, **bounds: Any) -> Observer:
        """Serve a read-only live view of this system (see :mod:`rho_actors.observe.observer`): ``address`` is a Unix
        socket path, or a TCP port on 127.0.0.1 (``0``: any free one) that asks viewers for the returned observer's
        ``token``. Each viewer gets a snapshot every ``interval_s`` seconds and every call event and supervisor
        report as newline-delimited JSON; ``rho-actors top --connect ADDRESS`` shows it. Off until called; closed at
        :meth:`stop` (or with ``observer.close()``). ``bounds``: the observer's ``max_queued``,
        ``max_unauthenticated`` and ``token_deadline_s`` (see :class:`~rho_actors.observe.observer.Observer`).
        Raises ``OSError`` when the address cannot be bound, ``TypeError``/``ValueError`` for a bad bound."""
        from rho_actors.observe.observer import Observer

        observer = Observer(self, address, interval_s=interval_s, **bounds)
        self._observers.append(observer)
        return observer

    def stats(self) -> dict[str, Any]:
        """Counters: ``abandoned_threads_running`` (thread calls cancelled at their deadline or at a stop whose thread
        has not returned yet), ``abandoned_threads_total``, the worker pools' as ``workers_<name>`` and
        ``untrusted_workers_<name>`` (see :meth:`rho_actors.sandbox.WorkerPool.stats`), ``workers_cap``: each
        isolation's counters. ``bounds``: the ``max_*`` bounds of declarations; ``budgets``:
        :meth:`rho_actors.runtime.ResultBudgets.stats`; ``governor``: running, queued, refused per reason
        (:meth:`rho_actors.governor.Governor.stats`). ``confinement``: what confines untrusted workers here:
        ``{"active": [mechanism...], "memory_bound": "cgroup" | "sampler" | "none", "uid": int | None, "network":
        bool (whether workers share the host's network), "disk_bytes": int | None (the private folder's bound),
        "missing": [sentence...] (mechanisms asked for that this host lacks: each also a warning and an
        ``IsolationEvent``), "trusted_process": {"tree_kill": bool, "memory_bound": "cgroup" | "sampler" |
        "rlimit_as"}, <mechanism>: {"available", "reason"}}`` (:func:`rho_actors.sandbox.confine.confinement.probe`)."""
        return self._runtime.stats()

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """Whether the system has stopped: by :meth:`stop`, or because the root
        supervisor gave up (then :attr:`exit_reason` holds why)."""
        return self._stopped

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the tree in reverse start order (servers, sessions, sources, workers, calls, registry, declarations),
        then the timers. Running calls are cancelled; a call thread still running after ``shutdown_ms`` is abandoned
        (counted in :meth:`stats`). Worker processes are killed and their cgroups and private folders removed
        before it returns (within ``shutdown_ms``, at least 2 s); a system never stopped has its workers' removed
        as the interpreter exits. Untrusted declaration reads under way are cancelled (their processes killed) and
        their threads waited for, within ``timeout_s`` in all: none runs on once it returned. A tree not stopped
        within ``timeout_s`` (``0`` too) has its worker processes, and its servers' (stateful and MCP servers), killed
        here all the same. Idempotent: a stop called while another runs returns once that one has."""
        self._stop_once.run(functools.partial(self._stop, timeout_s))

    def _stop(self, timeout_s: float) -> None:
        # no task starts, each open one is cancelled (one whose call waits for a decision is kept, to be taken back)
        self._runtime.tasks.stop(self._shutdown_ms / 1000, keep_held=not self._own_data_dir)
        self._calls.close()  # a call dispatched from now on does not start
        for isolation in self._runtime.isolations.values():  # a tool stopping the system: its thread is not waited
            isolation.stopping_from_here()
        for observer in self._observers:
            observer.close()
        self._telemetry.unbind()
        until, stopped = time.monotonic() + timeout_s, False
        try:  # False: stopping already (a stop interrupted before) or stopped: its end is waited for too
            stopped = self._root.stop(block=True, timeout=timeout_s) or self._stop_once.root_ended.wait(
                max(0.0, until - time.monotonic()))
            if not stopped:
                logger.error("the actor system did not stop within {} s", timeout_s)
        except pykka.ActorDeadError:
            stopped = True
        except pykka.Timeout:
            logger.error("the actor system did not stop within {} s", timeout_s)
        finally:  # (an interrupt too) the workers actor may not have stopped: no worker outlives the stop
            if not stopped:
                end_workers(self._runtime.isolations.values(), max(0.0, until - time.monotonic()), self._owned)
        self._closed()
        release_all(self)  # every session's lease (a loop not stopped in time, a session given up, too)
        self._timers.stop()
        left = self._declarations.helpers.wait(max(0.0, until - time.monotonic()))  # reads cancelled by _closed
        if left:
            logger.warning("{} declaration read or delivery threads still running at the stop are abandoned", len(left))
        self._threads.shutdown()
        if self._holding:
            self._holding = False
            release_servers()
        if self._own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        running = self.stats().get("abandoned_threads_running", 0)
        if running:
            logger.warning("{} abandoned call threads are still running", running)

    def __enter__(self) -> ActorSystem:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
