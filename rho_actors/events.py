"""Events a host can subscribe to (DESIGN §4 step 4, §6), also logged with loguru.

Each dispatched call emits ``started``, then exactly one of ``finished`` (with its
outcome: ``"ok"`` or an error kind) or ``timed_out``; a timed-out thread call that later
returns emits ``late`` (its result discarded). A call refused before dispatch (bad JSON,
unknown tool...) emits only ``finished`` with its error kind. Supervisors report
what they do as :class:`SupervisorEvent` values; declaration reads as
:class:`DeclarationEvent` values; a running call's ``ctx["progress"]`` reports as
:class:`ProgressEvent` values; each new tool set the registry publishes as a
:class:`ToolSetChanged`.

Example::

    seen = []
    unsubscribe = system.subscribe(seen.append)
    ...
    unsubscribe()
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union

from loguru import logger

from rho_actors.encoding import scrub_text

if TYPE_CHECKING:
    from rho_actors.tool import ToolCall, ToolResult

__all__ = [
    "CallEvent",
    "DeclarationEvent",
    "EventBus",
    "EventKind",
    "IsolationEvent",
    "MAX_PROGRESS_MESSAGE_CHARS",
    "ProgressEvent",
    "SupervisorEvent",
    "SupervisorEventKind",
    "ToolSetChanged",
    "report_progress",
]

MAX_PROGRESS_MESSAGE_CHARS = 1_000
"""The most characters of a progress report's ``message`` kept (a longer one is cut,
``...`` marking the cut): a status line, held by every listener (an MCP client's
``notifications/progress`` and the SSE event store keeping it for a resume)."""

EventKind = Literal["started", "finished", "timed_out", "late", "queued", "retried", "pending", "decided"]


@dataclass(frozen=True, slots=True)
class CallEvent:
    """One step of one call. ``outcome`` is ``"ok"`` or an error kind's value (``None``
    for ``started`` and ``queued``; for ``retried``, the failed attempt's); ``duration_ms``
    is milliseconds since the call's start. ``queued``: it waits for a place or a rate
    token, ``retried``: an attempt failed and the next waits its backoff (the governor).
    A call held for a decision is ``pending`` (``outcome``: ``"approval"`` or ``"external"``;
    for a turn run directly, emitted once its ``pending`` record is in the transcript),
    its decision ``decided`` (``outcome``: ``"approved"``, ``"rejected"``, ``"expired"``
    or ``"resolved"``, with `` by <who>`` when known) (DESIGN §4 "Approvals")."""

    kind: EventKind
    session_id: str
    call_id: str
    tool: str
    outcome: str | None = None
    duration_ms: float = 0.0

    @classmethod
    def of(cls, kind: EventKind, session_id: str, call: ToolCall, result: ToolResult | None) -> CallEvent:
        """The event ``kind`` of ``call`` in session ``session_id``, its outcome and
        duration those of ``result`` (``None``: the call has none yet)."""
        if result is None:
            return cls(kind, session_id, call.id, call.name)
        outcome = "ok" if result.ok else str(result.error_kind)
        return cls(kind, session_id, call.id, call.name, outcome, result.duration_ms)


@dataclass(frozen=True, slots=True)
class IsolationEvent:
    """An isolation's state changed for a tool: ``kind`` ``"threads_exhausted"`` (its
    calls are ``unavailable``: ``detail`` says why) or ``"threads_recovered"``; or,
    with ``tool`` ``"*"``, ``"confinement_missing"`` when the untrusted pool starts on a
    host that lacks a confinement mechanism asked for (``detail`` names it and why)."""

    kind: str
    tool: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """A running call's report through ``ctx["progress"](done, total, message)``:
    ``done`` so far out of ``total`` (``None`` when unknown), in the tool's own units.
    ``done`` and ``total`` are finite; ``message`` is valid UTF-8 text of at most
    :data:`MAX_PROGRESS_MESSAGE_CHARS` characters.
    Its ``kind`` is always ``"progress"``."""

    kind: ClassVar[str] = "progress"
    session_id: str
    call_id: str
    tool: str
    done: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSetChanged:
    """The registry published a new tool set (a registration, an unregistration, a
    source's scan): ``version`` is its :attr:`rho_actors.ToolSet.version`. Emitted in
    the registry's thread; read the set itself with ``system.tool_set()``. Its ``kind``
    is always ``"tool_set_changed"``."""

    kind: ClassVar[str] = "tool_set_changed"
    version: int


Event = Union["CallEvent", "DeclarationEvent", "IsolationEvent", "ProgressEvent", "SupervisorEvent", "ToolSetChanged"]


class EventBus:
    """Delivers each event to every subscriber, in the emitting actor's thread.

    A subscriber that raises is logged and kept; it cannot fail the call. A subscriber
    may take only some event types (``subscribe(..., only=...)``); :meth:`wants_calls`
    tells an emitter whether a :class:`CallEvent` would reach anyone, so that none is
    built when nobody listens.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: tuple[tuple[Callable[[Event], None], tuple[type, ...] | None], ...] = ()
        self._call_subscribers = 0  # subscribers that take CallEvents

    def subscribe(
        self, callback: Callable[[Event], None], *, only: tuple[type, ...] | None = None
    ) -> Callable[[], None]:
        """Add ``callback`` (for the event types in ``only``; default: every event);
        returns a function that removes it again."""
        entry = (callback, only)
        with self._lock:
            self._subscribers += (entry,)
            self._count()

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not entry)
                self._count()

        return unsubscribe

    def _count(self) -> None:
        self._call_subscribers = sum(only is None or CallEvent in only for _, only in self._subscribers)

    def wants_calls(self, kind: EventKind) -> bool:
        """Whether a :class:`CallEvent` of ``kind`` would reach anyone now: a subscriber
        taking call events, or a loguru sink taking the line it is logged as
        (``WARNING`` for ``timed_out``, else ``DEBUG``, from ``rho_actors``). Loguru has
        no public question for the latter, so this reads what its ``_log`` reads (0.7:
        the core's ``min_level``, its cache of enabled modules, else its activation list,
        as ``_log`` does), and says yes whenever they cannot be read. An answer worked out
        from the activation list is kept in that cache under this module's name, as
        ``_log`` keeps it (read in its order: the cache first, then the list; loguru's
        ``enable``/``disable`` update what the cache holds): asked twice a call, the list
        is walked once (:func:`logs_at`). One frame, inline, once the cache has the answer."""
        if self._call_subscribers > 0:
            return True
        level = _WARNING if kind == "timed_out" else _DEBUG
        try:  # logs_at's first looks, inline: the cache answers every call but the first
            core: Any = logger._core  # type: ignore[attr-defined]  # (read in the try: no getattr call)
            if level < core.min_level:
                return False
            enabled = core.enabled.get(__name__)
        except (AttributeError, TypeError):
            return True
        return bool(enabled) if enabled is not None else logs_at(level, __name__)

    def emit(self, event: Event) -> None:
        """Log ``event`` and give it to every subscriber that takes it (a raising one is logged)."""
        if isinstance(event, SupervisorEvent):
            pass  # the supervisor logged it already (it reports without a bus, too)
        elif isinstance(event, DeclarationEvent):
            logger.info("declaration of {}: {} {}", event.tool, event.kind, event.reason or "")
        elif isinstance(event, IsolationEvent):
            logger.info("tool {}: {} {}", event.tool, event.kind, event.detail)
        elif isinstance(event, (ProgressEvent, ToolSetChanged)):
            pass  # frequent, or logged by its cause: not logged here
        elif event.kind == "timed_out":
            logger.warning(
                "call {} ({}) in session {} timed out after {:.1f} ms",
                event.call_id, event.tool, event.session_id, event.duration_ms,
            )
        else:
            logger.debug(
                "call {} ({}) in session {}: {} {} {:.3f} ms",
                event.call_id, event.tool, event.session_id, event.kind, event.outcome or "", event.duration_ms,
            )
        for subscriber, only in self._subscribers:
            if only is not None and not isinstance(event, only):
                continue
            try:
                subscriber(event)
            except BaseException:  # a subscriber's exit must not stop the emitting actor
                logger.exception("event subscriber {!r} raised", subscriber)


_DEBUG, _INFO, _WARNING = 10, 20, 30  # loguru's level numbers


def logs_at(level: int, module: str) -> bool:
    """Whether loguru would take a line of level number ``level`` logged from ``module``
    (its ``__name__``) now: read as :meth:`EventBus.wants_calls` reads it (the core's
    ``min_level``, its cache of enabled modules, else its activation list, the answer
    then kept in that cache as loguru's ``_log`` keeps it); yes whenever they cannot be
    read. For a line logged on a common path (a session's start) that is mostly
    unwanted: loguru's own refusal walks its frame and options first."""
    core: Any = getattr(logger, "_core", None)
    try:
        if level < core.min_level:
            return False
        cache = core.enabled
        enabled = cache.get(module)
        if enabled is not None:
            return bool(enabled)
        dotted = module + "."
        enabled = True
        for prefix, status in core.activation_list:  # most specific first, as loguru keeps it
            if dotted[: len(prefix)] == prefix:
                enabled = bool(status)
                break
        cache[module] = enabled
        return enabled
    except (AttributeError, TypeError):
        return True


DeclarationEventKind = Literal["read", "rejected", "retry", "excluded", "evicted"]


@dataclass(frozen=True, slots=True)
class DeclarationEvent:
    """An untrusted tool's declaration read (DESIGN §3): ``read`` (checked and offered),
    ``rejected`` (it failed its checks, or the read failed), ``retry`` (the read ran
    over its time bound; ``reason`` says when it is tried again) or ``excluded`` (the
    last retry ran over too: it stays out); and ``evicted``: a source's tool gave up its
    name to the host's own registration of another tool (DESIGN §3 "Names"; ``reason``
    names both). ``tool`` is its origin, ``name`` its name when known."""

    kind: DeclarationEventKind
    tool: str
    name: str | None = None
    reason: str | None = None


SupervisorEventKind = Literal["started", "crashed", "start_failed", "restarted", "gave_up", "escalated"]


@dataclass(frozen=True, slots=True)
class SupervisorEvent:
    """A supervisor's report (OTP's supervisor progress and error reports, DESIGN §6):

    - ``started``: ``child`` started (progress report; not for ``temporary`` children);
    - ``crashed``: ``child`` exited abnormally with ``reason`` (``child_terminated``);
    - ``start_failed``: a restart of ``child`` raised ``reason`` (``start_error``); it
      counts as a restart and is tried again;
    - ``restarted``: ``child`` was started again (``restarts`` times so far);
    - ``gave_up``: more restarts than the intensity allows (``reached_max_restart_intensity``):
      the supervisor stopped its children and exits; ``child`` failed last, ``reason`` is
      the supervisor's exit reason;
    - ``escalated``: ``child``, a supervisor, gave up; this supervisor handles that as a
      crash of that child.

    ``supervisor`` is the reporting supervisor's label (``"root"``, ``"sessions"``,
    ``"session:<id>"``, ``"server:<id>"``...); ``reason`` is text (``None`` for
    ``started``/``restarted``)."""

    kind: SupervisorEventKind
    supervisor: str
    child: str
    reason: str | None = None
    restarts: int = 0


def report_progress(
    events: EventBus, session_id: str, call_id: str, tool: str,
    done: float, total: float | None = None, message: str | None = None,
) -> None:
    """A call's ``ctx["progress"](done, total=None, message=None)`` (the first four bound
    by ``functools.partial``): emits a :class:`ProgressEvent` (its message cut to
    :data:`MAX_PROGRESS_MESSAGE_CHARS`, then its lone surrogates replaced: valid UTF-8,
    as every string an SDK sends); a bad report is dropped, one whose ``done`` or
    ``total`` is not a finite number included (JSON has no NaN or infinity: an MCP
    client would get ``null``, an invalid notification)."""
    try:
        done_f = float(done)
        total_f = None if total is None else float(total)
        if not math.isfinite(done_f) or (total_f is not None and not math.isfinite(total_f)):
            raise ValueError(f"progress {done_f} of {total_f}: not finite")
        note = None if message is None else str.__str__(str(message))  # an exact str (a subclass's methods unread)
        if note is not None:
            if len(note) > MAX_PROGRESS_MESSAGE_CHARS:
                note = note[:MAX_PROGRESS_MESSAGE_CHARS - 3] + "..."
            if not note.isascii():  # ASCII holds no surrogate: nothing to scrub
                note = scrub_text(note)
        events.emit(ProgressEvent(session_id, call_id, tool, done_f, total_f, note))
    except Exception:
        logger.debug("call {}: a bad progress report was dropped", call_id)
