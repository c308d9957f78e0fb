"""Hostile round 13: ``thread`` isolation's ``_Running`` (one object a call), the pool's
straight hand-off (``submit(alone=True)``), run_turn's cached one-call bound, and a
served call's progress (:class:`rho_actors.mcp.progress.LiveProgress`).

What broke: an interrupt (a signal handler's ``KeyboardInterrupt`` in the host's thread)
as the pool started the thread for a call's job, the job taken back by the pool (it never
runs), left the call counted running for good (``running_calls()``; a stop waited its
whole ``timeout_s`` for it) and its deadline armed: at the deadline the call was counted
an abandoned thread that never returns, so after ``abandoned_threads_per_tool`` such
interrupts the tool was refused ``unavailable`` in its session for good.

The same kind, a tool's text reaching the SDK's JSON writer: a progress message with a
lone surrogate, or ``client_of(ctx).log`` data or an ``elicit`` message with one, killed the served HTTP stream
(the call's result never reached its client: 60 s measured); a NaN or infinite progress
went out as ``"progress": null``, which the client refused as invalid.

What held (measured, not kept as tests): tools raising ``SystemExit``,
``KeyboardInterrupt``, ``GeneratorExit`` or a custom ``BaseException`` (one ``exited``
result each); a result whose ``__eq__``/``__hash__``/``__repr__``/``__str__``/``__del__``
raise (one result, the repr refused); a tool returning at its deadline (``timeout`` at
100-104 ms of 100); a tool re-entering run_turn; re-registering a tool with another
timeout between calls (100, 400, 50, 3000 ms: each call its own deadline, the cached
bound not stale: the tool set is replaced whole); 4,000 run_turn calls from 200 threads,
half of them hanging (each its one result, none past its deadline by 250 ms, no
duplicate); a host cancelling at its call's deadline instant (one result each, ``timeout``
or ``cancelled``); progress from 8 threads, with NaN, huge and surrogate messages, and
after the result or the client's disconnect (see the tests below).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.events import MAX_PROGRESS_MESSAGE_CHARS, EventBus, ProgressEvent, report_progress
from rho_actors.otp import threads as threads_module

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(120)


@tool(timeout_ms=50)
def quick(x: int) -> str:
    """Answer at once."""
    return f"x={x}"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000, abandoned_threads_per_tool=2)
    try:
        system.register(quick)
        yield system
    finally:
        system.stop()


def _interrupt_the_pools_next_thread_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next thread a pool starts is interrupted before it began (a signal handler's
    ``KeyboardInterrupt`` as ``Thread.start`` runs): the pool takes its job back."""
    real = threading.Thread.start
    armed = [True]

    def start(self: threading.Thread) -> None:
        target = getattr(self, "_target", None)
        if armed and getattr(target, "__func__", None) is threads_module.ThreadPool._serve:
            armed.pop()
            raise KeyboardInterrupt
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)


def _interrupt_before_the_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interrupt comes as the deadline is armed, before the job reaches the pool."""
    def submit(self: threads_module.ThreadPool, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(threads_module.ThreadPool, "submit", submit)


def _interrupt_after_the_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interrupt comes once the pool has the job (it runs, or is taken back here)."""
    real = threads_module.ThreadPool.submit

    def submit(self: threads_module.ThreadPool, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(threads_module.ThreadPool, "submit", submit)


@pytest.mark.parametrize("where", [_interrupt_the_pools_next_thread_start, _interrupt_before_the_submit,
                                   _interrupt_after_the_submit],
                         ids=["the pool takes the job back", "before the submit", "after the submit"])
def test_an_interrupt_as_a_thread_call_starts_leaves_nothing_counted_or_armed(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch, where: Any) -> None:
    """Before (the first two): ``running_calls()`` stayed 1 for good and, at the
    deadline, the call was counted an abandoned thread that never returns; three such
    interrupts and ``quick`` was ``unavailable`` in the session for good (its cap 2)."""
    isolation: Any = system._runtime.isolations["thread"]
    loop = system.start_loop("s")
    for i in range(3):
        isolation._pool.shutdown()  # no idle thread: the call's job needs a thread started
        isolation._pool = threads_module.ThreadPool(name="rho_actors-call-idle")
        where(monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            loop.run_turn([ToolCall(f"c{i}", "quick", '{"x": 1}')])
        monkeypatch.undo()
        assert wait_for(lambda: isolation.running_calls() == 0)  # (a job the pool kept runs, or returns at once)
    # past the calls' deadlines (50 ms from their start): a timer due after them has fired
    past = threading.Event()
    system.timers.call_at(time.monotonic() + 0.1, past.set)
    assert past.wait(WAIT_S)
    assert system.stats()["abandoned_threads_running"] == 0
    [result] = loop.run_turn([ToolCall("after", "quick", '{"x": 2}')])
    assert result.error_kind is None and result.content == "x=2", result
    assert isolation.running_calls() == 0


class _Surrogate(str):
    """A message whose own methods lie: it says it is ASCII."""

    def isascii(self) -> bool:
        return True


class _Hostile:
    def __str__(self) -> str:
        return _Surrogate("\ud800 made by __str__")


def test_a_progress_report_is_valid_json_text_or_dropped() -> None:
    """Before: a message with a lone surrogate reached the SDK, whose JSON writer raised
    in the served HTTP stream's sender: the stream died, and the call's result never
    reached the client (it waited for ever: 60 s measured); NaN or infinity went out as
    ``"progress": null``, a notification the client refused as invalid."""
    bus = EventBus()
    got: list[ProgressEvent] = []
    bus.subscribe(got.append)  # type: ignore[arg-type]
    report_progress(bus, "s", "c", "t", float("nan"), None, "nan")
    report_progress(bus, "s", "c", "t", float("inf"), None, "inf")
    report_progress(bus, "s", "c", "t", 1, float("nan"), "total nan")
    report_progress(bus, "s", "c", "t", 1, float("-inf"), "total -inf")
    report_progress(bus, "s", "c", "t", 10 ** 400, None, "too big for a float")
    report_progress(bus, "s", "c", "t", 2, None, "\ud800 lone")
    report_progress(bus, "s", "c", "t", 3, None, _Hostile())  # type: ignore[arg-type]
    report_progress(bus, "s", "c", "t", 4, 8, "\U0001f600 " + "\udfff" * 2_000)
    assert [(e.done, e.total) for e in got] == [(2.0, None), (3.0, None), (4.0, 8.0)]
    for event in got:
        assert event.message is not None and type(event.message) is str
        event.message.encode("utf-8")  # valid UTF-8: what an SDK's JSON writer encodes
        assert len(event.message) <= MAX_PROGRESS_MESSAGE_CHARS
    assert got[0].message == "\ufffd lone" and got[1].message == "\ufffd made by __str__"
    last = got[2].message
    assert last is not None and last.startswith("\U0001f600 \ufffd") and last.endswith("...")


def test_what_a_served_tool_sends_its_client_is_valid_json_text() -> None:
    """Before: ``client_of(ctx).log("info", "\\ud800 ...")`` (or an ``elicit`` message, any
    question ``ask`` sends) handed the lone surrogate to the SDK, whose JSON writer raised
    in the served HTTP stream's sender: the stream died, the call's result with it (the
    client waited for ever: 60 s measured)."""
    from mcp_types import ElicitResult

    from rho_actors.mcp.client_requests import Bound, MCPClient

    sent: list[tuple[Any, ...]] = []
    asked: list[Any] = []

    class Session:
        def send_log_message(self, *args: Any, **kwargs: Any) -> Any:
            sent.append(args)
            return asyncio.sleep(0)

        def check_client_capability(self, capability: Any) -> bool:
            return True

        async def send_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            request.model_dump_json()  # what the SDK's writer does (it raised in the stream's sender)
            asked.append(request)
            return ElicitResult(action="decline")

    aloop = asyncio.new_event_loop()
    thread = threading.Thread(target=aloop.run_forever, daemon=True)
    thread.start()
    try:
        client = MCPClient(Bound(aloop, Session(), 1, {}), time.monotonic() + WAIT_S)
        assert client.log("info", {"\ud800k": ["a\udfff", 1.5, {"n": "\U0001f600"}]}, "log\ud800ger")
        assert client.log("info", "plain")
        assert sent == [("info", {"\ufffdk": ["a\ufffd", 1.5, {"n": "\U0001f600"}]}, "log\ufffdger"),
                        ("info", "plain", None)]
        with pytest.raises(ValueError, match="both become"):
            client.log("info", dict([("a\ud800", 1), ("a\udc00", 2)]))  # neither value lost without a word
        schema = {"type": "object", "properties": {"a\ud800": {"type": "string", "title": "\udfff"}}}
        assert client.elicit("pick \ud800", schema, key="k\ud800") == ("decline", {})
        [request] = asked
        assert request.params.message == "pick \ufffd"
        assert request.params.requested_schema["properties"] == {"a\ufffd": {"type": "string", "title": "\ufffd"}}
    finally:
        aloop.call_soon_threadsafe(aloop.stop)
        thread.join(WAIT_S)
        aloop.close()
