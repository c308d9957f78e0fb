"""OpenTelemetry traces and metrics, following the GenAI semantic conventions.

With the ``otel`` extra installed (``opentelemetry-api``), rho_actors reports to the
tracer and meter providers the host configured globally
(``opentelemetry.trace.set_tracer_provider``, ``opentelemetry.metrics.set_meter_provider``);
nothing is recorded while none is configured, and ``ActorSystem(tracing=False)`` turns
it off for one system. Spans (names and attributes from the OpenTelemetry GenAI
semantic conventions, https://opentelemetry.io/docs/specs/semconv/gen-ai/):

- ``invoke_agent`` per prompt (:func:`rho_actors.prompt`), ``INTERNAL``:
  ``gen_ai.operation.name``, ``gen_ai.conversation.id`` (the session id),
  ``gen_ai.provider.name``, ``gen_ai.request.model``.
- ``chat {gen_ai.request.model}`` per model request, ``CLIENT``: the same plus
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
  ``gen_ai.response.finish_reasons`` (read from the provider's response), ``error.type``.
- ``execute_tool {gen_ai.tool.name}`` per call, ``INTERNAL``: ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type`` (``"function"``),
  ``gen_ai.conversation.id``, ``rho_actors.isolation``; an error result sets
  ``error.type`` to its error kind (``timeout``, ``raised``...) and the span's status to
  ``ERROR``. Its parent is the span current in the thread that submitted the turn (the
  prompt's ``invoke_agent``, or the host's own). The span's context reaches the call's
  thread, and a worker process as ``ctx["traceparent"]`` (W3C Trace Context), so a
  tool's own spans join the trace.
- ``attempt {gen_ai.tool.name}`` per attempt of a call that may be retried (an
  idempotent tool's, DESIGN §4 "The governor"), ``INTERNAL``, a child of the call's
  ``execute_tool``: ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
  ``rho_actors.attempt`` (1, 2, ...) and, as it ends, ``rho_actors.attempt.outcome``
  (``ok``; ``retried``: it failed and another attempt follows; ``failed``: it failed and
  its result is the call's) with ``error.type`` (the error kind) and an ``ERROR`` status
  when it failed. The attempt's span is the one ``ctx["traceparent"]`` names to its tool.

Arguments and results may hold personal data: they are recorded only with
``Telemetry(record_content=True)`` (``gen_ai.tool.call.arguments`` and
``gen_ai.tool.call.result``, each cut to ``max_content_chars`` characters).

Metrics (meter ``rho_actors``): ``rho_actors.call.duration`` (histogram, s, by
``gen_ai.tool.name`` and ``rho_actors.call.outcome``), ``rho_actors.call.timeouts``,
``rho_actors.call.queue_wait`` (s from dispatch to the call's thread starting it),
``rho_actors.threads.abandoned`` (running now), ``rho_actors.workers`` (worker
processes by ``rho_actors.worker.state``), ``rho_actors.supervisor.restarts`` and
``rho_actors.supervisor.give_ups`` (from supervisor reports), and for models
``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``.

Supervisor reports (:class:`rho_actors.SupervisorEvent`): a ``restarted`` report counts
in ``rho_actors.supervisor.restarts`` and a ``gave_up`` report in
``rho_actors.supervisor.give_ups``, each labelled with the kind of the reporting
supervisor (``rho_actors.supervisor``: ``root``, ``sessions``, ``session``, ``server``...;
a session's or server's id is left out, so the label stays bounded). Each report is
also added as a span event to the span current where it is emitted, when there is one,
and logged with that span's trace and span ids (the supervisor logs it anyway).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from loguru import logger

from rho_actors.events import SupervisorEvent

try:  # the optional ``otel`` extra
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised only without the extra
    otel_context = otel_metrics = otel_trace = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from rho_actors.tool import ToolCall, ToolResult

__all__ = ["AVAILABLE", "TRACEPARENT", "CallSpan", "Telemetry", "TurnTelemetry", "attached", "attempt_ended",
           "attempt_started", "current_context"]

AVAILABLE = otel_trace is not None


class Reply(Protocol):
    """What a ``chat`` span reads of a model's reply (an agent layer
    :class:`~rho_actors.agent.model.Reply` is one; this module sits below that layer)."""

    @property
    def raw(self) -> Any: ...

    @property
    def stop_reason(self) -> str | None: ...

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]: ...
"""Whether ``opentelemetry-api`` is installed."""

SCOPE = "rho_actors"
TRACEPARENT = "traceparent"
_PROPAGATOR = TraceContextTextMapPropagator() if TraceContextTextMapPropagator is not None else None


def current_context() -> Any:
    """The OpenTelemetry context current in this thread (to carry into a turn), or None
    without the extra. A context-variable read: no cost worth measuring."""
    return otel_context.get_current() if otel_context is not None else None


# the class names of the API's own providers (a proxy or a no-op): not configured
_DEFAULT_PROVIDERS = frozenset({
    "ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider", "NoOpMeterProvider",
})


def _globals_of(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:  # pragma: no cover - exercised only without the extra
        return None


# Where OpenTelemetry's API keeps the providers set by code, and whether its environment
# names one (``OTEL_PYTHON_TRACER_PROVIDER``/``OTEL_PYTHON_METER_PROVIDER``, read here once:
# the API's getters look each unset variable up in ``os.environ`` on every call, a
# ``KeyError`` raised and caught, 2.7 % of a BFCL run's instructions at two a turn).
_TRACE_API = _globals_of("opentelemetry.trace")
_METRICS_API = _globals_of("opentelemetry.metrics._internal")
_PROVIDER_FROM_ENVIRONMENT = any(name in os.environ for name in ("OTEL_PYTHON_TRACER_PROVIDER",
                                                                 "OTEL_PYTHON_METER_PROVIDER"))


def _configured(provider: Any) -> bool:
    """Whether the host set a real provider (the API's default is a proxy or a no-op)."""
    return type(provider).__name__ not in _DEFAULT_PROVIDERS


class _Instruments:
    """The metric instruments of one meter provider."""

    def __init__(self, meter: Any) -> None:
        self.call_duration = meter.create_histogram(
            "rho_actors.call.duration", unit="s", description="Duration of tool calls, dispatch to result")
        self.timeouts = meter.create_counter(
            "rho_actors.call.timeouts", unit="{call}", description="Tool calls that ran past their deadline")
        self.queue_wait = meter.create_histogram(
            "rho_actors.call.queue_wait", unit="s", description="Time from a call's dispatch to its thread starting it")
        self.restarts = meter.create_counter(
            "rho_actors.supervisor.restarts", unit="{restart}", description="Children restarted by a supervisor")
        self.give_ups = meter.create_counter(
            "rho_actors.supervisor.give_ups", unit="{supervisor}",
            description="Supervisors that gave up (restart intensity exceeded)")
        self.operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration")
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Measures number of input and output tokens used")
        meter.create_observable_up_down_counter(
            "rho_actors.threads.abandoned", [_observe_abandoned], unit="{thread}",
            description="Call threads given up on at their deadline that have not returned yet")
        meter.create_observable_up_down_counter(
            "rho_actors.workers", [_observe_workers], unit="{process}",
            description="Worker processes of process isolation, by state")


_instruments: dict[int, tuple[Any, _Instruments]] = {}
_instruments_lock = threading.Lock()
_systems: weakref.WeakSet[Telemetry] = weakref.WeakSet()


def _meter_instruments() -> _Instruments | None:
    """The instruments for the global meter provider, or None when none is configured."""
    if otel_metrics is None:
        return None
    provider = otel_metrics.get_meter_provider()
    if not _configured(provider):
        return None
    found = _instruments.get(id(provider))
    if found is not None and found[0] is provider:
        return found[1]
    with _instruments_lock:
        found = _instruments.get(id(provider))
        if found is None or found[0] is not provider:
            found = (provider, _Instruments(provider.get_meter(SCOPE)))
            _instruments[id(provider)] = found
        return found[1]


def _observe_abandoned(_options: Any) -> Iterator[Any]:
    for telemetry in list(_systems):
        stats = telemetry.stats()
        if stats:
            yield otel_metrics.Observation(stats.get("abandoned_threads_running", 0), telemetry.labels)


def _observe_workers(_options: Any) -> Iterator[Any]:
    for telemetry in list(_systems):
        stats = telemetry.stats()
        for state in ("idle", "busy", "starting"):
            if f"workers_{state}" in stats:
                yield otel_metrics.Observation(
                    stats[f"workers_{state}"], {**telemetry.labels, "rho_actors.worker.state": state})


@dataclasses.dataclass(slots=True)
class CallSpan:
    """One call's ``execute_tool`` span (None when no tracer is configured), its W3C
    ``traceparent``, the ``time.perf_counter()`` instant it started and the metric
    instruments its end is recorded in (None when no meter provider is configured)."""

    span: Any
    traceparent: str | None
    started: float
    tool: str
    instruments: _Instruments | None = None


@dataclasses.dataclass(slots=True)
class TurnTelemetry:
    """What one turn's calls report to, decided once when the turn starts
    (:meth:`Telemetry.turn`): the tracer (None when no tracer provider is configured),
    the metric instruments (None when no meter provider is) and the parent context of
    the calls' spans (None without a tracer)."""

    tracer: Any
    instruments: _Instruments | None
    parent: Any


class Telemetry:
    """A system's switch and settings for OpenTelemetry (``ActorSystem(tracing=...)``
    takes a bool or one of these).

    ``enabled``: report to the global providers (default True; they must also be
    configured, or nothing is recorded). ``record_content``: also record call arguments
    and results as span attributes (off by default: they may hold personal data),
    each cut to ``max_content_chars`` characters.
    """

    def __init__(self, enabled: bool = True, *, record_content: bool = False, max_content_chars: int = 1_000) -> None:
        if max_content_chars < 0:
            raise ValueError(f"max_content_chars must be 0 or more, got {max_content_chars}")
        self.enabled = enabled and AVAILABLE
        self.record_content = record_content
        self.max_content_chars = max_content_chars
        self.labels: dict[str, str] = {}
        self._stats: Callable[[], dict[str, Any]] | None = None

    # --- wiring -------------------------------------------------------------------------

    def bind(self, system_id: str, stats: Callable[[], dict[str, Any]]) -> None:
        """Report the observable metrics of a system (its ``stats()``) as ``rho_actors.system.id``."""
        self.labels = {"rho_actors.system.id": system_id}
        self._stats = stats
        if self.enabled:
            _systems.add(self)

    def unbind(self) -> None:
        """Stop reporting the system's observable metrics (it stopped)."""
        _systems.discard(self)

    def stats(self) -> dict[str, int]:
        try:
            return self._stats() if self._stats is not None else {}
        except Exception:
            return {}

    def _tracer(self) -> Any:
        if not self.enabled:
            return None
        provider = otel_trace.get_tracer_provider()
        return provider.get_tracer(SCOPE) if _configured(provider) else None

    def _metrics(self) -> _Instruments | None:
        return _meter_instruments() if self.enabled else None

    def turn(self, parent: Any = None, *, current: bool = True) -> TurnTelemetry | None:
        """Decide once, as a turn starts, what its calls report to: None when telemetry
        is off or neither a tracer nor a meter provider is configured now (then the
        turn's calls cost nothing more; a provider configured later is used from the
        next turn on). ``parent``: the calls' spans' parent context; with ``current``
        (default) the context current in this thread is read instead, only when a
        tracer is configured."""
        # no tracer or meter provider set (by code, or by the environment as it was at
        # import): the usual case, decided inline without the API's getters (a global not
        # where this looks is not None: the getters decide)
        if not self.enabled:
            return None
        try:  # the globals read as attributes (no getattr call); one missing (no API): the getters decide
            if (not _PROVIDER_FROM_ENVIRONMENT and _TRACE_API._TRACER_PROVIDER is None
                    and _METRICS_API._METER_PROVIDER is None):
                return None
        except AttributeError:
            pass
        tracers = otel_trace.get_tracer_provider()
        if (type(tracers).__name__ in _DEFAULT_PROVIDERS
                and type(otel_metrics.get_meter_provider()).__name__ in _DEFAULT_PROVIDERS):
            return None  # nothing configured (the usual case): two look-ups, inline
        instruments = _meter_instruments()
        if not _configured(tracers):
            return TurnTelemetry(None, instruments, None)
        return TurnTelemetry(tracers.get_tracer(SCOPE), instruments, current_context() if current else parent)

    def _content(self, value: Any) -> str:
        text = value if isinstance(value, str) else repr(value)
        return text[: self.max_content_chars]

    # --- tool calls (the LoopActor's thread) ---------------------------------------------

    @staticmethod
    def ctx_fields(call: CallSpan | None) -> dict[str, Any]:
        """What a call's ``ctx`` gets: ``{"traceparent": ...}`` while telemetry records
        the call (the value is None when only metrics are configured), else nothing."""
        return {} if call is None else {TRACEPARENT: call.traceparent}

    def call_started(
        self, turn: TurnTelemetry | None, session_id: str, call_id: str, tool: str, isolation: str, arguments: Any
    ) -> CallSpan | None:
        """Start a call's ``execute_tool`` span, a child of the turn's parent context,
        with what ``turn`` (:meth:`turn`) found configured. None when ``turn`` is None
        (telemetry off or nothing configured): then the call costs nothing more."""
        if turn is None:
            return None
        tracer = turn.tracer
        if tracer is None:
            return CallSpan(None, None, time.perf_counter(), tool, turn.instruments)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": session_id,
            "rho_actors.isolation": isolation,
        }
        if self.record_content:
            attributes["gen_ai.tool.call.arguments"] = self._content(arguments)
        span = tracer.start_span(f"execute_tool {tool}", context=turn.parent,
                                 kind=otel_trace.SpanKind.INTERNAL, attributes=attributes)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, otel_trace.set_span_in_context(span))  # type: ignore[union-attr]
        return CallSpan(span, carrier.get(TRACEPARENT), time.perf_counter(), tool, turn.instruments)

    def call_ended(self, call: CallSpan | None, result: ToolResult) -> None:
        """End a call's span with its result: ``error.type`` and an ``ERROR`` status for
        an error result; record its duration (and a timeout) in the metrics."""
        if call is None:
            return
        duration_s = time.perf_counter() - call.started
        outcome = "ok" if result.ok else str(result.error_kind)
        span = call.span
        if span is not None:
            try:  # the host's span processors run in end() (the SDK lets what they raise through)
                if not result.ok:
                    span.set_attribute("error.type", outcome)
                    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, outcome))
                if self.record_content:
                    span.set_attribute("gen_ai.tool.call.result", self._content(result.content))
                span.end()
            except Exception:  # the host's telemetry failing: logged; the call's result is given all the same
                logger.exception("ending the span of call {} ({}) raised", result.call_id, call.tool)
        instruments = call.instruments
        if instruments is not None:
            labels = {"gen_ai.tool.name": call.tool, "rho_actors.call.outcome": outcome}
            if not result.ok:
                labels["error.type"] = outcome
            instruments.call_duration.record(duration_s, labels)
            if outcome == "timeout":
                instruments.timeouts.add(1, {"gen_ai.tool.name": call.tool})

    def call_refused(self, turn: TurnTelemetry | None, session_id: str, result: ToolResult, arguments: Any) -> None:
        """A call refused before dispatch (unknown tool, bad arguments...): a span that
        starts and ends at once, with its error."""
        call = self.call_started(turn, session_id, result.call_id, result.name, "none", arguments)
        self.call_ended(call, result)

    def decision(self, session_id: str, call_id: str, tool: str, decision: str, decided_by: str | None) -> None:
        """A pending call was decided (DESIGN §4 "Approvals"): an ``approval {decision}
        {tool}`` span that starts and ends at once, in the current context."""
        tracer = self._tracer()
        if tracer is None:
            return
        attributes = {"gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id, "gen_ai.conversation.id": session_id,
                      "rho_actors.decision": decision}
        if decided_by is not None:
            attributes["rho_actors.decided_by"] = decided_by
        tracer.start_span(f"approval {decision} {tool}", kind=otel_trace.SpanKind.INTERNAL,
                          attributes=attributes).end()

    # --- supervisor reports ------------------------------------------------------------

    def report(self, event: Any) -> None:
        """Handle one event of the system's bus (subscribed while telemetry is on): a
        :class:`rho_actors.SupervisorEvent` is counted (``restarted``, ``gave_up``), added
        to the current span as an event ``supervisor {kind}`` and logged with the trace
        context; any other event is ignored. Cheap and never raises."""
        if not self.enabled or not isinstance(event, SupervisorEvent):
            return
        try:
            instruments = self._metrics() if event.kind in ("restarted", "gave_up") else None  # one a session start
            if instruments is not None:
                labels = {**self.labels, "rho_actors.supervisor": event.supervisor.partition(":")[0]}
                counter = instruments.restarts if event.kind == "restarted" else instruments.give_ups
                counter.add(1, labels)
            span = otel_trace.get_current_span()
            if span.is_recording():
                fields = _plain_fields(event)
                span.add_event(f"supervisor {event.kind}", {f"rho_actors.{k}": v for k, v in fields.items()})
                span_context = span.get_span_context()
                logger.bind(trace_id=f"{span_context.trace_id:032x}", span_id=f"{span_context.span_id:016x}").info(
                    "supervisor report {}: {}", event.kind, fields)
        except Exception:
            logger.exception("a supervisor report could not be recorded")

    # --- prompts and model requests ----------------------------------------------------

    @contextlib.contextmanager
    def invoke_agent(self, session_id: str, model: Any) -> Iterator[Callable[[str | None], None]]:
        """The ``invoke_agent`` span of one prompt, current in this thread while it runs;
        the block calls the yielded function with the prompt's error (None when it
        succeeded): an error sets ``error.type`` to ``"prompt_error"`` and an ``ERROR``
        status with that sentence."""
        tracer = self._tracer()
        if tracer is None:
            yield _ignore
            return
        with tracer.start_as_current_span("invoke_agent", kind=otel_trace.SpanKind.INTERNAL, attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": session_id,
            **_model_attributes(model),
        }) as span:

            def outcome(error: str | None) -> None:
                if error is not None:
                    span.set_attribute("error.type", "prompt_error")
                    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, error))

            yield outcome

    @contextlib.contextmanager
    def chat(self, model: Any) -> Iterator[Callable[[Reply], None]]:
        """The ``chat {model}`` span of one model request; the block calls the yielded
        function with the reply (usage from its ``usage``, else from its ``raw``
        response; finish reasons from ``raw``). An exception leaving the block sets ``error.type`` to its class."""
        tracer = self._tracer()
        instruments = self._metrics()
        if tracer is None and instruments is None:
            yield _ignore
            return
        attributes = {"gen_ai.operation.name": "chat", **_model_attributes(model)}
        started = time.perf_counter()
        usage: dict[str, int] = {}
        error: str | None = None

        def record(reply: Reply) -> None:
            found = _reply_usage(reply)
            usage.update(found)
            if span is not None:
                for key, value in found.items():
                    span.set_attribute(f"gen_ai.usage.{key}", value)
                reasons = _finish_reasons(reply)
                if reasons:
                    span.set_attribute("gen_ai.response.finish_reasons", reasons)
                response_model = getattr(reply.raw, "model", None)
                if isinstance(response_model, str):
                    span.set_attribute("gen_ai.response.model", response_model)

        span = None
        with contextlib.ExitStack() as stack:
            if tracer is not None:
                name = f"chat {attributes.get('gen_ai.request.model', '')}".rstrip()
                span = stack.enter_context(tracer.start_as_current_span(
                    name, kind=otel_trace.SpanKind.CLIENT, attributes=attributes, record_exception=False,
                    set_status_on_exception=False))
            try:
                yield record
            except BaseException as exc:
                error = type(exc).__qualname__
                if span is not None:
                    span.set_attribute("error.type", error)
                    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, error))
                raise
            finally:
                if instruments is not None:
                    labels = {k: v for k, v in attributes.items() if k != "gen_ai.operation.name"}
                    labels["gen_ai.operation.name"] = "chat"
                    if error is not None:
                        labels["error.type"] = error
                    instruments.operation_duration.record(time.perf_counter() - started, labels)
                    for key, value in usage.items():
                        instruments.token_usage.record(
                            value, {**labels, "gen_ai.token.type": key.removesuffix("_tokens")})


def _ignore(_reply: Any) -> None:
    pass


@contextlib.contextmanager
def attached(ctx: Mapping[str, Any], queued_since: float | None = None, tool: str = "") -> Iterator[None]:
    """Make the call's span (``ctx["traceparent"]``) current in this thread while the
    tool runs, so its own spans are children of ``execute_tool``; record the queue wait
    (``queued_since``: the ``time.monotonic()`` instant of dispatch). Does nothing when
    ``ctx`` has no ``traceparent`` key (telemetry off) or the extra is missing."""
    if TRACEPARENT not in ctx or otel_context is None:
        yield
        return
    if queued_since is not None:
        instruments = _meter_instruments()
        if instruments is not None:
            instruments.queue_wait.record(max(0.0, time.monotonic() - queued_since), {"gen_ai.tool.name": tool})
    traceparent = ctx[TRACEPARENT]
    if not traceparent:
        yield
        return
    token = otel_context.attach(_PROPAGATOR.extract({TRACEPARENT: traceparent}))  # type: ignore[union-attr]
    try:
        yield
    finally:
        otel_context.detach(token)


def attempt_started(ctx: Mapping[str, Any], tool: str, call_id: str, attempt: int) -> tuple[Any, str] | None:
    """Start the ``attempt {tool}`` span of attempt number ``attempt`` (1-based) of a
    call, a child of its ``execute_tool`` span (``ctx["traceparent"]``). Returns the span
    and its own W3C ``traceparent`` (the attempt's ``ctx`` gets it, so the tool's spans
    are the attempt's children), or ``None`` when the call's span is not recorded (no
    ``traceparent``: telemetry off or no tracer configured; or the extra missing)."""
    traceparent = ctx.get(TRACEPARENT)
    if not traceparent or otel_trace is None:
        return None
    provider = otel_trace.get_tracer_provider()
    if not _configured(provider):
        return None
    span = provider.get_tracer(SCOPE).start_span(
        f"attempt {tool}", context=_PROPAGATOR.extract({TRACEPARENT: traceparent}),  # type: ignore[union-attr]
        kind=otel_trace.SpanKind.INTERNAL,
        attributes={"gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id, "rho_actors.attempt": attempt})
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, otel_trace.set_span_in_context(span))  # type: ignore[union-attr]
    return span, carrier.get(TRACEPARENT, traceparent)


def attempt_ended(span: Any, result: ToolResult, retried: bool) -> None:
    """End an attempt's span (:func:`attempt_started`) with its ``result``: its outcome
    (``ok``, ``retried`` when another attempt follows, else ``failed``) and, when it
    failed, ``error.type`` (the error kind) and an ``ERROR`` status. Never raises."""
    try:
        if result.ok:
            span.set_attribute("rho_actors.attempt.outcome", "ok")
        else:
            kind = str(result.error_kind)
            span.set_attribute("rho_actors.attempt.outcome", "retried" if retried else "failed")
            span.set_attribute("error.type", kind)
            span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, kind))
        span.end()
    except Exception:
        logger.exception("the span of an attempt of call {} could not be ended", result.call_id)


def _model_attributes(model: Any) -> dict[str, str]:
    attributes = {}
    provider = getattr(model, "provider_name", None) or _provider_of(model)
    if provider:
        attributes["gen_ai.provider.name"] = provider
    name = getattr(model, "model", None)
    if isinstance(name, str):
        attributes["gen_ai.request.model"] = name
    return attributes


def _provider_of(model: Any) -> str | None:
    module = type(model).__module__
    for provider in ("openai", "anthropic"):
        if module.endswith(f".{provider}") or module == provider:
            return provider
    return None


def _reply_usage(reply: Reply) -> dict[str, int]:
    """The reply's token counts: its :class:`~rho_actors.agent.model.Usage` (streamed replies
    have it too), else what its ``raw`` response says."""
    tokens = getattr(reply, "usage", None)
    if tokens is not None:
        return {"input_tokens": tokens.input_tokens, "output_tokens": tokens.output_tokens}
    return _usage(reply.raw)


def _usage(raw: Any) -> dict[str, int]:
    """Input and output token counts from an OpenAI or Anthropic response."""
    usage = getattr(raw, "usage", None)
    if usage is None:
        return {}
    found = {}
    for key, names in (("input_tokens", ("input_tokens", "prompt_tokens")),
                       ("output_tokens", ("output_tokens", "completion_tokens"))):
        for name in names:
            value = getattr(usage, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                found[key] = value
                break
    return found


def _finish_reasons(reply: Reply) -> list[str]:
    raw = reply.raw
    choices = getattr(raw, "choices", None)
    if isinstance(choices, list):
        reasons = [str(c.finish_reason) for c in choices if getattr(c, "finish_reason", None)]
        if reasons:
            return reasons
    stop = getattr(raw, "stop_reason", None)
    if isinstance(stop, str):
        return [stop]
    if reply.stop_reason:
        return [reply.stop_reason]
    return ["tool_calls"] if reply.tool_calls else ["stop"]


def _plain_fields(event: Any) -> dict[str, str | int | float | bool]:
    """An event's fields as span-event attribute values."""
    if dataclasses.is_dataclass(event) and not isinstance(event, type):
        items = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    else:
        items = dict(getattr(event, "__dict__", {}))
    return {k: v if isinstance(v, (str, int, float, bool)) else repr(v) for k, v in items.items() if v is not None}
