"""Call events are built only for someone (rho_actors.events): a subscriber taking them,
or a loguru sink at their level with rho_actors enabled; what listeners get is unchanged."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from loguru import logger

import rho_actors.loop.turns as turns_module
from rho_actors import ActorSystem, CallEvent, ProgressEvent, SupervisorEvent, ToolCall, ToolSetChanged, tool
from rho_actors.events import EventBus
from tests.conftest import WAIT_S


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[CallEvent]]:
    """Every CallEvent the loop's turns build during the test."""
    made: list[CallEvent] = []

    def counting(*args: Any) -> CallEvent:
        event = CallEvent.of(*args)
        made.append(event)
        return event

    monkeypatch.setattr(turns_module, "CallEvent", types.SimpleNamespace(of=counting))
    yield made


def one_call(system: ActorSystem) -> None:
    loop = system.start_loop()
    [result] = loop.run_turn([ToolCall("c1", "noop", "{}")], timeout_s=WAIT_S)
    assert result.ok
    loop.stop()


def test_no_call_event_is_built_when_nobody_listens(system: ActorSystem, built: list[CallEvent]) -> None:
    system.register(noop)
    one_call(system)
    assert built == []


def test_a_subscriber_gets_every_call_event_as_before(system: ActorSystem, built: list[CallEvent]) -> None:
    system.register(noop)
    seen: list[Any] = []
    unsubscribe = system.subscribe(seen.append)
    one_call(system)
    calls = [e for e in seen if isinstance(e, CallEvent)]
    assert [(e.kind, e.call_id, e.tool, e.outcome) for e in calls] == [
        ("started", "c1", "noop", None), ("finished", "c1", "noop", "ok")]
    assert calls == built
    unsubscribe()
    built.clear()
    one_call(system)
    assert built == []  # the last listener gone: none built again


def test_a_debug_sink_gets_the_call_lines(system: ActorSystem, built: list[CallEvent],
                                          logs: list[str]) -> None:
    system.register(noop)
    one_call(system)
    assert [e.kind for e in built] == ["started", "finished"]
    assert any("call c1 (noop) in session" in line and "finished ok" in line for line in logs)


def test_a_sink_above_debug_or_a_disabled_package_builds_none(system: ActorSystem, built: list[CallEvent]) -> None:
    system.register(noop)
    lines: list[str] = []
    logger.remove()  # loguru's default stderr sink takes DEBUG: only INFO is taken here
    try:
        logger.enable("rho_actors")
        sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
        try:
            one_call(system)
        finally:
            logger.remove(sink)
            logger.disable("rho_actors")
        assert built == [] and not any("call c1" in line for line in lines)
        sink = logger.add(lambda m: lines.append(m.record["message"]), level="DEBUG")  # rho_actors disabled
        try:
            one_call(system)
        finally:
            logger.remove(sink)
        assert built == []
    finally:
        logger.add(sys.stderr)  # loguru's default again


def test_the_kept_answer_for_a_disabled_package_follows_enable_and_disable() -> None:
    bus = EventBus()  # loguru's default sink takes DEBUG; rho_actors is disabled (as it is imported)
    assert not bus.wants_calls("started") and not bus.wants_calls("finished")  # asked again: the kept answer
    logger.enable("rho_actors")
    try:
        assert bus.wants_calls("started")  # the sink takes the line now
    finally:
        logger.disable("rho_actors")
    assert not bus.wants_calls("started")
    logger.enable("rho_actors.events")  # the module itself, more specific than the package
    try:
        assert bus.wants_calls("finished")
    finally:
        logger.disable("rho_actors.events")
    assert not bus.wants_calls("finished")


def test_the_package_enabled_after_calls_it_had_disabled_gets_the_next_calls_lines(
        system: ActorSystem, built: list[CallEvent]) -> None:
    """The disabled package's answer is kept as loguru's own ``_log`` keeps it (not looked
    up again a call): ``logger.enable`` and ``disable`` still reach the very next call."""
    system.register(noop)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="DEBUG")
    try:
        for _ in range(2):
            one_call(system)  # rho_actors disabled (its default): asked twice a call
        assert built == [] and not any("call c1" in line for line in lines)
        logger.enable("rho_actors")
        try:
            one_call(system)
        finally:
            logger.disable("rho_actors")
        assert [e.kind for e in built] == ["started", "finished"]
        assert any("call c1 (noop) in session" in line and "finished ok" in line for line in lines)
        built.clear()
        one_call(system)
        assert built == []  # disabled again: the next call builds none
    finally:
        logger.remove(sink)


def test_a_subscriber_of_some_types_gets_only_those_and_wants_no_call_events() -> None:
    bus = EventBus()
    got: list[Any] = []
    unsubscribe = bus.subscribe(got.append, only=(SupervisorEvent,))
    assert not bus.wants_calls("finished") and not bus.wants_calls("timed_out")
    report = SupervisorEvent("started", "sessions", "s1", None, 0)
    bus.emit(CallEvent("finished", "s", "c", "t", "ok", 1.0))
    bus.emit(report)
    assert got == [report]
    everything: list[Any] = []
    bus.subscribe(everything.append)
    assert bus.wants_calls("started")
    unsubscribe()
    bus.emit(report)
    assert got == [report] and everything == [report]


def test_a_system_subscriber_of_some_types_spares_every_call_its_events(
        system: ActorSystem, built: list[CallEvent]) -> None:
    """``ActorSystem.subscribe(only=...)``: as ``mcp serve`` listens (for tool-set
    changes and progress), so a served call builds no events nobody takes."""
    system.register(noop)
    got: list[Any] = []
    unsubscribe = system.subscribe(got.append, only=(ToolSetChanged, ProgressEvent))
    one_call(system)
    assert built == [] and got == []
    system.register(echo)
    assert [type(e) for e in got] == [ToolSetChanged]
    unsubscribe()


@tool
def echo(text: str) -> str:
    """Say it back."""
    return text


def test_mcp_serve_builds_no_call_events_for_its_listening(system: ActorSystem, built: list[CallEvent]) -> None:
    pytest.importorskip("mcp")
    import anyio
    from mcp.client.client import Client

    from rho_actors.mcp import build_server

    system.register(noop)

    async def main() -> None:
        async with Client(build_server(system)) as client:  # in memory, the lifespan's subscription on
            with anyio.fail_after(WAIT_S):
                result = await client.call_tool("noop", {})
            assert not result.is_error, result

    anyio.run(main)
    assert built == []


def test_a_sessions_started_report_is_logged_only_when_a_sink_takes_it_and_reaches_subscribers_always(
        system: ActorSystem) -> None:
    """A session's start reports its loop ``started``: with ``rho_actors`` disabled (its
    default) no line is built for it (loguru's own refusal is not reached), enabled it is
    logged at INFO; a subscriber of ``SupervisorEvent`` gets the report either way."""
    import loguru._logger as loguru_logger

    reports: list[SupervisorEvent] = []
    unsubscribe = system.subscribe(reports.append, only=(SupervisorEvent,))
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    logged: list[Any] = []
    real_log = loguru_logger.Logger._log

    def counted_log(self: Any, level: Any, *args: Any, **kwargs: Any) -> None:
        logged.append(level)
        real_log(self, level, *args, **kwargs)  # type: ignore[no-untyped-call]

    loguru_logger.Logger._log = counted_log  # type: ignore[method-assign]
    try:
        system.start_loop("quiet").stop()
        assert logged == [] and not any("quiet" in line for line in lines)
        logger.enable("rho_actors")
        try:
            system.start_loop("told").stop()
        finally:
            logger.disable("rho_actors")
        assert any(line == "session:told: child loop started" for line in lines)
    finally:
        loguru_logger.Logger._log = real_log  # type: ignore[method-assign]
        logger.remove(sink)
        unsubscribe()
    assert [(r.supervisor, r.kind) for r in reports if r.kind == "started"] == [
        ("session:quiet", "started"), ("session:told", "started")]
