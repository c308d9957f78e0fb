"""A call's objects are freed by reference counting, whatever its outcome: no call leaves
a reference cycle for the cyclic collector (whose collections of a large heap stall
every thread: under load they made deadlines fire ~100 ms late at p99).

Each test runs its turns with the collector off, then collects once with
``gc.DEBUG_SAVEALL`` and looks for the runtime's per-call objects among what only the
collector could free, recognised by this test's call ids."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken, Loop, RetryPolicy, ToolCall, ToolFailure, tool

from .conftest import WAIT_S, wait_for

PREFIX = "gcprobe-"


@tool(timeout_ms=10_000)
def noop() -> str:
    """Return at once."""
    return "ok"


@tool(timeout_ms=10_000)
def boom() -> str:
    """Raise."""
    raise ValueError("boom")


@tool(timeout_ms=30)
def until_cancelled(ctx: Mapping[str, Any]) -> str:
    """Block until the deadline cancels the call."""
    ctx["cancel"].wait(WAIT_S)
    return "late"


@tool(timeout_ms=30, concurrency="exclusive")
def exclusive_until_cancelled(ctx: Mapping[str, Any]) -> str:
    """Block until the deadline cancels the call (one at a time)."""
    ctx["cancel"].wait(WAIT_S)
    return "late"


@tool(timeout_ms=10_000)
def until_host_cancels(ctx: Mapping[str, Any]) -> str:
    """Block until the host cancels the turn."""
    ctx["cancel"].wait(WAIT_S)
    return "late"


@tool(timeout_ms=10_000)
async def anoop() -> str:
    """Return at once (async: inline on the awaiting event loop)."""
    return "ok"


@tool(timeout_ms=10_000)
async def asuspend() -> str:
    """Suspend once, then return."""
    await asyncio.sleep(0)
    return "ok"


@tool(timeout_ms=30)
async def asleep() -> str:
    """Sleep past the deadline (cancelled there)."""
    await asyncio.sleep(WAIT_S)
    return "late"


@tool(timeout_ms=10_000, max_concurrency=1, rate="1000/s")
def capped() -> str:
    """Return at once (one at a time: the others wait for a place)."""
    return "ok"


_tries = iter(range(1_000_000))


@tool(timeout_ms=10_000, idempotent=True, retry=RetryPolicy(attempts=2, initial_s=0.001, max_wait_s=0.001))
def flaky() -> str:
    """Fail every other try (retried)."""
    if next(_tries) % 2 == 0:
        raise ToolFailure("unavailable", "busy")
    return "ok"


@tool(timeout_ms=10_000, max_concurrency=1)
def capped_until_host_cancels(ctx: Mapping[str, Any]) -> str:
    """Block until the host cancels the turn (one at a time)."""
    ctx["cancel"].wait(WAIT_S)
    return "late"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    with ActorSystem(tmp_path) as system:
        for t in (noop, boom, until_cancelled, exclusive_until_cancelled, until_host_cancels, anoop, asuspend, asleep,
                  capped, flaky, capped_until_host_cancels):
            system.register(t)
        yield system


@pytest.fixture
def loop(system: ActorSystem) -> Loop:
    return system.start_loop("gc")


def _calls(*names: str) -> list[ToolCall]:
    """A call of each tool named (``"bad"``: ``noop`` with arguments that are not JSON)."""
    return [ToolCall(f"{PREFIX}{i}", "noop", "{bad") if name == "bad" else ToolCall(f"{PREFIX}{i}", name, "{}")
            for i, name in enumerate(names)]


def _call_id(obj: Any) -> str | None:
    """The call id an object of the runtime's per-call kinds belongs to, if any."""
    for path in (("call_id",), ("call", "id"), ("spec", "call_id"), ("_spec", "call_id")):
        value: Any = obj
        try:
            for name in path:
                value = getattr(value, name)
        except Exception:
            continue
        if isinstance(value, str):
            return value
    return None


def _cyclic_leftovers(system: ActorSystem, run: Callable[[], None]) -> list[str]:
    """Run ``run`` with the collector off, then wait for the threads of its timed-out
    calls to end; the per-call objects of this test's calls that only the collector
    could then free."""
    gc.collect()
    enabled, flags = gc.isenabled(), gc.get_debug()
    gc.disable()
    try:
        run()
        assert wait_for(lambda: system.stats()["abandoned_threads_running"] == 0)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = [f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                 if type(o).__module__.startswith("rho_actors") and (_call_id(o) or "").startswith(PREFIX)]
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    return found


@pytest.mark.parametrize("names", [
    ("noop", "noop"),
    ("boom",),
    ("until_cancelled", "until_cancelled"),
    ("exclusive_until_cancelled", "exclusive_until_cancelled"),
    ("bad", "unknown_tool", "noop"),
    ("capped", "capped", "capped"),
    ("flaky",),
], ids=["ok", "raised", "timeout", "exclusive-timeouts", "refused", "waited-for-places", "retried"])
def test_a_thread_call_leaves_no_cycle(system: ActorSystem, loop: Loop, names: tuple[str, ...]) -> None:
    def run() -> None:
        for _ in range(5):
            results = loop.run_turn(_calls(*names))
            assert len(results) == len(names)

    assert _cyclic_leftovers(system, run) == []


@pytest.mark.parametrize("names", [("until_host_cancels",), ("capped_until_host_cancels",) * 2],
                         ids=["running", "waiting-for-a-place"])
def test_a_turn_the_host_cancels_leaves_no_cycle(system: ActorSystem, loop: Loop, names: tuple[str, ...]) -> None:
    def run() -> None:
        for _ in range(5):
            cancel = CancelToken()
            future = loop.submit_turn(_calls(*names), cancel=cancel)
            cancel.cancel("enough")
            assert not any(result.ok for result in future.result(WAIT_S))

    assert _cyclic_leftovers(system, run) == []


@pytest.mark.parametrize("name", ["anoop", "asuspend", "asleep"], ids=["at-once", "suspended", "timeout"])
def test_an_inline_async_call_leaves_no_cycle(system: ActorSystem, loop: Loop, name: str) -> None:
    async def turns() -> None:
        for _ in range(5):
            [result] = await loop.arun_turn(_calls(name))
            assert result.ok == (name != "asleep"), result.content
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), WAIT_S)  # cancelled tools end

    assert _cyclic_leftovers(system, lambda: asyncio.run(turns())) == []

