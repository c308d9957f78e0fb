"""Supervision under odd children (DESIGN §6): starts that hang, raise a BaseException
or return no ref, monitors that raise, duplicate ids, and give-ups the host can see the
moment they are reported."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pykka
import pytest

from rho_actors import (
    Actor,
    ChildSpec,
    Names,
    NotRunningError,
    RestartIntensityExceeded,
    StartChild,
    Supervisor,
    SupervisorEvent,
    kill,
    monitor,
    start_link,
    which_children,
)
from rho_actors.otp import actor as actor_module

from .conftest import WAIT_S, slack, wait_for


class Reports:
    """A supervisor's reports, with a hook run on each in the supervisor's thread."""

    def __init__(self, hook: Any = None) -> None:
        self.lock = threading.Lock()
        self.events: list[SupervisorEvent] = []
        self.hook = hook

    def __call__(self, event: SupervisorEvent) -> None:
        if self.hook is not None:
            self.hook(event)
        with self.lock:
            self.events.append(event)

    def kinds(self) -> list[str]:
        with self.lock:
            return [e.kind for e in self.events]


class Echo(Actor):
    def on_receive(self, message: Any) -> Any:
        return message


class Hangs(Actor):
    """``on_start`` blocks until ``gate`` is set; its ref is kept in ``started``."""

    def __init__(self, gate: threading.Event, started: list[pykka.ActorRef[Any]]) -> None:
        super().__init__()
        self.gate = gate
        started.append(self.actor_ref)

    def on_start(self) -> None:
        self.gate.wait(WAIT_S)

    def on_receive(self, message: Any) -> Any:
        return "up"


def test_a_start_past_its_timeout_leaves_no_actor_running() -> None:
    gate = threading.Event()
    started: list[pykka.ActorRef[Any]] = []
    with pytest.raises(pykka.Timeout, match=r"Hangs did not start within 0.2 s"):
        start_link(Hangs, gate, started, timeout_s=0.2)
    [ref] = started
    ends = threading.Event()
    monitor(ref, lambda _ref, _reason: ends.set())
    gate.set()  # its on_start returns: it must not go on running, unsupervised
    assert ends.wait(WAIT_S)
    assert not ref.is_alive()


def test_a_restart_past_its_start_timeout_is_a_failed_start_tried_again() -> None:
    gate = threading.Event()
    names, reports = Names(), Reports()
    hang = {"on": False}

    class Sometimes(Actor):
        def on_start(self) -> None:
            if hang["on"]:
                hang["on"] = False
                gate.wait(WAIT_S)

        def on_receive(self, message: Any) -> Any:
            return "up"

    start_s = round(slack(0.2), 2)  # a start's bound: a quiet machine's 0.2 s, as this machine keeps up now
    child = ChildSpec("c", StartChild(Sometimes, timeout_s=start_s), name="c")
    sup = start_link(Supervisor, [child], names=names, report=reports, max_restarts=5, max_seconds=60)
    try:
        first = names.whereis("c")
        assert first is not None
        hang["on"] = True
        kill(first)
        assert wait_for(lambda: reports.kinds()[-1:] == ["restarted"] and names.whereis("c") is not None)
        assert reports.kinds() == ["started", "crashed", "start_failed", "restarted"]
        assert f"did not start within {start_s} s" in (reports.events[2].reason or "")
        gate.set()
        assert wait_for(lambda: sum(r.is_alive() for r in pykka.ActorRegistry.get_by_class(Sometimes)) == 1)
        [info] = which_children(sup)
        assert info.alive and info.ref is names.whereis("c")
    finally:
        gate.set()
        sup.stop()


def test_a_monitor_callback_raising_a_base_exception_does_not_silence_the_others() -> None:
    told: list[object] = []
    exited = threading.Event()

    class Watched(Actor):
        def on_exit(self, reason: object) -> None:
            exited.set()

    ref = Watched.start()

    def bad(_ref: Any, _reason: object) -> None:
        raise SystemExit("from a monitor")

    monitor(ref, bad)
    monitor(ref, lambda _ref, reason: told.append(reason))
    kill(ref)
    assert exited.wait(WAIT_S)
    assert told == ["killed"]


def test_an_actor_whose_init_raises_leaves_no_monitor_entry() -> None:
    class BadInit(Actor):
        def __init__(self) -> None:
            super().__init__()
            raise ValueError("bad config")

    before = len(actor_module._monitors)
    for _ in range(50):
        with pytest.raises(ValueError, match="bad config"):
            BadInit.start()
        with pytest.raises(ValueError, match="strategy must be one of"):
            start_link(Supervisor, [], strategy="bogus")
    assert len(actor_module._monitors) <= before


def test_a_start_raising_a_base_exception_is_a_failed_start_not_the_supervisors_end() -> None:
    names, reports = Names(), Reports()
    calls = {"n": 0}

    def flaky() -> pykka.ActorRef[Any]:
        calls["n"] += 1
        if calls["n"] == 2:
            sys.exit("start ran sys.exit")
        return Echo.start()

    sup = start_link(Supervisor, [ChildSpec("f", flaky, name="f")], names=names, report=reports,
                     max_restarts=5, max_seconds=60)
    try:
        first = names.whereis("f")
        assert first is not None
        kill(first)
        assert wait_for(lambda: reports.kinds()[-1:] == ["restarted"])
        assert reports.kinds() == ["started", "crashed", "start_failed", "restarted"]
        assert "SystemExit: start ran sys.exit" in (reports.events[2].reason or "")
        assert sup.is_alive() and names.whereis("f") is not None

        def exits() -> pykka.ActorRef[Any]:
            raise KeyboardInterrupt

        with pytest.raises(RuntimeError, match="child 'k': its start raised KeyboardInterrupt"):
            sup.proxy().start_child(ChildSpec("k", exits)).get(timeout=WAIT_S)
        assert sup.is_alive() and [c.id for c in which_children(sup)] == ["f"]
    finally:
        sup.stop()


def test_a_start_returning_no_ref_says_what_it_returned() -> None:
    with pytest.raises(RuntimeError, match=r"child 'n': its start returned None, not the ref of a started"):
        start_link(Supervisor, [ChildSpec("n", lambda: None)], names=Names())  # type: ignore[arg-type,return-value]


def test_start_child_refuses_an_id_already_running() -> None:
    sup = start_link(Supervisor, [ChildSpec("a", StartChild(Echo))], names=Names())
    try:
        with pytest.raises(ValueError, match=r"child 'a' is already started \(OTP's already_started\)"):
            sup.proxy().start_child(ChildSpec("a", StartChild(Echo))).get(timeout=WAIT_S)
        assert [c.id for c in which_children(sup)] == ["a"]
    finally:
        sup.stop()


def test_when_gave_up_is_reported_the_names_and_the_supervisor_already_say_so() -> None:
    names = Names()
    seen: dict[str, Any] = {}
    sup_ref: list[pykka.ActorRef[Any]] = []

    def at_give_up(event: SupervisorEvent) -> None:
        if event.kind == "gave_up":  # in the supervisor's thread, as it reports
            try:
                names.lookup("w")
            except NotRunningError as err:
                seen["lookup"] = str(err)
            seen["alive"] = sup_ref[0].is_alive()

    sup = start_link(Supervisor, [ChildSpec("w", StartChild(Echo), name="w")], names=names,
                     report=Reports(at_give_up), max_restarts=0, max_seconds=60)
    sup_ref.append(sup)
    ended = threading.Event()
    monitor(sup, lambda _ref, _reason: ended.set())
    child = names.whereis("w")
    assert child is not None
    kill(child)
    assert ended.wait(WAIT_S)
    assert "its supervisor gave up on it (RestartIntensityExceeded" in seen["lookup"]
    assert seen["alive"] is False
    assert isinstance(names.exit_reason("w"), RestartIntensityExceeded)


def test_an_actors_stop_flag_wakes_a_waiter_however_the_set_and_the_wait_interleave() -> None:
    from rho_actors.otp.actor import StopFlag

    flag = StopFlag()
    assert not flag.is_set() and flag.wait(0) is False
    waiting = threading.Event()
    woke: list[bool] = []

    def waiter() -> None:
        waiting.set()
        woke.append(flag.wait(WAIT_S))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(WAIT_S)
    flag.set()
    thread.join(WAIT_S)
    assert woke == [True] and flag.is_set() and flag.wait(0)
    flag.clear()
    assert not flag.is_set() and flag.wait(0.01) is False
    ref = Actor.start()
    assert isinstance(ref.actor_stopped, StopFlag) and ref.is_alive()
    ref.stop()
    assert ref.actor_stopped.wait(WAIT_S) and not ref.is_alive()
