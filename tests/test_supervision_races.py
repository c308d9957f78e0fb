"""Watching an actor as it ends: a monitor of an actor that is stopping reports its
real end; a transient child stopped as its name is given is not restarted."""

from __future__ import annotations

import threading
from typing import Any

import pykka

from rho_actors import (
    ChildSpec,
    Names,
    StartChild,
    Supervisor,
    start_link,
    which_children,
)
from rho_actors.otp.actor import Actor, monitor, stop

from .conftest import WAIT_S


class _SlowStop(Actor):
    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self.entered, self.release = entered, release

    def on_stop(self) -> None:
        self.entered.set()
        self.release.wait(WAIT_S)


def test_a_monitor_of_an_actor_that_is_stopping_reports_its_real_end() -> None:
    """Before: the actor counted as dead from the start of its stop, so a monitor made
    while its ``on_stop`` ran reported ``noproc`` at once: a supervisor's stop that
    waited for it (a session's, woken by a crash) returned while its ``on_stop`` still
    stopped its children (a stopped session's loop seen alive after ``stop``)."""
    entered, release = threading.Event(), threading.Event()
    ref = _SlowStop.start(entered, release)
    ref.stop(block=False)
    assert entered.wait(WAIT_S)
    seen: list[object] = []
    ended = threading.Event()

    def down(_ref: pykka.ActorRef[Any], reason: object) -> None:
        seen.append(reason)
        ended.set()

    monitor(ref, down)
    assert seen == []  # it has not ended: its on_stop runs
    release.set()
    assert ended.wait(WAIT_S)
    assert seen == ["normal"]
    late: list[object] = []
    monitor(ref, lambda _ref, reason: late.append(reason))
    assert late == ["noproc"]  # ended: at once, as OTP's


class _Idle(Actor):
    def on_receive(self, message: Any) -> Any:
        return message


def test_a_transient_child_stopped_as_its_name_is_given_is_not_restarted() -> None:
    """Before: a stop from a thread that found the child by its name came before its
    supervisor watched it; the monitor said ``noproc``, taken for a crash: the stopped
    child was restarted."""
    names = Names()
    register = names.register
    stopped: list[pykka.ActorRef[Any]] = []

    def ending(name: str, ref: pykka.ActorRef[Any]) -> None:
        register(name, ref)
        if not stopped:
            stopped.append(ref)
            stop(ref, WAIT_S)

    names.register = ending  # type: ignore[method-assign]
    reports: list[str] = []
    child = ChildSpec("w", StartChild(_Idle), restart="transient", name="w")
    sup = start_link(Supervisor, [child], names=names, report=lambda event: reports.append(event.kind))
    try:
        assert len(stopped) == 1 and not stopped[0].is_alive()
        assert which_children(sup)  # the supervisor has handled what it was told (the child's end)
        assert names.whereis("w") is None and names.exit_reason("w") == "normal"
        assert "restarted" not in reports
    finally:
        sup.stop(timeout=WAIT_S)
