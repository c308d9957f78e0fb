"""Hostile round 10: what round 8/9 changed, attacked (run_turn's thread keeping its one
call's deadline, call plans shared by a system's sessions, one thread-local for every
session's exclusive chain, loguru's cache, a turn interrupted as it starts).

Broke, fixed here:

- An interrupt (a signal handler's ``KeyboardInterrupt``) in the host's thread as the
  deadline it kept for its one thread call came: the deadline was fired in that thread,
  so the interrupt could land between the timeout's claim and its delivery, or just
  after the deadline was taken out of the waiter: the call was never answered (until
  the session stopped) and its ``ctx["cancel"]`` never set. A kept deadline is now
  never fired in the host's thread: at its instant it goes to the timers (the heap push
  only then: a call answered first still costs none), and a wait interrupted anywhere
  hands it over.
- The same kind on the older path: ``Timers.run_due`` fired a passed deadline of any
  call (another session's) in whichever thread passed by, the interpreter's main thread
  included, where an interrupt after the claim left that call unanswered. It no longer
  fires in the main thread (checked only once something is due).
- An interrupt inside ``Timers.schedule``'s wake-up of the timer thread
  (``Condition.notify`` is Python code), after the push: the new first deadline sat in the
  heap of a sleeping timer thread (its call unanswered until something else woke it). The
  wake-up is done again when interrupted (``schedule`` from a host's thread: a kept
  deadline handed over, a ``submit_turn`` call's deadline).
- A host that forks while one of its threads enrols a worker pool for the stop at exit
  (round 9's ``exit_stop``): the child's exit hook hung for ever on the copied lock. A
  forked child now starts with a lock of its own and no pool enrolled.

Held (no change): a ``SIGINT`` while run_turn waits (handed to the timers before this
round too); call plans under re-registration storms (a plan is used only for the entry it
was made of); the shared exclusive-chain local (a turn finds its own chain by identity).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from rho_actors import ActorSystem, CallEvent, ToolCall, tool
from rho_actors.sandbox import exit_stop

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(120)

STARTED = threading.Event()
CTX: list[Mapping[str, Any]] = []
DEADLINE_S = 0.2


@tool(timeout_ms=int(DEADLINE_S * 1000))
def hung(ctx: Mapping[str, Any]) -> str:
    """Hang until cancelled."""
    CTX.append(ctx)
    STARTED.set()
    return "cancelled" if ctx["cancel"].wait(WAIT_S) else "never cancelled"


@tool
def echo(text: str) -> str:
    """Say ``text``."""
    return text


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    STARTED.clear()
    CTX.clear()
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        system.register(hung)
        system.register(echo)
        yield system
    finally:
        system.stop()


def _answers(system: ActorSystem, call_id: str) -> tuple[list[str], threading.Event]:
    """The kinds of the ``finished``/``timed_out`` events of ``call_id`` from now on, and
    an event set at the first."""
    kinds: list[str] = []
    came = threading.Event()

    def take(event: object) -> None:
        if isinstance(event, CallEvent) and event.call_id == call_id and event.kind in ("finished", "timed_out"):
            kinds.append(f"{event.kind}:{event.outcome}")
            came.set()

    system.subscribe(take)
    return kinds, came


def _main_thread_only() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers interrupt the main thread only: the test runs there")


@pytest.mark.parametrize("nth", range(12))
def test_an_interrupt_at_any_point_after_a_kept_deadline_came_still_times_its_call_out(
    system: ActorSystem, nth: int
) -> None:
    """The host's thread waits in ``run_turn`` for a hung call whose deadline it keeps; an
    interrupt (as a signal handler raises it, between two bytecodes) comes at the
    ``nth`` step it takes once the deadline's instant has passed. The host gets the
    interrupt, and the call is still answered ``timeout`` with its ``ctx["cancel"]`` set.
    Before: fired in that thread, the interrupt left the call unanswered, never cancelled."""
    loop = system.start_loop("s")
    loop.run_turn([ToolCall("warm", "echo", '{"text": "warm"}')])
    kinds, came = _answers(system, "c1")
    after = time.monotonic() + DEADLINE_S  # no earlier than the call's deadline (dispatched after this)
    steps = [0]

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if steps[0] > nth or time.monotonic() < after:
            return tracer if steps[0] <= nth else None
        steps[0] += 1
        if steps[0] > nth:
            raise KeyboardInterrupt
        return tracer

    sys.settrace(tracer)
    try:
        loop.run_turn([ToolCall("c1", "hung", "{}")], timeout_s=WAIT_S)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.settrace(None)
    assert came.wait(WAIT_S), f"call c1 unanswered after an interrupt at step {nth} (interrupted: {interrupted})"
    assert kinds[0] in ("timed_out:timeout", "finished:cancelled"), kinds  # (turn_interrupted: still starting)
    assert STARTED.is_set() and CTX[0]["cancel"].wait(WAIT_S)
    assert loop.run_turn([ToolCall("next", "echo", '{"text": "next"}')])[0].content == "next"


def test_the_main_thread_passing_by_never_fires_another_sessions_deadline(system: ActorSystem) -> None:
    """A deadline of another session's call passes while the timer thread is busy; the
    main thread starts a call meanwhile (a thread passing by fires passed deadlines) and
    is interrupted as a deadline would be timed out there. The other session's call is
    answered ``timeout`` once the timer thread is free. Before: the main thread claimed
    that call's timeout, the interrupt came before its delivery: never answered."""
    _main_thread_only()
    timers = system._runtime.timers
    other = system.start_loop("other")
    kinds, came = _answers(system, "h1")
    busy, free = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        free.wait(WAIT_S)

    timers.call_at(time.monotonic(), hold)
    assert busy.wait(WAIT_S)  # the timer thread fires nothing else until free
    try:
        other.submit_turn([ToolCall("h1", "hung", "{}")])
        assert STARTED.wait(WAIT_S)
        [when] = [t.when for _, _, t in list(timers._heap) if getattr(t, "spec", None) is not None]
        time.sleep(max(0.0, when - time.monotonic()))  # the deadline's instant (a time, not an event)
        loop = system.start_loop("s")
        seen: list[str] = []

        def tracer(frame: FrameType, event: str, arg: object) -> Any:
            if event == "call" and frame.f_code.co_name == "timed_out" and not seen:
                seen.append(frame.f_code.co_filename)
                raise KeyboardInterrupt
            return None

        sys.settrace(tracer)
        try:
            [result] = loop.run_turn([ToolCall("e1", "echo", '{"text": "x"}')], timeout_s=WAIT_S)
        finally:
            sys.settrace(None)
        assert result.content == "x" and seen == []  # no deadline was timed out in the main thread
        assert not came.is_set()  # still the timer thread's
    finally:
        free.set()
    assert came.wait(WAIT_S) and kinds == ["timed_out:timeout"], kinds
    assert CTX[0]["cancel"].wait(WAIT_S)


def test_a_child_forked_while_a_pool_enrolled_for_exit_stops_nothing_and_exits() -> None:
    """The host forks while another of its threads enrols (or takes out) a worker pool for
    the stop at exit (exit_stop's lock held): the child's exit hook neither hangs on that
    lock, held for ever in its copy, nor stops its parent's pools. Before: the child's exit
    hung (a host's forked helper never ended)."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with exit_stop._lock:
            holding.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(WAIT_S)
        pid = os.fork()
        if pid == 0:  # the child: its exit hook, bounded, then out (no pytest in a forked copy)
            done = threading.Event()

            def stop_at_exit() -> None:
                exit_stop._stop_running()
                done.set()

            threading.Thread(target=stop_at_exit, daemon=True).start()
            os._exit(0 if done.wait(WAIT_S / 4) else 3)
    finally:
        release.set()
        holder.join(WAIT_S)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's exit hook hung on a lock held at the fork"


def test_an_interrupt_as_a_deadline_is_pushed_still_wakes_the_timer_thread(system: ActorSystem) -> None:
    """The host's thread hands the deadline it kept to the timers at its instant and is
    interrupted inside the wake-up of the timer thread (``Condition.notify``, Python code,
    after the push): the timer thread still wakes for it, the call times out. Before: the
    deadline sat first in the heap of a sleeping timer thread, the call unanswered."""
    loop = system.start_loop("s")
    loop.run_turn([ToolCall("warm", "echo", '{"text": "warm"}')])
    kinds, came = _answers(system, "c1")
    seen: list[str] = []

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if (not seen and event == "call" and frame.f_code.co_name == "notify"
                and frame.f_back is not None and frame.f_back.f_code.co_name == "schedule"):
            seen.append("notify")
            raise KeyboardInterrupt
        return None

    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_turn([ToolCall("c1", "hung", "{}")], timeout_s=WAIT_S)
    finally:
        sys.settrace(None)
    assert seen == ["notify"]
    assert came.wait(WAIT_S) and kinds == ["timed_out:timeout"], kinds
    assert CTX[0]["cancel"].wait(WAIT_S)
