"""The ActorSystem: the root of a host's tool-call runtime (DESIGN §6).

It starts, in this order, a timer service and the actors of the tree::

    ActorSystem (root)
    ├── DeclarationActor    checked-declaration cache
    ├── ToolRegistry        registered tools; publishes the tool set loops read
    ├── CallSupervisor      CallActors (temporary: a crash is a result)
    └── LoopSupervisor      LoopActors, one per session

and stops them in reverse order. Example::

    with ActorSystem(data_dir="/tmp/agent") as system:
        system.register(add)
        loop = system.start_loop("session-1")
        [result] = loop.run_turn([ToolCall("c1", "add", '{"a": 1, "b": 2}')])
        assert result.ok and result.content == "3"
"""

from __future__ import annotations

import re
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import pykka
from loguru import logger

from rho_actors.arguments import DEFAULT_MAX_ARGUMENT_DEPTH
from rho_actors.call import AbandonedThreads, CallActor
from rho_actors.declarations import DEFAULT_MAX_SCHEMA_DEPTH, DeclarationActor
from rho_actors.encoding import DEFAULT_MAX_OUTPUT_CHARS
from rho_actors.events import CallEvent, EventBus
from rho_actors.loop import Loop, LoopActor, LoopSettings
from rho_actors.registry import Registration, ToolRegistry, ToolSetView
from rho_actors.supervisor import DynamicSupervisor, Spares, StartChild
from rho_actors.timers import Timers
from rho_actors.tool import ToolInfo, missing_callbacks

__all__ = ["ActorSystem"]

_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@:-]{0,127}")


class ActorSystem:
    """A supervised runtime for tool calls. Use it as a context manager, or call
    :meth:`stop` when done.

    Arguments: ``data_dir`` holds one private folder per session (default: a new
    temporary folder); ``max_output_chars`` caps each result's text (characters);
    ``max_argument_depth`` and ``max_schema_depth`` bound nesting of call arguments and
    parameter schemas; ``shutdown_ms`` is how long running calls get to stop on
    :meth:`stop` (milliseconds) before their threads are abandoned; ``spare_calls``
    CallActors are kept started ahead of need (each still runs exactly one call), which
    takes a thread start off each call's path.
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
    ) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="rho_actors-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._sessions_dir = (self.data_dir / "sessions").resolve()
        self._settings = LoopSettings(max_output_chars, max_argument_depth)
        self._events = EventBus()
        self._abandoned = AbandonedThreads()
        self._tools = ToolSetView()
        self._timers = Timers()
        self._stopped = False
        self._ask_timeout_s = 60.0
        self._declarations = DeclarationActor.start(max_schema_depth)
        self._registry: pykka.ActorRef[ToolRegistry] = ToolRegistry.start(self._declarations, self._tools)
        self._calls = DynamicSupervisor.start("CallSupervisor", shutdown_ms, StartChild(CallActor), spare_calls)
        self._spare_calls: Spares = self._calls.proxy().spare_pool.get(timeout=self._ask_timeout_s)
        self._loops = DynamicSupervisor.start("LoopSupervisor", shutdown_ms)

    # --- tools --------------------------------------------------------------------------

    def register(self, tool: Any, *, origin: str | None = None) -> Registration:
        """Register a trusted tool (a module, class or object with the callbacks of
        DESIGN §2). Its declaration is read and checked once; one that fails is left
        out of what loops offer (see :attr:`Registration.reason`, also logged once).

        ``origin`` names where the tool comes from in messages (default: its module,
        qualified name, file and line). Raises ``TypeError`` when ``tool`` lacks a
        required callback, and :class:`rho_actors.DuplicateToolError` when another
        registered tool has its name.
        """
        missing = missing_callbacks(tool)
        if missing:
            raise TypeError(f"{tool!r} is not a tool: it lacks {', '.join(missing)}")
        registration: Registration = self._registry.proxy().register(tool, origin).get(timeout=self._ask_timeout_s)
        return registration

    def unregister(self, name_or_tool: Any) -> bool:
        """Remove a tool (by name or object); loops stop offering it from their next
        turn, and a call naming it gets an ``unavailable`` error. Returns whether a tool
        was removed."""
        removed: bool = self._registry.proxy().unregister(name_or_tool).get(timeout=self._ask_timeout_s)
        return removed

    def registrations(self) -> list[Registration]:
        """Every registered tool, offered or left out, in registration order."""
        result: list[Registration] = self._registry.proxy().registrations().get(timeout=self._ask_timeout_s)
        return result

    def tools(self) -> list[ToolInfo]:
        """The checked declarations of every tool that can be offered."""
        return [entry.info for entry in self._tools.current.entries.values()]

    # --- loops --------------------------------------------------------------------------

    def start_loop(self, session_id: str | None = None, *, withheld: Iterable[str] = (), deps: Any = None) -> Loop:
        """Start a LoopActor for one session and return its :class:`Loop` handle.

        ``session_id`` (default: a new random id) names the session's private folder
        ``data_dir/sessions/<session_id>``; it must match
        ``[A-Za-z0-9_][A-Za-z0-9_.@:-]{0,127}``, so it cannot escape ``data_dir``
        (``ValueError`` otherwise). ``withheld`` names tools this loop does not offer;
        ``deps`` reaches every call as ``ctx["deps"]``. Raises ``RuntimeError`` once
        the system has stopped.
        """
        if self._stopped:
            raise RuntimeError("the actor system has stopped")
        session_id = session_id if session_id is not None else uuid.uuid4().hex
        if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id) or ".." in session_id:
            raise ValueError(
                f"session id {session_id!r} is not allowed: use 1-128 of A-Z a-z 0-9 _ . @ : -, "
                "starting with a letter, digit or _, and no '..'"
            )
        session_dir = self._sessions_dir / session_id  # the pattern admits no separator and no ".."
        session_dir.mkdir(parents=True, exist_ok=True)
        kwargs = dict(
            session_id=session_id,
            data_dir=session_dir,
            deps=deps,
            withheld=frozenset(withheld),
            tools=self._tools,
            calls=self._spare_calls,
            timers=self._timers,
            events=self._events,
            abandoned=self._abandoned,
            settings=self._settings,
        )
        ref: pykka.ActorRef[LoopActor] = self._loops.ask(
            StartChild(LoopActor, kwargs=kwargs), block=True, timeout=self._ask_timeout_s
        )
        return Loop(ref, session_id, session_dir, self._tools, self._settings)

    # --- events and state -----------------------------------------------------------------

    def subscribe(self, callback: Callable[[CallEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every :class:`CallEvent` (from actor threads:
        keep it quick). Returns a function that unsubscribes."""
        return self._events.subscribe(callback)

    def stats(self) -> dict[str, int]:
        """Counters: ``abandoned_threads_running`` (thread calls cancelled at their
        deadline or at a stop whose thread has not returned yet) and
        ``abandoned_threads_total``."""
        return {
            "abandoned_threads_running": self._abandoned.running,
            "abandoned_threads_total": self._abandoned.total,
        }

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every actor in reverse start order (loops, calls, registry, declarations),
        then the timers. Running calls are cancelled; a call thread still running after
        ``shutdown_ms`` is abandoned (counted in :meth:`stats`). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for ref in (self._loops, self._calls, self._registry, self._declarations):
            try:
                ref.stop(timeout=timeout_s)
            except pykka.ActorDeadError:
                pass
            except pykka.Timeout:
                logger.error("{} did not stop within {} s", ref, timeout_s)
        self._timers.stop()
        if self._abandoned.running:
            logger.warning("{} abandoned call threads are still running", self._abandoned.running)

    def __enter__(self) -> ActorSystem:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

