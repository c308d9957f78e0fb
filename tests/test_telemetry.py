"""OpenTelemetry: spans and metrics as a host configuring the SDK globally sees them,
read back with the SDK's in-memory span exporter and metric reader."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from rho_actors import (
    Actor,
    ActorSystem,
    CancelToken,
    ChildSpec,
    StartChild,
    SupervisorEvent,
    ToolCall,
    ToolFailure,
    tool,
)
from rho_actors.agent.providers import RetryPolicy
from rho_actors.agent.providers.openai import OpenAIModel
from rho_actors.telemetry import Telemetry
from tests.conftest import WAIT_S, wait_for
from tests.wire_server import OPENAI_PATH, Response, WireServer, openai_completion

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


def _configure_once() -> None:
    """The host's set-up: global providers (set once per process, as OpenTelemetry allows)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _configure_once()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    with trace.get_tracer("a tool").start_as_current_span("inside add"):
        return a + b


@tool
def boom() -> str:
    """Raise."""
    raise ValueError("no")


@tool(timeout_ms=100)
def slow() -> str:
    """Take too long."""
    time.sleep(1)
    return "late"


class TracedInWorker:
    """A process-isolated tool that reports, from its worker, the trace context its own
    span got (the worker configures its own exporter, as a tool's host code would)."""

    @staticmethod
    def name() -> str:
        return "traced_in_worker"

    @staticmethod
    def description() -> str:
        return "Start a span in the worker and say its parent."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {}}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        from opentelemetry import trace as worker_trace
        from opentelemetry.sdk.trace import TracerProvider as WorkerProvider

        if not isinstance(worker_trace.get_tracer_provider(), WorkerProvider):
            worker_trace.set_tracer_provider(WorkerProvider())
        with worker_trace.get_tracer("worker").start_as_current_span("inside worker") as span:
            parent = span.parent  # type: ignore[attr-defined]
            return json.dumps({"trace_id": f"{span.get_span_context().trace_id:032x}",
                               "parent_id": f"{parent.span_id:016x}" if parent else None,
                               "traceparent": ctx.get("traceparent")})


class ExitsInWorker(TracedInWorker):
    @staticmethod
    def name() -> str:
        return "exits_in_worker"

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        sys.exit(3)


def by_name(exporter: InMemorySpanExporter) -> dict[str, Any]:
    # Any: the SDK types a span's attributes as Optional; every span recorded here has them
    return {span.name: span for span in exporter.get_finished_spans()}


def test_call_spans_are_children_of_the_host_span_with_genai_attributes_and_error_kinds(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    for t in (add, boom, slow):
        system.register(t)
    loop = system.start_loop("s1")
    with trace.get_tracer("host").start_as_current_span("host request") as host:
        results = loop.run_turn([
            ToolCall("c1", "add", '{"a": 1, "b": 2}'),
            ToolCall("c2", "boom", "{}"),
            ToolCall("c3", "slow", "{}"),
            ToolCall("c4", "nope", "{}"),
            ToolCall("c5", "add", '{"a": "secret-value"}'),
        ])
    assert [r.ok for r in results] == [True, False, False, False, False]
    finished: Sequence[Any] = spans.get_finished_spans()
    calls = {s.attributes["gen_ai.tool.call.id"]: s for s in finished if s.name.startswith("execute_tool")}
    assert sorted(calls) == ["c1", "c2", "c3", "c4", "c5"]
    host_context = host.get_span_context()
    for call_id, span in calls.items():
        assert span.context.trace_id == host_context.trace_id, call_id
        assert span.parent is not None and span.parent.span_id == host_context.span_id, call_id
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["gen_ai.tool.type"] == "function"
        assert span.attributes["gen_ai.conversation.id"] == "s1"
        assert "gen_ai.tool.call.arguments" not in span.attributes  # not recorded unless opted in
        assert "gen_ai.tool.call.result" not in span.attributes
    assert calls["c1"].name == "execute_tool add" and calls["c1"].attributes["gen_ai.tool.name"] == "add"
    assert calls["c1"].status.status_code is StatusCode.UNSET and "error.type" not in calls["c1"].attributes
    kinds = {cid: (s.attributes["error.type"], s.status.status_code) for cid, s in calls.items() if cid != "c1"}
    assert kinds == {"c2": ("raised", StatusCode.ERROR), "c3": ("timeout", StatusCode.ERROR),
                     "c4": ("unknown_tool", StatusCode.ERROR), "c5": ("invalid_arguments", StatusCode.ERROR)}
    assert not any("secret-value" in str(s.status.description) for s in finished)
    # the tool's own span, started in the call's thread, is a child of its call's span
    inner = by_name(spans)["inside add"]
    assert inner.parent is not None and inner.parent.span_id == calls["c1"].context.span_id


@tool(concurrency="exclusive", timeout_ms=int(WAIT_S * 1000))
def wait_cancel(ctx: Any) -> str:
    """Wait until cancelled (one at a time)."""
    ctx["cancel"].wait(WAIT_S)
    return "late"


def test_a_cancelled_exclusive_turn_ends_the_running_call_s_span_once_and_starts_no_other(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    system.register(wait_cancel)
    late = threading.Event()
    system.subscribe(lambda e: late.set() if getattr(e, "kind", None) == "late" else None)
    loop = system.start_loop("s1")
    token = CancelToken()
    future = loop.submit_turn([ToolCall("x1", "wait_cancel", "{}"), ToolCall("x2", "wait_cancel", "{}")],
                              cancel=token)
    assert wait_for(lambda: bool(loop.running()))
    token.cancel()
    assert [r.error_kind for r in future.result(WAIT_S)] == ["cancelled", "cancelled"]
    assert late.wait(WAIT_S)  # x1 returned after its cancel: no second end of its span
    calls = [s for s in spans.get_finished_spans() if s.name == "execute_tool wait_cancel"]
    assert [dict(s.attributes or {})["gen_ai.tool.call.id"] for s in calls] == ["x1"]  # x2 never started
    assert dict(calls[0].attributes or {})["error.type"] == "cancelled"


def test_a_tool_in_a_worker_process_joins_the_trace_through_its_traceparent(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    system.register(TracedInWorker, isolation="process")
    system.register(ExitsInWorker, isolation="process")
    loop = system.start_loop("s1")
    with trace.get_tracer("host").start_as_current_span("host request"):
        first, exited = loop.run_turn([ToolCall("w1", "traced_in_worker", "{}"),
                                       ToolCall("w2", "exits_in_worker", "{}")])
    assert first.ok, first.content
    seen = json.loads(first.content)
    call_span = by_name(spans)["execute_tool traced_in_worker"]
    assert seen["trace_id"] == f"{call_span.context.trace_id:032x}"
    assert seen["parent_id"] == f"{call_span.context.span_id:016x}"
    assert seen["traceparent"].startswith(f"00-{call_span.context.trace_id:032x}-{call_span.context.span_id:016x}-")
    assert call_span.attributes["rho_actors.isolation"] == "process"
    assert exited.error_kind == "exited"
    assert by_name(spans)["execute_tool exits_in_worker"].attributes["error.type"] == "exited"


def test_arguments_and_results_are_recorded_only_when_opted_in_and_cut(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    with ActorSystem(tmp_path, tracing=Telemetry(record_content=True, max_content_chars=8)) as system:
        system.register(add)
        [result] = system.start_loop("s1").run_turn([ToolCall("c1", "add", '{"a": 123456789, "b": 1}')])
    assert result.content == "123456790"
    span = by_name(spans)["execute_tool add"]
    assert span.attributes["gen_ai.tool.call.arguments"] == '{"a": 12'
    assert span.attributes["gen_ai.tool.call.result"] == "12345679"


def test_tracing_false_records_nothing(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    with ActorSystem(tmp_path, tracing=False) as system:
        system.register(add)
        results = system.start_loop("s1").run_turn([ToolCall("c1", "add", '{"a": 1}'), ToolCall("c2", "nope", "")])
    assert [r.ok for r in results] == [True, False]
    assert [s.name for s in spans.get_finished_spans()] == ["inside add"]  # the tool's own span only
    assert by_name(spans)["inside add"].parent is None


def test_what_a_turn_reports_to_is_decided_once_with_the_submitting_thread_s_context(
    spans: InMemorySpanExporter,
) -> None:
    assert Telemetry(enabled=False).turn() is None  # off: nothing looked up, nothing recorded
    telemetry = Telemetry()
    with trace.get_tracer("host").start_as_current_span("host request") as host:
        turn = telemetry.turn()
    assert turn is not None and turn.tracer is not None and turn.instruments is not None
    assert trace.get_current_span(turn.parent) is host  # the calls' parent: the span current where it started
    given = telemetry.turn("a parent", current=False)  # a turn that came as a message carries its own
    assert given is not None and given.parent == "a parent"
    span = telemetry.call_started(turn, "s1", "c1", "add", "thread", "{}")
    assert span is not None and span.traceparent is not None and span.instruments is turn.instruments
    span.span.end()
    assert telemetry.call_started(None, "s1", "c2", "add", "thread", "{}") is None  # nothing configured


def test_a_prompt_is_an_invoke_agent_span_with_chat_spans_and_its_calls(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    system.register(add)
    loop = system.start_loop("s1")
    fast = RetryPolicy(attempts=1)
    with WireServer() as server, OpenAIModel("gpt-test", base_url=server.openai_url, api_key="k", retry=fast) as model:
        server.script(OPENAI_PATH,
                      Response(200, openai_completion(tool_calls=[("c1", "add", '{"a": 2, "b": 3}')])),
                      Response(200, openai_completion(text="5")),
                      Response(400, {"error": {"message": "bad", "type": "invalid_request_error"}}))
        result = loop.prompt("add 2 and 3", model=model)
        assert result.ok and result.text == "5"
        failed = loop.prompt("again", model=model)
        assert failed.error is not None
    finished: Sequence[Any] = spans.get_finished_spans()
    agents = [s for s in finished if s.name == "invoke_agent"]
    chats = [s for s in finished if s.name == "chat gpt-test"]
    assert len(agents) == 2 and len(chats) == 3
    first = agents[0]
    assert first.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert first.attributes["gen_ai.provider.name"] == "openai"
    assert first.attributes["gen_ai.conversation.id"] == "s1"
    assert first.status.status_code is StatusCode.UNSET
    assert agents[1].status.status_code is StatusCode.ERROR
    for chat in chats[:2]:
        assert chat.parent is not None and chat.parent.span_id == first.context.span_id
        assert chat.kind is trace.SpanKind.CLIENT
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == "gpt-test"
        assert chat.attributes["gen_ai.usage.input_tokens"] == 10
        assert chat.attributes["gen_ai.usage.output_tokens"] == 5
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chats[1].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert chats[2].attributes["error.type"] == "ModelError"
    assert chats[2].status.status_code is StatusCode.ERROR
    call = by_name(spans)["execute_tool add"]
    assert call.parent is not None and call.parent.span_id == first.context.span_id


def _points(name: str) -> list[Any]:
    data = _READER.get_metrics_data()
    found: list[Any] = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def test_metrics_count_calls_by_tool_and_outcome_timeouts_queue_waits_and_abandoned_threads(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    for t in (add, slow):
        system.register(t)
    loop = system.start_loop("s1")
    loop.run_turn([ToolCall("m1", "add", '{"a": 1}'), ToolCall("m2", "add", '{"a": 2}'), ToolCall("m3", "slow", "{}")])
    durations = {(p.attributes["gen_ai.tool.name"], p.attributes["rho_actors.call.outcome"]): p.count
                 for p in _points("rho_actors.call.duration")}
    assert durations[("add", "ok")] >= 2 and durations[("slow", "timeout")] >= 1
    assert sum(p.value for p in _points("rho_actors.call.timeouts") if p.attributes["gen_ai.tool.name"] == "slow") >= 1
    assert sum(p.count for p in _points("rho_actors.call.queue_wait")) >= 3
    mine = [p for p in _points("rho_actors.threads.abandoned")
            if p.attributes["rho_actors.system.id"] == system.telemetry.labels["rho_actors.system.id"]]
    assert mine and mine[0].value == system.stats()["abandoned_threads_running"]


class CrashOnTell(Actor):
    """A host server that crashes on every message told to it."""

    def on_receive(self, message: Any) -> Any:
        raise RuntimeError(f"crashed on {message!r}")


def _counted(name: str, system: ActorSystem) -> dict[str, int]:
    """A counter's totals for ``system``, by kind of supervisor."""
    mine = system.telemetry.labels["rho_actors.system.id"]
    return {p.attributes["rho_actors.supervisor"]: p.value for p in _points(name)
            if p.attributes["rho_actors.system.id"] == mine}


def test_restarts_and_give_ups_are_counted_from_a_crash_looping_childs_supervisor_reports(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    reports: list[SupervisorEvent] = []
    gave_up = threading.Event()

    def note(event: Any) -> None:  # subscribed after the system's telemetry: it has counted the event already
        if isinstance(event, SupervisorEvent) and event.supervisor == "server:crashy":
            reports.append(event)
            if event.kind == "gave_up":
                gave_up.set()

    system.subscribe(note)
    system.start_child(ChildSpec("crashy", StartChild(CrashOnTell), name="crashy"), max_restarts=2, max_seconds=60)
    for _ in range(3):  # the third crash is one more than 2 restarts in 60 s allow
        ref = system.whereis("crashy")
        assert ref is not None
        ref.tell("crash")
        assert wait_for(lambda: gave_up.is_set() or system.whereis("crashy") not in (None, ref))  # noqa: B023
    assert gave_up.wait(WAIT_S)
    kinds = [e.kind for e in reports]
    assert kinds == ["started", "crashed", "restarted", "crashed", "restarted", "crashed", "gave_up"]
    assert _counted("rho_actors.supervisor.restarts", system) == {"server": 2}
    assert _counted("rho_actors.supervisor.give_ups", system) == {"server": 1}


def test_a_supervisor_report_is_an_event_of_the_span_current_where_it_is_emitted(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    report = SupervisorEvent("restarted", "session:s1", "loop", restarts=1)
    with trace.get_tracer("host").start_as_current_span("around a report"):
        system.telemetry.report(report)
        system.telemetry.report(ToolCall("not", "a report"))  # anything else on the bus is not one
    [event] = by_name(spans)["around a report"].events
    assert event.name == "supervisor restarted"
    assert event.attributes["rho_actors.supervisor"] == "session:s1"
    assert event.attributes["rho_actors.child"] == "loop" and event.attributes["rho_actors.restarts"] == 1


def test_tracing_false_counts_no_supervisor_report(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    with ActorSystem(tmp_path, tracing=False) as system:
        system.start_child(ChildSpec("crashy", StartChild(CrashOnTell), name="crashy"), max_restarts=0)
        crashed = threading.Event()
        system.subscribe(lambda e: crashed.set() if isinstance(e, SupervisorEvent) and e.kind == "gave_up" else None)
        ref = system.whereis("crashy")
        assert ref is not None
        ref.tell("crash")
        assert crashed.wait(WAIT_S)
        assert _counted("rho_actors.supervisor.give_ups", system) == {}


_FLAKY_ANSWERS: list[Any] = []


@tool(idempotent=True, retry=RetryPolicy(attempts=3, initial_s=0.01, max_wait_s=0.05, jitter_s=0.0))
def flaky(city: str) -> str:
    """Fail as told, then answer."""
    with trace.get_tracer("a tool").start_as_current_span("inside flaky"):
        answer = _FLAKY_ANSWERS.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)


def _attempts(exporter: InMemorySpanExporter, call_span: Any) -> list[Any]:
    found = [s for s in exporter.get_finished_spans() if s.name == "attempt flaky"]
    assert all(s.parent is not None and s.parent.span_id == call_span.context.span_id for s in found)
    return sorted(found, key=lambda s: s.attributes["rho_actors.attempt"])


def test_each_attempt_of_a_retried_call_is_its_own_child_span_with_its_outcome_and_error_kind(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    system.register(flaky)
    _FLAKY_ANSWERS[:] = [ToolFailure("unavailable", "busy (503)"), ToolFailure("raised", "429", retryable=True),
                         "sunny"]
    [result] = system.start_loop("s1").run_turn([ToolCall("c1", "flaky", '{"city": "Lyon"}')])
    assert result.ok and result.details["attempts"] == 3
    call_span = by_name(spans)["execute_tool flaky"]
    attempts = _attempts(spans, call_span)
    assert [(s.attributes["rho_actors.attempt"], s.attributes["rho_actors.attempt.outcome"],
             s.attributes.get("error.type"), s.status.status_code) for s in attempts] == [
        (1, "retried", "unavailable", StatusCode.ERROR), (2, "retried", "raised", StatusCode.ERROR),
        (3, "ok", None, StatusCode.UNSET)]
    assert all(s.attributes["gen_ai.tool.call.id"] == "c1" for s in attempts)
    assert call_span.status.status_code is StatusCode.UNSET  # the call succeeded
    # the tool's own span of each attempt is that attempt's child
    inner = [s for s in spans.get_finished_spans() if s.name == "inside flaky"]
    assert sorted(s.parent.span_id for s in inner if s.parent) == sorted(s.context.span_id for s in attempts)
    # an attempt starts after the one before it ended
    assert all(a.end_time <= b.start_time for a, b in itertools.pairwise(attempts))


def test_the_last_failed_attempt_is_failed_and_a_call_that_is_never_retried_has_no_attempt_span(
    spans: InMemorySpanExporter, system: ActorSystem
) -> None:
    system.register(flaky)
    system.register(boom)
    _FLAKY_ANSWERS[:] = [ToolFailure("crashed", "gone")] * 3
    loop = system.start_loop("s1")
    [result] = loop.run_turn([ToolCall("c1", "flaky", '{"city": "Lyon"}')])
    assert result.error_kind == "crashed" and result.details["attempts"] == 3
    attempts = _attempts(spans, by_name(spans)["execute_tool flaky"])
    assert [s.attributes["rho_actors.attempt.outcome"] for s in attempts] == ["retried", "retried", "failed"]
    assert attempts[-1].attributes["error.type"] == "crashed"
    spans.clear()
    [refused] = loop.run_turn([ToolCall("c2", "boom", "{}")])  # not idempotent: one attempt, the call's span only
    assert refused.error_kind == "raised"
    assert [s.name for s in spans.get_finished_spans()] == ["execute_tool boom"]


_UNSET_THEN_SET = """
import sys, tempfile
from pathlib import Path
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rho_actors import ActorSystem, ToolCall, tool

looked = []
getter = trace.get_tracer_provider
trace.get_tracer_provider = lambda: looked.append(1) or getter()

@tool
def add(a: int, b: int = 0) -> int:
    '''Add two integers.'''
    return a + b

exporter = InMemorySpanExporter()
with tempfile.TemporaryDirectory() as data, ActorSystem(data_dir=Path(data)) as system:
    system.register(add)
    loop = system.start_loop("s")
    first = loop.run_turn([ToolCall("c1", "add", '{"a": 1}')])
    print("unset", first[0].content, len(looked), len(exporter.get_finished_spans()))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    second = loop.run_turn([ToolCall("c2", "add", '{"a": 2}')])
    print("set", second[0].content, [s.name for s in exporter.get_finished_spans()])
"""


def test_a_turn_decides_nothing_is_configured_without_the_api_s_getters_and_sees_a_provider_set_later(
    tmp_path: Path,
) -> None:
    """Nothing set (a fresh process, no OTEL_PYTHON_*_PROVIDER variable): a turn reports
    to nothing without asking OpenTelemetry's getters (each looks its unset variable up in
    os.environ, a KeyError raised and caught); a provider set later is used from the next turn."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_PYTHON_")}
    done = subprocess.run([sys.executable, "-c", _UNSET_THEN_SET], env=env, capture_output=True, text=True,
                          timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["unset 1 0 0", "set 2 ['execute_tool add']"]
