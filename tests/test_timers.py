"""The timer service behind deadlines: order, cancellation, compaction, stop."""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Iterator

import pykka
import pytest

from rho_actors.otp.timers import Timer, Timers

from .conftest import WAIT_S, wait_for


@pytest.fixture
def timers() -> Iterator[Timers]:
    t = Timers()
    yield t
    t.stop()



def _ignore(_value: object) -> None:
    """A timer callback that keeps its argument alive while pending."""

def test_timers_fire_in_deadline_order(timers: Timers) -> None:
    fired: list[int] = []
    done = threading.Event()
    now = time.monotonic()
    for i in (3, 1, 2):
        timers.call_at(now + i * 0.01, functools.partial(fired.append, i))
    timers.call_at(now + 0.05, done.set)
    assert done.wait(WAIT_S)
    assert fired == [1, 2, 3]


def test_a_cancelled_timer_never_fires_and_cancelling_a_fired_one_is_harmless(timers: Timers) -> None:
    fired: list[str] = []
    done = threading.Event()
    now = time.monotonic()
    doomed = timers.call_at(now + 0.01, lambda: fired.append("doomed"))
    doomed.cancel()
    kept = timers.call_at(now + 0.01, lambda: fired.append("kept"))
    timers.call_at(now + 0.03, done.set)
    assert done.wait(WAIT_S)
    kept.cancel()
    assert fired == ["kept"]


def test_cancelled_timers_are_dropped_from_the_heap(timers: Timers) -> None:
    far = time.monotonic() + 3600
    handles = [timers.call_at(far, lambda: None) for _ in range(5000)]
    for handle in handles:
        handle.cancel()
    assert timers.pending() < 2048


def test_send_after_tells_an_actor_and_ignores_a_dead_one(timers: Timers) -> None:
    got = threading.Event()

    class Sink(pykka.ThreadingActor):
        def on_receive(self, message: object) -> None:
            if message == "ping":
                got.set()

    ref = Sink.start()
    timers.send_after(0.01, ref, "ping")
    assert got.wait(WAIT_S)
    ref.stop()
    done = threading.Event()
    timers.send_after(0.0, ref, "ping")  # dead by now: dropped, the timer thread lives on
    timers.call_at(time.monotonic() + 0.01, done.set)
    assert done.wait(WAIT_S)


def test_stop_ends_the_thread_and_refuses_new_timers() -> None:
    timers = Timers()
    timers.call_at(time.monotonic() + 3600, lambda: None)
    timers.stop()
    assert not timers._thread.is_alive()
    with pytest.raises(RuntimeError, match="stopped"):
        timers.call_at(time.monotonic(), lambda: None)


def test_a_cancelled_timer_keeps_nothing_of_its_callback_alive() -> None:
    class State:
        pass

    timers = Timers()
    try:
        state = State()
        alive = weakref.ref(state)
        timer = timers.call_at(time.monotonic() + 3600, functools.partial(_ignore, state))
        del state
        assert alive() is not None  # a pending timer holds its callback
        timer.cancel()
        assert alive() is None  # freed at once, though the timer stays in the heap until due
        assert timers.pending() == 1
    finally:
        timers.stop()


class _Anywhere(Timer):
    """A timer that any passing thread may fire; it records the thread that did."""

    __slots__ = ("by",)
    fire_anywhere = True

    def __init__(self, when: float) -> None:
        super().__init__(when)
        self.by: list[str] = []

    def fire(self) -> None:
        self.by.append(threading.current_thread().name)


def _passing(timers: Timers) -> tuple[int, str]:
    """``timers.run_due(now)`` from a thread passing by (not the main one): how many
    fired, and that thread's name."""
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(timers.run_due(time.monotonic())), name="passing")
    thread.start()
    thread.join(WAIT_S)
    return out[0], thread.name


def test_a_passing_thread_fires_a_passed_deadline_itself_and_only_those_that_allow_it(timers: Timers) -> None:
    busy, release = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        release.wait(WAIT_S)

    timers.call_at(time.monotonic(), hold)
    assert busy.wait(WAIT_S)  # the timer thread is stuck in a callback: only a passing thread can fire now
    try:
        past = time.monotonic() - 1.0
        fired: list[str] = []
        anywhere, later = _Anywhere(past), _Anywhere(past + 0.5)
        timers.schedule(anywhere)
        timers.schedule(later)
        if threading.current_thread() is threading.main_thread():  # where a signal handler may interrupt a fire
            assert timers.run_due(time.monotonic()) == 0 and anywhere.by == []
        assert _passing(timers) == (2, "passing")
        assert anywhere.by == later.by == ["passing"]
        assert anywhere.cancelled  # fired: never again
        assert _passing(timers) == (0, "passing")  # nothing due: one look at the heap
        timers.call_at(past, lambda: fired.append(threading.current_thread().name))
        blocked = _Anywhere(past + 0.1)
        timers.schedule(blocked)
        assert _passing(timers) == (0, "passing")  # a callback timer is due first: it stops there
        assert blocked.by == []
    finally:
        release.set()
    assert wait_for(lambda: fired == [timers._thread.name] and blocked.by == [timers._thread.name])


def test_a_timer_is_scheduled_once_and_not_after_stop() -> None:
    timers = Timers()
    timer = timers.schedule(_Anywhere(time.monotonic() + 3600))
    with pytest.raises(ValueError, match="scheduled already"):
        timers.schedule(timer)
    timers.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        timers.schedule(_Anywhere(time.monotonic()))
