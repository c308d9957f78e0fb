"""The DeclarationActor: the owner of checked declarations and their retry timers
(DESIGN §3, §6: permanent), with its durable state and its messages.

The checks themselves are :func:`rho_actors.declarations.checks.check_declaration` and
:func:`rho_actors.declarations.checks.read_declaration`; an untrusted tool is read in a
throwaway process (:func:`rho_actors.sandbox.read_declaration_isolated`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loguru import logger

from rho_actors.declarations.checked import CheckedCache
from rho_actors.declarations.checks import (
    DeclarationError,
    Rejected,
    check_declaration,
    describe_origin,
    read_declaration,
)
from rho_actors.encoding import describe_exception
from rho_actors.events import DeclarationEvent
from rho_actors.otp.actor import Actor
from rho_actors.sandbox import IsolatedReadError, WorkerSlots, raw_declaration, read_declaration_isolated
from rho_actors.tool import ToolInfo

if TYPE_CHECKING:
    from rho_actors.runtime import Runtime, UntrustedReads
    from rho_actors.sandbox import ConfinePolicy

__all__ = [
    "DECLARATIONS",
    "Checked",
    "DeclarationActor",
    "DeclarationState",
    "ReadUntrusted",
]


DECLARATIONS = "declarations"
"""The name the DeclarationActor is registered under in its system."""


@dataclass(frozen=True, slots=True)
class Checked:
    """Told by the DeclarationActor to the registry: an untrusted tool's declaration was
    read and checked (``outcome``), or the read failed (a :class:`Rejected`)."""

    tool: Any
    outcome: ToolInfo | Rejected


@dataclass(frozen=True, slots=True)
class ReadUntrusted:
    """Asked of the DeclarationActor by the registry: read this untrusted tool."""

    tool: Any


@dataclass(frozen=True, slots=True)
class _ReadDone:
    tool: Any
    outcome: ToolInfo | Rejected
    timed_out: bool
    retry: int


@dataclass(frozen=True, slots=True)
class _Retry:
    tool: Any
    retry: int


class HelperThreads:
    """The threads the DeclarationActor starts (each untrusted read's, each delivery to
    another actor), kept until they end, so that the system's stop waits for them
    (:meth:`wait`): none of them runs on once ``stop()`` returned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()

    def start(self, target: Callable[..., Any], args: tuple[Any, ...], name: str,
              kwargs: dict[str, Any] | None = None) -> None:
        """Run ``target(*args, **kwargs)`` in a daemon thread named ``name``, kept here
        (raises as ``Thread.start`` does: ``RuntimeError`` at the host's thread limit)."""
        thread = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive() or t.ident is None}  # (None: not begun yet)
            self._threads.add(thread)
        try:
            thread.start()
        except BaseException:
            if thread.ident is None:  # it never began
                with self._lock:
                    self._threads.discard(thread)
            raise

    def wait(self, timeout_s: float) -> list[threading.Thread]:
        """Wait, at most ``timeout_s`` seconds in all, for every thread started here
        (and any started meanwhile; not the calling thread) to end; those still running."""
        until = time.monotonic() + timeout_s
        while True:
            with self._lock:
                self._threads = {t for t in self._threads if t.is_alive() or t.ident is None}
                running = [t for t in self._threads if t is not threading.current_thread()]
            if not running or time.monotonic() >= until:
                return running
            begun = [t for t in running if t.ident is not None]
            for thread in begun:
                thread.join(max(0.0, until - time.monotonic()))
            if not begun:  # being started this instant
                time.sleep(0.001)


@dataclass
class DeclarationState:
    """The DeclarationActor's durable state, kept by the system (as an OTP process keeps
    an ETS table with an heir): ``cache`` (tool -> checked outcome, a
    :class:`~rho_actors.declarations.checked.CheckedCache`), ``reading`` (tool id -> tool, the
    untrusted tools whose reads or retries are wanted),
    ``closed``, set when the system stops: in-flight reads are then cancelled, and
    ``helpers``, the threads of its reads and deliveries (:class:`HelperThreads`), which
    the system's stop waits for once it set ``closed``."""

    cache: CheckedCache[ToolInfo | Rejected] = field(default_factory=CheckedCache)
    reading: dict[int, Any] = field(default_factory=dict)
    closed: threading.Event = field(default_factory=threading.Event)
    helpers: HelperThreads = field(default_factory=HelperThreads)


class DeclarationActor(Actor):
    """Owns the checked-declaration cache and the retry timers (DESIGN §3, §6: permanent).

    A trusted tool's declaration is read in this actor's thread (:meth:`check`); an
    untrusted tool's in a throwaway process (:meth:`read_untrusted`, in a helper thread
    that waits for it), the outcome then told, as :class:`Checked`, to the actor named
    ``notify`` (the registry). Each outcome is kept for the tool's life: until
    :meth:`forget` (unregistration) or a re-read (a re-registration: its code may have
    changed). A rejection's reason is logged once, when it is found. A read that ran
    over its time bound is retried on the :class:`UntrustedReads` schedule. Its state
    is a :class:`DeclarationState` kept by the system, and every message to it or from
    it goes by name, so a restarted DeclarationActor (or registry) loses no checked
    declaration, no read in flight and no retry. Events: ``read``, ``rejected``,
    ``retry``, ``excluded``.
    """

    def __init__(self, state: DeclarationState, runtime: Runtime, notify: str) -> None:
        super().__init__()
        self._state = state
        self._cache = state.cache
        self._names = runtime.names
        self._notify = notify
        self._bounds = runtime.limits.declaration_bounds()
        self._untrusted = runtime.untrusted
        self._confine = runtime.confine
        # reads take places under the worker cap, as workers do (the process isolation's)
        self._slots: WorkerSlots | None = getattr(runtime.isolations.get("process"), "slots", None)
        self._timers = runtime.timers
        self._events = runtime.events

    def check(self, tool: Any, fresh: bool = False) -> ToolInfo | Rejected:
        """The trusted tool's checked declaration, or why it is left out. Never raises."""
        cached = self._cache.get(tool)
        if cached is not None and not fresh:
            return cached
        try:
            outcome: ToolInfo | Rejected = check_declaration(read_declaration(tool), **self._bounds)
        except DeclarationError as err:
            outcome = Rejected(str(err), err.name)
            logger.warning("tool {} left out: {}", describe_origin(tool), outcome.reason)
        self._cache.put(tool, outcome)
        return outcome

    def check_many(self, tools: list[Any], fresh: bool = False) -> list[ToolInfo | Rejected]:
        """:meth:`check` of each trusted tool, in order, in one message. Never raises."""
        return [self.check(tool, fresh) for tool in tools]

    def read_untrusted(self, tool: Any, retry: int = 0) -> None:
        """Read an untrusted tool's declaration in a throwaway process, without blocking
        this actor; the outcome reaches the ``notify`` actor as :class:`Checked`."""
        self._state.reading[id(tool)] = tool
        self._state.helpers.start(
            _read_isolated,
            (tool, self._untrusted, self._bounds, retry, self._deliver, self._state.closed, self._confine, self._slots),
            "rho-declaration-read",
        )

    def _deliver(self, message: Any) -> None:
        """Hand ``message`` to whichever DeclarationActor runs now (by name), from the
        calling thread, which may wait for a restart."""
        self._names.deliver(DECLARATIONS, message, stop=self._state.closed)

    def _deliver_later(self, name: str, message: Any) -> None:
        """Hand ``message`` to the actor named ``name`` from a helper thread: this
        actor's thread never waits on another actor."""
        self._state.helpers.start(self._names.deliver, (name, message), "rho-deliver", {"stop": self._state.closed})

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, ReadUntrusted):
            self.read_untrusted(message.tool)
        elif isinstance(message, _ReadDone):
            self._read_done(message)
        elif isinstance(message, _Retry):
            if self._state.reading.get(id(message.tool)) is message.tool:
                self.read_untrusted(message.tool, message.retry)
        else:
            return super().on_receive(message)
        return None

    def _read_done(self, done: _ReadDone) -> None:
        if self._state.reading.get(id(done.tool)) is not done.tool:
            return  # forgotten (unregistered) while it was read
        origin = describe_origin(done.tool, trusted=False)
        outcome = done.outcome
        self._cache.put(done.tool, outcome)
        if isinstance(outcome, ToolInfo):
            self._emit("read", origin, outcome.name, None)
        elif done.timed_out and done.retry < len(self._untrusted.retry_s):
            delay = self._untrusted.retry_delay_s(done.retry + 1)
            logger.warning("tool {} left out for now: {}; read again in {} s", origin, outcome.reason, delay)
            self._emit("retry", origin, outcome.name, f"{outcome.reason}; read again in {delay} s")
            retry = _Retry(done.tool, done.retry + 1)
            self._timers.call_at(time.monotonic() + delay, lambda: self._deliver_later(DECLARATIONS, retry))
        else:
            kind = "excluded" if done.timed_out else "rejected"
            logger.warning("tool {} left out: {}", origin, outcome.reason)
            self._emit(kind, origin, outcome.name, outcome.reason)
        self._deliver_later(self._notify, Checked(done.tool, outcome))

    def _emit(self, kind: Any, origin: str, name: str | None, reason: str | None) -> None:
        self._events.emit(DeclarationEvent(kind, origin, name, reason))

    def forget(self, tool: Any) -> None:
        """Drop the tool's cached declaration and any read or retry still to come."""
        self._cache.forget(tool)
        if self._state.reading.get(id(tool)) is tool:
            del self._state.reading[id(tool)]


def _read_isolated(
    tool: Any, settings: UntrustedReads, bounds: dict[str, int], retry: int, deliver: Callable[[Any], None],
    cancel: threading.Event, confine: ConfinePolicy | None = None, slots: WorkerSlots | None = None,
) -> None:
    """A helper thread's work: one isolated read (under the worker cap ``slots``) and
    check, delivered as ``_ReadDone``."""
    timed_out = False
    try:
        payload = read_declaration_isolated(
            tool, timeout_s=settings.timeout_s, start_timeout_s=settings.start_timeout_s,
            heap_bytes=settings.heap_bytes, start_method=settings.start_method,
            cancel=cancel, confine=confine, bounds=bounds, slots=slots,
        )
        outcome: ToolInfo | Rejected = check_declaration(raw_declaration(payload), **bounds)
    except DeclarationError as err:
        outcome = Rejected(str(err), err.name)
    except IsolatedReadError as err:
        timed_out = err.kind == "timeout"
        outcome = Rejected(f"reading its declaration failed ({err.kind}): {err}")
    except BaseException as err:  # this thread must always answer
        outcome = Rejected(f"reading its declaration failed: {describe_exception(err)}")
    deliver(_ReadDone(tool, outcome, timed_out, retry))
