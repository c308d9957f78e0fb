"""An asyncio host pays no thread hop it does not need: ``arun_turn`` runs a trusted
``async`` tool on the awaiting event loop, with its deadline enforced (the task is
cancelled and ``timeout`` answered at the deadline, a result past it is a timeout
all the same), crashes as results, the caller's contextvars, and cancellation; a sync
tool still runs on a call thread of its own. The tool's first step runs at once, as
its own task (``loop/inline.py``): a tool that does not suspend is answered without
the host's task suspending, one that suspends goes on in that same task."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, CancelToken, ToolCall, tool
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, slack, wait_for

pytestmark = pytest.mark.timeout(60)

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="unset")
OWN: contextvars.ContextVar[str] = contextvars.ContextVar("own", default="unset")
TASKS: list[tuple[int, int | None]] = []  # (id of the current task, id of the host's) per step of a tool
HOST: list[asyncio.Task[Any]] = []  # the host's task, set by a test before its turn
GATE: list[asyncio.Future[None]] = []  # a future the test resolves: a tool suspends on it
SAW_CANCEL = threading.Event()
STARTED = threading.Event()
ORDER: list[str] = []


@tool
async def on_which_loop() -> list[int]:
    """The thread and event loop running this call."""
    return [threading.get_ident(), id(asyncio.get_running_loop())]


@tool
def sync_where() -> int:
    """The thread running this (sync) call."""
    return threading.get_ident()


@tool
def sync_told() -> list[Any]:
    """What the host's ``on_start`` was told before this (sync) call ran, and its thread."""
    return [list(ORDER), threading.get_ident()]


@tool(timeout_ms=100)
async def sleeps() -> str:
    """Sleep far past the deadline, noting the cancel."""
    STARTED.set()
    try:
        await asyncio.sleep(WAIT_S)
    except asyncio.CancelledError:
        SAW_CANCEL.set()
        raise
    return "woke"


@tool(timeout_ms=100)
async def stubborn() -> str:
    """Swallow the cancel and return later."""
    try:
        await asyncio.sleep(WAIT_S)
    except asyncio.CancelledError:
        SAW_CANCEL.set()
    await asyncio.sleep(0.05)
    return "stubborn"


@tool(timeout_ms=50)
async def blocks_the_loop() -> str:
    """Block the event loop past the deadline (a sync sleep inside async def)."""
    time.sleep(0.2)
    return "blocked"


@tool
async def raises() -> str:
    """Raise."""
    raise ValueError("boom")


@tool
async def exits() -> str:
    """Raise SystemExit."""
    raise SystemExit(3)


@tool
async def tagged() -> str:
    """The caller's tag."""
    await asyncio.sleep(0)
    return TAG.get()


@tool(timeout_ms=int(WAIT_S * 1000))
async def waits(ctx: Mapping[str, Any]) -> str:
    """Wait for the cancel."""
    STARTED.set()
    try:
        await asyncio.sleep(WAIT_S)
    except asyncio.CancelledError:
        SAW_CANCEL.set()
        raise
    return "never"


@tool(concurrency="exclusive")
async def one_at_a_time(ctx: Mapping[str, Any]) -> str:
    """Note the order of calls."""
    ORDER.append(f"start {ctx['call_id']}")
    await asyncio.sleep(0.01)
    ORDER.append(f"end {ctx['call_id']}")
    return str(ctx["call_id"])


@tool(concurrency="exclusive")
def one_at_a_time_sync(ctx: Mapping[str, Any]) -> str:
    """Note the order of calls (sync)."""
    ORDER.append(f"start {ctx['call_id']}")
    time.sleep(0.01)
    ORDER.append(f"end {ctx['call_id']}")
    return str(ctx["call_id"])


@tool
async def instant(ctx: Mapping[str, Any]) -> str:
    """Return without suspending."""
    return str(ctx["call_id"])


def note_task() -> None:
    current = asyncio.current_task()
    TASKS.append((id(current), id(HOST[0]) if HOST else None))


@tool
async def suspends_on_gate() -> str:
    """Note the current task, wait on GATE[0], note it again."""
    note_task()
    await GATE[0]
    note_task()
    return "through"


@tool
async def interrupts() -> str:
    """Raise KeyboardInterrupt in the first step."""
    raise KeyboardInterrupt


@tool
async def raises_cancelled() -> str:
    """Raise CancelledError in the first step (the tool's own, not a cancel)."""
    raise asyncio.CancelledError("mine")


@tool
async def own_timeout() -> str:
    """asyncio.timeout entered in the first step: it must act on the call's own task."""
    try:
        async with asyncio.timeout(0):
            await asyncio.sleep(WAIT_S)
    except TimeoutError:
        return "timed out inside"
    return "never"


@tool
async def cancels_itself_then_waits() -> str:
    """Cancel the current task in the first step, then wait on a future."""
    asyncio.current_task().cancel()  # type: ignore[union-attr]
    try:
        await asyncio.get_running_loop().create_future()
    except asyncio.CancelledError:
        return "cancelled at its await"
    return "never"


@tool
async def cancels_itself_then_yields() -> str:
    """Cancel the current task in the first step, then yield bare (sleep(0))."""
    asyncio.current_task().cancel()  # type: ignore[union-attr]
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        return "cancelled at its yield"
    return "never"


@tool
async def cancels_itself_then_returns() -> str:
    """Cancel the current task in the first step and return without suspending."""
    asyncio.current_task().cancel()  # type: ignore[union-attr]
    return "returned"


@tool
async def context_steps() -> str:
    """Read the caller's TAG, set OWN, suspend, read OWN back."""
    seen = TAG.get()
    OWN.set("set by the tool")
    await asyncio.sleep(0)
    return f"{seen}/{OWN.get()}"


@tool(timeout_ms=50)
async def overruns_then_suspends() -> str:
    """Block the loop past the deadline in the first step, then suspend for long."""
    time.sleep(0.1)
    STARTED.set()
    try:
        await asyncio.sleep(WAIT_S)
    except asyncio.CancelledError:
        SAW_CANCEL.set()
        raise
    return "never"


@tool(timeout_ms=100)
async def swallows_then_waits() -> str:
    """Swallow the cancel at the deadline and wait on GATE[0] (resolved by the test)."""
    try:
        await asyncio.sleep(WAIT_S)
    except asyncio.CancelledError:
        SAW_CANCEL.set()
    await GATE[0]
    return "swallowed"


@tool(concurrency="exclusive")
async def instant_exclusive(ctx: Mapping[str, Any]) -> str:
    """Return without suspending, one at a time."""
    ORDER.append(str(ctx["call_id"]))
    return str(ctx["call_id"])


LOOPS: list[Any] = []  # the session's Loop handle, for a tool that runs a turn of its own session


@tool
async def runs_a_turn_of_its_session() -> str:
    """In its first step, run a sync turn of its own session (blocking the loop, as host code may)."""
    [inner] = LOOPS[0].run_turn([ToolCall("inner", "sync_where", "{}")], timeout_s=WAIT_S)
    return "inner ok" if inner.ok else str(inner.content)


EAGER_TOOLS = (
    runs_a_turn_of_its_session, instant, suspends_on_gate, interrupts, raises_cancelled, own_timeout,
    cancels_itself_then_waits, cancels_itself_then_yields, cancels_itself_then_returns, context_steps,
    overruns_then_suspends, swallows_then_waits, instant_exclusive,
)


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    SAW_CANCEL.clear()
    STARTED.clear()
    ORDER.clear()
    TASKS.clear()
    HOST.clear()
    GATE.clear()
    LOOPS.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        for t in (on_which_loop, sync_where, sync_told, sleeps, stubborn, blocks_the_loop, raises, exits, tagged, waits,
                  one_at_a_time, one_at_a_time_sync, *EAGER_TOOLS):
            system.register(t)
        yield system
    finally:
        system.stop()


def call(name: str, call_id: str = "c1") -> ToolCall:
    return ToolCall(call_id, name, "{}")


def test_an_async_tool_runs_on_the_awaiting_event_loop_and_a_sync_one_on_a_call_thread(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> tuple[list[int], int, int]:
        [a, s] = await loop.arun_turn([call("on_which_loop", "a"), call("sync_where", "s")])
        assert a.ok and s.ok
        return json.loads(a.content), int(s.content), id(asyncio.get_running_loop())

    (thread, aio), sync_thread, host_aio = asyncio.run(main())
    assert thread == threading.get_ident() and aio == host_aio  # no thread crossed
    assert sync_thread != threading.get_ident()  # a sync tool's deadline needs a thread of its own
    # run_turn (no event loop awaiting): the async tool runs on a call thread's private loop
    [r] = loop.run_turn([call("on_which_loop")], timeout_s=WAIT_S)
    assert r.ok and json.loads(r.content)[0] != threading.get_ident()


def test_on_start_is_told_in_a_sync_calls_own_thread_before_it_runs_and_never_for_other_calls(
        system: ActorSystem) -> None:
    loop = system.start_loop("s")
    told: list[tuple[int, int]] = []

    def on_start(index: int) -> None:
        told.append((index, threading.get_ident()))
        ORDER.append(f"started {index}")

    async def main() -> list[Any]:
        return await loop.arun_turn([call("on_which_loop", "a"), call("sync_told", "s"), call("nope", "n")],
                                    on_start=on_start)

    inline, synced, refused = asyncio.run(main())
    assert inline.ok and synced.ok and refused.error_kind is ErrorKind.UNKNOWN_TOOL, refused
    seen, thread = json.loads(synced.content)
    assert seen == ["started 1"] and told == [(1, thread)]  # the sync call's own thread, before its tool ran
    assert thread != threading.get_ident()


def test_the_deadline_cancels_the_task_and_answers_timeout_on_time(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> tuple[Any, float]:
        t0 = time.monotonic()
        [r] = await loop.arun_turn([call("sleeps")])
        return r, time.monotonic() - t0

    result, took = asyncio.run(main())
    assert result.error_kind == ErrorKind.TIMEOUT and "within its timeout of 100 ms; it was cancelled" in result.content
    assert took < 0.1 + slack(1.9) and SAW_CANCEL.is_set()


def test_a_task_that_swallows_its_cancel_is_answered_at_the_deadline_and_its_result_is_late(
    system: ActorSystem,
) -> None:
    late = threading.Event()
    system.subscribe(lambda e: late.set() if isinstance(e, CallEvent) and e.kind == "late" else None)
    loop = system.start_loop("s")

    async def main() -> Any:
        [r] = await loop.arun_turn([call("stubborn")])
        assert not late.is_set()
        await asyncio.sleep(0.2)  # the event loop runs on: the stubborn task ends
        return r

    result = asyncio.run(main())
    assert result.error_kind == ErrorKind.TIMEOUT and SAW_CANCEL.is_set()
    assert wait_for(late.is_set)


def test_a_result_past_its_deadline_is_a_timeout_even_when_the_loop_was_blocked(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    [result] = asyncio.run(loop.arun_turn([call("blocks_the_loop")]))
    assert result.error_kind == ErrorKind.TIMEOUT
    assert "what it returned after its deadline was discarded" in result.content


def test_crashes_are_results_and_never_reach_the_event_loop(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> list[Any]:
        results: list[Any] = await loop.arun_turn([call("raises", "r"), call("exits", "e")])
        await asyncio.sleep(0)  # the loop still runs
        return results

    raised, exited = asyncio.run(main())
    assert raised.error_kind == ErrorKind.RAISED and "ValueError: boom" in raised.content
    assert exited.error_kind == ErrorKind.EXITED and "SystemExit" in exited.content


def test_each_call_sees_the_callers_contextvars(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main(tag: str | None) -> str:
        if tag is not None:
            TAG.set(tag)
        [r] = await loop.arun_turn([call("tagged")])
        return str(r.content)

    assert asyncio.run(main("first")) == "first"
    assert asyncio.run(main(None)) == "unset"


def test_cancelling_the_awaiting_task_cancels_the_inline_call(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> None:
        task = asyncio.create_task(loop.arun_turn([call("waits")]))
        while not STARTED.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)
        assert SAW_CANCEL.is_set()

    asyncio.run(main())
    assert loop.running() == []


def test_cancelling_the_awaiting_task_reaches_the_inline_call_in_the_same_step(system: ActorSystem) -> None:
    """As for a coroutine the host awaits itself: the tool's task is cancelled by the
    host's ``cancel()`` call, so the tool sees it before the host's next step, and its
    call gets one ``cancelled`` result."""
    loop = used_loop(system)
    finished: list[str | None] = []
    system.subscribe(lambda e: finished.append(e.outcome) if isinstance(e, CallEvent) and e.kind == "finished"
                     else None)

    async def main() -> None:
        pending = asyncio.ensure_future(loop.arun_turn([call("waits")]))
        for _ in range(3):  # the turn's first step and the tool task's: the tool waits in its sleep
            await asyncio.sleep(0)
        assert STARTED.is_set() and not SAW_CANCEL.is_set()
        pending.cancel()
        await asyncio.sleep(0)
        assert SAW_CANCEL.is_set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(pending, WAIT_S)

    asyncio.run(main())
    wait_for(lambda: finished != [])
    assert finished == ["cancelled"] and loop.running() == []


def test_a_cancel_token_and_the_loops_stop_cancel_an_inline_call(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> Any:
        token = CancelToken()
        pending = asyncio.ensure_future(loop.arun_turn([call("waits")], cancel=token))
        while not STARTED.is_set():
            await asyncio.sleep(0.001)
        await asyncio.to_thread(token.cancel)  # from another thread
        return await asyncio.wait_for(pending, WAIT_S)

    [cancelled] = asyncio.run(main())
    assert cancelled.error_kind == ErrorKind.CANCELLED and SAW_CANCEL.is_set()
    STARTED.clear()
    SAW_CANCEL.clear()

    async def stopped() -> Any:
        pending = asyncio.ensure_future(loop.arun_turn([call("waits", "c2")]))
        while not STARTED.is_set():
            await asyncio.sleep(0.001)
        await asyncio.to_thread(loop.stop)
        return await asyncio.wait_for(pending, WAIT_S)

    [result] = asyncio.run(stopped())
    assert result.error_kind == ErrorKind.CANCELLED and "session stopped" in result.content
    assert SAW_CANCEL.is_set()


def test_an_exclusive_turn_of_async_and_sync_calls_runs_one_at_a_time_in_order(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    calls = [call("one_at_a_time", "a1"), call("one_at_a_time_sync", "s1"), call("one_at_a_time", "a2")]
    results = asyncio.run(loop.arun_turn(calls))
    assert [r.content for r in results] == ["a1", "s1", "a2"]
    assert ORDER == ["start a1", "end a1", "start s1", "end s1", "start a2", "end a2"]


def used_loop(system: ActorSystem) -> Any:
    """A session's loop past its first turn (which suspends once: the session's folder is
    made off the event loop), so that its turns can end in their first step."""
    loop = system.start_loop("s")
    asyncio.run(loop.arun_turn([call("instant", "w")]))
    return loop


def finished_at_once(awaitable: Any) -> Any:
    """What ``awaitable`` (a coroutine) returns when it ends in its first step; fails if it suspends."""
    try:
        awaitable.send(None)
    except StopIteration as done:
        return done.value
    awaitable.close()
    raise AssertionError("the turn suspended the host's task")


def test_a_tool_that_does_not_suspend_is_answered_without_the_host_suspending(system: ActorSystem) -> None:
    loop = used_loop(system)

    async def main() -> list[Any]:
        results: list[Any] = finished_at_once(loop.arun_turn([call("instant", "a"), call("instant", "b")]))
        exclusive: list[Any] = finished_at_once(loop.arun_turn([call("instant_exclusive", f"x{i}") for i in range(3)]))
        return results + exclusive

    results = asyncio.run(main())
    assert [r.content for r in results] == ["a", "b", "x0", "x1", "x2"] and all(r.ok for r in results)
    assert ORDER == ["x0", "x1", "x2"]


def test_the_first_step_runs_as_the_calls_own_task_which_goes_on_after_it_suspends(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> Any:
        HOST.append(asyncio.current_task())  # type: ignore[arg-type]
        GATE.append(asyncio.get_running_loop().create_future())
        pending = asyncio.ensure_future(loop.arun_turn([call("suspends_on_gate")]))
        while len(TASKS) < 1:
            await asyncio.sleep(0)
        HOST[0] = pending  # the task awaiting the turn: the first step ran inside it
        assert not pending.done()
        GATE[0].set_result(None)
        return await asyncio.wait_for(pending, WAIT_S)

    [result] = asyncio.run(main())
    assert result.ok and result.content == "through"
    (first, host_then), (later, _) = TASKS
    assert first == later  # one task for every step of the tool
    assert first != host_then  # not the host's


def test_a_raise_in_the_first_step_is_a_result_and_the_host_goes_on(system: ActorSystem) -> None:
    loop = used_loop(system)

    async def main() -> tuple[list[Any], int]:
        results: list[Any] = finished_at_once(loop.arun_turn(
            [call("raises", "r"), call("interrupts", "k"), call("raises_cancelled", "c"), call("exits", "e")]))
        await asyncio.sleep(0)  # the host's task was not cancelled by the tool's CancelledError
        return results, asyncio.current_task().cancelling()  # type: ignore[union-attr]

    (raised, interrupted, cancelled, exited), cancelling = asyncio.run(main())
    assert raised.error_kind == ErrorKind.RAISED and "ValueError: boom" in raised.content
    assert interrupted.error_kind == ErrorKind.EXITED and "KeyboardInterrupt" in interrupted.content
    assert cancelled.error_kind == ErrorKind.EXITED and "CancelledError" in cancelled.content
    assert exited.error_kind == ErrorKind.EXITED and "SystemExit" in exited.content
    assert cancelling == 0


def test_current_task_in_the_first_step_is_the_calls_own(system: ActorSystem) -> None:
    """asyncio.timeout and current_task().cancel() in the first step act on the call's task,
    never on the host's: a cancel before the task's own first step reaches the tool where it
    suspended (a future it waits on is cancelled, a bare yield gets CancelledError)."""
    loop = system.start_loop("s")
    names = ["own_timeout", "cancels_itself_then_waits", "cancels_itself_then_yields", "cancels_itself_then_returns"]

    async def main() -> tuple[list[Any], int]:
        results: list[Any] = await loop.arun_turn([call(name, name) for name in names])
        await asyncio.sleep(0)
        return results, asyncio.current_task().cancelling()  # type: ignore[union-attr]

    results, cancelling = asyncio.run(main())
    assert [r.content for r in results] == [
        "timed out inside", "cancelled at its await", "cancelled at its yield", "returned"]
    assert cancelling == 0


def test_the_tool_sees_the_callers_contextvars_in_every_step_and_keeps_its_own(system: ActorSystem) -> None:
    loop = system.start_loop("s")

    async def main() -> tuple[str, str, str]:
        TAG.set("host")
        [r] = await loop.arun_turn([call("context_steps")])
        [i] = finished_at_once(loop.arun_turn([call("instant")]))
        return str(r.content), OWN.get(), str(i.content)

    seen, own_after, instant_result = asyncio.run(main())
    assert seen == "host/set by the tool"  # the caller's value in its first step, its own set kept after it
    assert own_after == "unset" and instant_result == "c1"  # the host's context is not the tool's


def test_a_first_step_past_its_deadline_that_then_suspends_is_a_timeout_and_cancelled(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    [result] = asyncio.run(loop.arun_turn([call("overruns_then_suspends")]))
    assert result.error_kind == ErrorKind.TIMEOUT and STARTED.is_set()
    assert wait_for(SAW_CANCEL.is_set)


def test_a_tool_that_swallows_the_cancel_after_suspending_is_a_timeout_and_its_result_late(
    system: ActorSystem,
) -> None:
    late: list[CallEvent] = []
    system.subscribe(lambda e: late.append(e) if isinstance(e, CallEvent) and e.kind == "late" else None)
    loop = system.start_loop("s")

    async def main() -> Any:
        GATE.append(asyncio.get_running_loop().create_future())
        [r] = await loop.arun_turn([call("swallows_then_waits")])
        while not SAW_CANCEL.is_set():  # the timeout answered first; the task's cancel comes after it
            await asyncio.sleep(0.001)
        assert not late
        GATE[0].set_result(None)  # the task, still running on this loop, returns now
        while not late:
            await asyncio.sleep(0.001)
        return r

    result = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert result.error_kind == ErrorKind.TIMEOUT and late[0].outcome == "ok"


def test_the_host_task_cancelled_before_the_calls_task_steps_cancels_the_call(system: ActorSystem) -> None:
    loop = used_loop(system)

    async def main() -> None:
        pending = asyncio.ensure_future(loop.arun_turn([call("waits")]))
        await asyncio.sleep(0)  # the turn's first step ran (the tool's too), its task's has not
        assert STARTED.is_set() and not SAW_CANCEL.is_set()
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(pending, WAIT_S)
        assert SAW_CANCEL.is_set()

    asyncio.run(main())
    assert loop.running() == []


def test_the_turns_bound_on_one_event_loop_expires_each_turn_at_its_own(system: ActorSystem) -> None:
    """One timer per event loop serves every turn's bound: a shorter bound started after a
    longer one still expires first, and the longer one's turn finishes normally."""
    loop = system.start_loop("s")

    async def main() -> Any:
        GATE.append(asyncio.get_running_loop().create_future())
        longer = asyncio.ensure_future(loop.arun_turn([call("suspends_on_gate", "g")], timeout_s=WAIT_S))
        await asyncio.sleep(0)
        with pytest.raises(TimeoutError, match=r"did not finish within 0\.05 s"):
            await loop.arun_turn([call("waits", "w")], timeout_s=0.05)
        assert not longer.done()
        GATE[0].set_result(None)
        return await asyncio.wait_for(longer, WAIT_S)

    [result] = asyncio.run(main())
    assert result.ok and result.content == "through"


def test_a_turn_run_in_a_first_step_starts_at_once(system: ActorSystem) -> None:
    """A tool's first step runs inside the dispatch of its call: a turn it runs there (of
    its own session, waited for in that step) is started then, not held for after it."""
    loop = system.start_loop("s")
    LOOPS.append(loop)
    [result] = asyncio.run(asyncio.wait_for(loop.arun_turn([call("runs_a_turn_of_its_session")]), 2 * WAIT_S))
    assert result.ok and result.content == "inner ok"


def test_a_long_exclusive_turn_of_calls_settled_in_their_first_steps_does_not_nest(system: ActorSystem) -> None:
    """Each next call is started by the dispatch loop of the one before, never from inside it."""
    loop = used_loop(system)
    calls = [call("instant_exclusive", f"x{i}") for i in range(1_500)]  # past the default recursion limit

    async def main() -> list[Any]:
        results: list[Any] = finished_at_once(loop.arun_turn(calls))
        return results

    results = asyncio.run(main())
    ids = [c.id for c in calls]
    assert [r.content for r in results] == ids
    assert ids == ORDER


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cancel": object()}, "cancel must be a rho_actors.CancelToken or None, got object"),
    ({"background": 0}, "background must be a bool or call ids"),
    ({"background": "c1"}, "background must be a bool or call ids"),
])
def test_arun_turn_refuses_a_bad_argument_before_any_call_starts(
    system: ActorSystem, kwargs: dict[str, Any], message: str
) -> None:
    """The defaults are taken as they are; anything else is checked: a bad value is a
    ``TypeError`` naming it, and no call of the turn runs."""
    loop = system.start_loop("s")
    events: list[CallEvent] = []
    system.subscribe(lambda e: events.append(e) if isinstance(e, CallEvent) else None)

    async def main() -> list[bool]:
        with pytest.raises(TypeError, match=message):
            await loop.arun_turn([call("on_which_loop")], **kwargs)
        results = await loop.arun_turn([call("on_which_loop", "c2")], cancel=None, background=False)
        return [r.ok for r in results]

    assert asyncio.run(main()) == [True]
    assert [e.kind for e in events] == ["started", "finished"]  # the second turn's call only
