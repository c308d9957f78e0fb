"""The ActorSystem: the root of a host's tool-call runtime (DESIGN §6).

Its supervision tree, started in this order and stopped in reverse::

    root                    Supervisor, one_for_one
    ├── declarations        DeclarationActor      permanent  checked declarations, retry timers
    ├── registry            ToolRegistry          permanent  tools; publishes the tool set
    ├── calls               Supervisor            permanent  CallActors: temporary
    ├── workers             WorkerPoolActor       permanent  processes for ``process`` isolation
    ├── loops               Supervisor            permanent  LoopActors: transient
    └── servers             Supervisor            permanent  the host's own children

The state of the DeclarationActor and of the registry is kept by the system, so either
one restarted by the root loses no tool and no checked declaration; calls in flight do
not depend on them. A failure escalating past the root's restart intensity stops the
system, with the reason logged and kept in :attr:`ActorSystem.exit_reason`.

Example::

    with ActorSystem(data_dir="/tmp/agent") as system:
        system.register(add)
        loop = system.start_loop("session-1")
        [result] = loop.run_turn([ToolCall("c1", "add", '{"a": 1, "b": 2}')])
        assert result.ok and result.content == "3"
"""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pykka
from loguru import logger

from rho_actors.actor import NORMAL, Names, monitor, start_link
from rho_actors.arguments import DEFAULT_MAX_ARGUMENT_DEPTH
from rho_actors.call import AbandonedThreads, CallActor
from rho_actors.declarations import (
    DECLARATIONS,
    DEFAULT_MAX_SCHEMA_DEPTH,
    DeclarationActor,
    DeclarationState,
    UntrustedReads,
    describe_origin,
)
from rho_actors.encoding import DEFAULT_MAX_OUTPUT_CHARS
from rho_actors.events import EventBus
from rho_actors.files import UnsafePathError, private_dir
from rho_actors.loop import Loop, LoopActor, LoopSettings, loop_name, withheld_names
from rho_actors.registry import (
    ISOLATIONS,
    Isolation,
    Registration,
    RegistryState,
    ToolRegistry,
    ToolSet,
    ToolSetView,
)
from rho_actors.supervisor import ChildInfo, ChildSpec, Spares, StartChild, Supervisor
from rho_actors.timers import Timers
from rho_actors.tool import ToolInfo, is_untrusted, missing_callbacks
from rho_actors.workers import WorkerPoolActor, Workers

if TYPE_CHECKING:
    from rho_actors.selftest import SelftestRow
    from rho_actors.sources import Source, SourceHandle

__all__ = ["ActorSystem"]

_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@:-]{0,127}")
REGISTRY, CALLS, WORKERS, LOOPS, SERVERS, ROOT = "registry", "calls", "workers", "loops", "servers", "root"


class ActorSystem:
    """A supervised runtime for tool calls. Use it as a context manager, or call
    :meth:`stop` when done.

    Arguments: ``data_dir`` holds one private folder per session (default: a new
    temporary folder, removed at :meth:`stop`); ``max_output_chars`` caps each result's text (characters);
    ``max_argument_depth`` and ``max_schema_depth`` bound nesting of call arguments and
    parameter schemas; ``shutdown_ms`` is how long running calls get to stop on
    :meth:`stop` (milliseconds) before their threads are abandoned; ``spare_calls``
    CallActors are kept started ahead of need (each still runs exactly one call), which
    takes a thread start off each call's path; ``max_restarts`` in ``max_seconds`` is
    the restart intensity of the root and of the loops' supervisor; ``untrusted`` says
    how untrusted declarations are read (time and heap bounds, retry schedule, start
    method; see :class:`rho_actors.UntrustedReads`); ``warm_workers`` worker processes are
    kept for ``process`` isolation once it is first used, each under the same heap bound.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_argument_depth: int = DEFAULT_MAX_ARGUMENT_DEPTH,
        max_schema_depth: int = DEFAULT_MAX_SCHEMA_DEPTH,
        shutdown_ms: int = 5_000,
        spare_calls: int = 4,
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        untrusted: UntrustedReads | None = None,
        warm_workers: int = 2,
    ) -> None:
        self._own_data_dir = data_dir is None  # a temporary folder of ours: removed at stop
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="rho_actors-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._sessions_dir = (self.data_dir / "sessions").resolve()
        self._settings = LoopSettings(max_output_chars, max_argument_depth)
        self._events = EventBus()
        self._abandoned = AbandonedThreads()
        self._tools = ToolSetView()
        self._names = Names()
        self._timers = Timers()
        self._stopped = False
        self.exit_reason: object = None
        self._ask_timeout_s = 60.0
        self._untrusted = untrusted or UntrustedReads()
        self._declarations = DeclarationState()  # the state of the DeclarationActor and the registry
        self._registry = RegistryState()  # outlives their restarts
        self._workers = Workers(warm_workers, self._untrusted.heap_bytes, self._untrusted.start_method)
        self._call_spares = Spares(  # CallActor.start, not start_link: it has no on_start to wait for
            ChildSpec("call", CallActor.start, restart="temporary", shutdown=shutdown_ms), spare_calls
        )

        def supervisor(label: str, **kwargs: Any) -> StartChild:
            return StartChild(Supervisor, kwargs={"names": self._names, "label": label, **kwargs})

        intensity = {"max_restarts": max_restarts, "max_seconds": max_seconds}
        children = [
            ChildSpec(DECLARATIONS, StartChild(DeclarationActor, (
                self._declarations, self._names, REGISTRY, max_schema_depth, self._untrusted, self._timers,
                self._events,
            )), name=DECLARATIONS),
            ChildSpec(REGISTRY, StartChild(ToolRegistry, (self._names, self._tools, self._registry)), name=REGISTRY),
            ChildSpec(CALLS, supervisor(CALLS, spares=self._call_spares), type="supervisor", name=CALLS,
                      shutdown=shutdown_ms + 1_000),
            ChildSpec(WORKERS, StartChild(WorkerPoolActor, (self._workers,)), name=WORKERS, shutdown=shutdown_ms),
            ChildSpec(LOOPS, supervisor(LOOPS, **intensity), type="supervisor", name=LOOPS,
                      shutdown=shutdown_ms + 1_000),
            ChildSpec(SERVERS, supervisor(SERVERS), type="supervisor", name=SERVERS, shutdown=shutdown_ms + 1_000),
        ]
        self._root = start_link(Supervisor, children, names=self._names, label=ROOT, **intensity)
        monitor(self._root, self._root_down)

    def _root_down(self, _ref: pykka.ActorRef[Any], reason: object) -> None:
        if reason != NORMAL:
            self.exit_reason = reason
            logger.error("the actor system stopped: its root supervisor exited ({})", reason)
        self._closed()

    def _closed(self) -> None:
        """The tree is down: fail what still waits on it."""
        self._stopped = True
        self._call_spares.close()
        self._declarations.closed.set()  # cancels declaration reads in flight
        for waiting in list(self._registry.waiting.values()):
            if not waiting.done():
                waiting.set_exception(RuntimeError("the actor system stopped before the declaration was read"))

    def _whereis(self, name: str) -> pykka.ActorRef[Any]:
        ref = self._names.whereis(name)
        if ref is None:
            state = f"stopped ({self.exit_reason})" if self._stopped else "restarting"
            raise RuntimeError(f"the system's {name!r} actor is not running: the system is {state}")
        return ref

    # --- tools --------------------------------------------------------------------------

    def register(
        self, tool: Any, *, origin: str | None = None, untrusted: bool = False, isolation: Isolation | None = None
    ) -> Registration:
        """Register a tool (a module, class or object with the callbacks of DESIGN §2).
        Its declaration is read and checked once; one that fails is left out of what
        loops offer (see :attr:`Registration.reason`, also logged once).

        A trusted tool is read in the DeclarationActor's thread. An untrusted one
        (``untrusted=True``, or marked with :func:`rho_actors.untrusted`) is read in a
        throwaway process within the time and heap bounds of ``untrusted`` reads; this
        returns when that first read is done (a read that ran over leaves the tool out
        for now and is retried on the schedule). ``isolation`` is where its calls run:
        ``"thread"`` (the default for trusted tools) or ``"process"`` (the default for
        untrusted ones). ``origin`` names where the tool comes from in messages (default:
        its module, qualified name, file and line).

        No code of an untrusted tool runs in this process: not even an attribute lookup
        (a missing callback shows in its declaration check, or as the call's error).

        Raises ``TypeError`` when a trusted ``tool`` lacks a required callback,
        ``ValueError`` for an unknown isolation, :class:`rho_actors.DuplicateToolError`
        when another registered tool has its name, and ``RuntimeError`` when the system
        stops while an untrusted declaration is being read.
        """
        if isolation is not None and isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        untrusted = untrusted or is_untrusted(tool)
        missing = [] if untrusted else missing_callbacks(tool)
        if missing:
            raise TypeError(f"{describe_origin(tool)} is not a tool: it lacks {', '.join(missing)}")
        registry = self._whereis(REGISTRY).proxy()
        answer = registry.register(tool, origin, untrusted, isolation).get(timeout=self._ask_timeout_s)
        if isinstance(answer, Registration):
            return answer
        registration: Registration = answer.result(timeout=self._untrusted.timeout_s + self._ask_timeout_s)
        return registration

    def unregister(self, name_or_tool: Any) -> bool:
        """Remove a tool (by name or object); loops stop offering it from their next
        turn, and a call naming it gets an ``unavailable`` error. Returns whether a tool
        was removed."""
        removed: bool = self._whereis(REGISTRY).proxy().unregister(name_or_tool).get(timeout=self._ask_timeout_s)
        return removed

    def registrations(self) -> list[Registration]:
        """Every registered tool, offered or left out, in registration order."""
        result: list[Registration] = self._whereis(REGISTRY).proxy().registrations().get(timeout=self._ask_timeout_s)
        return result

    def tool_set(self) -> ToolSet:
        """The registry's current :class:`rho_actors.registry.ToolSet` (immutable:
        entries with their tools, isolation and declarations; a ``version`` that grows
        with every change)."""
        return self._tools.current

    @property
    def timers(self) -> Timers:
        """The system's timer service (``send_after`` for actors)."""
        return self._timers

    def tools(self) -> list[ToolInfo]:
        """The checked declarations of every tool that can be offered."""
        return [entry.info.copy() for entry in self._tools.current.entries.values()]

    # --- loops --------------------------------------------------------------------------

    def start_loop(self, session_id: str | None = None, *, withheld: Iterable[str] = (), deps: Any = None) -> Loop:
        """Start a LoopActor for one session (a ``transient`` child: restarted after a
        crash, with the same arguments) and return its :class:`Loop` handle.

        ``session_id`` (default: a new random id) names the session's private folder
        ``data_dir/sessions/<session_id>``; it must match
        ``[A-Za-z0-9_][A-Za-z0-9_.@:-]{0,127}`` without ``..``, so it cannot escape
        ``data_dir`` (``ValueError`` otherwise, and also when a loop of that session is
        running). ``withheld`` names tools this loop does not offer; ``deps`` reaches
        every call as ``ctx["deps"]``. Raises ``RuntimeError`` once the system has stopped.
        """
        if self._stopped:
            raise RuntimeError("the actor system has stopped")
        session_id = session_id if session_id is not None else uuid.uuid4().hex
        if isinstance(session_id, str):
            session_id = str.__str__(session_id)  # an exact copy: a subclass's methods cannot lie
        if type(session_id) is not str or not _SESSION_ID.fullmatch(session_id) or ".." in session_id:
            raise ValueError(
                f"session id {session_id!r} is not allowed: use 1-128 of A-Z a-z 0-9 _ . @ : -, "
                "starting with a letter, digit or _, and no '..'"
            )
        try:  # each component a real folder, no symlink followed, created 0700
            session_dir = private_dir(self.data_dir, "sessions", session_id)
        except UnsafePathError as exc:
            raise ValueError(f"session {session_id!r} cannot use its folder: {exc}") from None
        kwargs = dict(
            session_id=session_id,
            data_dir=session_dir,
            deps=deps,
            withheld=withheld_names(withheld),
            tools=self._tools,
            calls=self._call_spares,
            workers=self._workers,
            timers=self._timers,
            events=self._events,
            abandoned=self._abandoned,
            settings=self._settings,
            whereis=self._names.whereis,
        )
        spec = ChildSpec(session_id, StartChild(LoopActor, kwargs=kwargs), restart="transient",
                         name=loop_name(session_id))
        self._whereis(LOOPS).proxy().start_child(spec).get(timeout=self._ask_timeout_s)
        return Loop(session_id, session_dir, self._names.whereis, self._tools, self._settings)

    # --- sources and selftests -------------------------------------------------------------

    def add_source(self, source: Source, *, trusted: bool = False, poll_s: float | None = 2.0) -> SourceHandle:
        """Serve a source's changing set of tools (a plugin folder, an entry-point group),
        kept in step by a supervised SourceActor polling every ``poll_s`` seconds; its
        tools are untrusted unless ``trusted``. Returns once the first scan is applied.
        See :func:`rho_actors.sources.add_source`."""
        from rho_actors.sources import add_source

        return add_source(self, source, trusted=trusted, poll_s=poll_s)

    def selftest(self, timeout_s: float = 10.0) -> list[SelftestRow]:
        """Run every offered tool's ``selftest()`` in a throwaway process with its working
        directory, ``TMPDIR`` and ``HOME`` in a fresh temp folder, each within
        ``timeout_s`` seconds. See :func:`rho_actors.selftest.run_selftests`."""
        from rho_actors.selftest import selftest_system

        return selftest_system(self, timeout_s)

    # --- the host's own actors ------------------------------------------------------------

    def start_child(self, spec: ChildSpec) -> pykka.ActorRef[Any]:
        """Start one of the host's actors (a stateful tool server, say) under the
        ``servers`` supervisor (``one_for_one``); with ``spec.name`` it can be found
        with :meth:`whereis` (and from a tool, with ``ctx["whereis"]``). Returns its ref;
        raises the start error of the child."""
        ref: pykka.ActorRef[Any] = self._whereis(SERVERS).proxy().start_child(spec).get(timeout=self._ask_timeout_s)
        return ref

    def whereis(self, name: str) -> pykka.ActorRef[Any] | None:
        """The live ref of the actor registered as ``name`` (it follows restarts), or None."""
        return self._names.whereis(name)

    def tree(self) -> dict[str, Any]:
        """The live supervision tree as plain data. Each node: ``id``, ``kind``
        (``"supervisor"`` or ``"worker"``), ``restart``, ``restarts``, ``alive``;
        supervisors add ``strategy`` and ``children``; the ``calls`` supervisor gives
        ``running`` and ``spares`` counts instead of a node per call; loops add
        ``running``: their calls with ``tool`` and ``ms_left`` to the deadline."""
        node: dict[str, Any] = {"id": ROOT, "kind": "supervisor", "restart": "permanent", "restarts": 0,
                                "alive": self._root.is_alive()}
        return self._describe(self._root, node)

    def _describe(self, ref: pykka.ActorRef[Any] | None, node: dict[str, Any]) -> dict[str, Any]:
        if ref is None or not node["alive"]:
            return node
        try:
            if node["kind"] == "supervisor":
                proxy = ref.proxy()
                node["strategy"] = proxy.strategy.get(timeout=self._ask_timeout_s)
                children: list[ChildInfo] = proxy.which_children().get(timeout=self._ask_timeout_s)
                if node["id"] == CALLS:
                    node["running"] = sum(c.alive for c in children) - len(self._call_spares)
                    node["spares"] = len(self._call_spares)
                    return node
                node["children"] = [
                    self._describe(c.ref, {"id": c.id, "kind": c.type, "restart": c.restart,
                                           "restarts": c.restarts, "alive": c.alive})
                    for c in children
                ]
            elif issubclass(ref.actor_class, LoopActor):
                loop = Loop(node["id"], self._sessions_dir / node["id"], self._names.whereis, self._tools,
                            self._settings)
                node["running"] = loop.running()
        except (pykka.ActorDeadError, pykka.Timeout):
            node["alive"] = False
        return node

    # --- events and state -----------------------------------------------------------------

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every :class:`CallEvent` and
        :class:`DeclarationEvent` (from actor threads: keep it quick). Returns a function
        that unsubscribes."""
        return self._events.subscribe(callback)

    def stats(self) -> dict[str, int]:
        """Counters: ``abandoned_threads_running`` (thread calls cancelled at their
        deadline or at a stop whose thread has not returned yet),
        ``abandoned_threads_total``, and the worker pool's as ``workers_<name>`` (see
        :meth:`rho_actors.sandbox.WorkerPool.stats`)."""
        return {
            "abandoned_threads_running": self._abandoned.running,
            "abandoned_threads_total": self._abandoned.total,
            **{f"workers_{k}": v for k, v in self._workers.stats().items()},
        }

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """Whether the system has stopped (by :meth:`stop`, or a failure past the root)."""
        return self._stopped

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the tree in reverse start order (servers, loops, calls, registry,
        declarations), then the timers. Running calls are cancelled; a call thread still
        running after ``shutdown_ms`` is abandoned (counted in :meth:`stats`). Idempotent."""
        self._call_spares.close()  # a call dispatched from now on does not start
        try:
            self._root.stop(timeout=timeout_s)
        except pykka.ActorDeadError:
            pass
        except pykka.Timeout:
            logger.error("the actor system did not stop within {} s", timeout_s)
        self._closed()
        self._timers.stop()
        if self._own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        if self._abandoned.running:
            logger.warning("{} abandoned call threads are still running", self._abandoned.running)

    def __enter__(self) -> ActorSystem:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
