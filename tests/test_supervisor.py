"""OTP supervision (DESIGN §6): strategies, restart types, intensity and escalation,
shutdown order and timeouts, monitors, names, and no thread left behind."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import (
    NORMAL,
    Actor,
    ActorExit,
    ChildSpec,
    Down,
    Names,
    NotRunningError,
    RestartIntensityExceeded,
    StartChild,
    Supervisor,
    SupervisorEvent,
    count_children,
    kill,
    monitor,
    start_link,
    whereis,
    which_children,
)
from rho_actors.otp.actor import new_urn

from .conftest import WAIT_S, extra_threads, slack, wait_for

RELEASE = threading.Event()


class Journal:
    """What the test actors did, in order, across threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)

    def starts(self, name: str) -> int:
        with self.lock:
            return self.lines.count(f"start {name}")


class Worker(Actor):
    """Counts messages; ``"exit"`` raises SystemExit, ``"crash"`` raises in a tell."""

    def __init__(self, name: str, journal: Journal, slow_stop: threading.Event | None = None) -> None:
        super().__init__()
        self.name, self.journal, self.slow_stop = name, journal, slow_stop
        self.count = 0

    def on_start(self) -> None:
        self.journal.add(f"start {self.name}")

    def on_stop(self) -> None:
        if self.slow_stop is not None:  # a slow clean-up, for shutdown timeouts
            self.slow_stop.wait(WAIT_S)
        self.journal.add(f"stop {self.name}")

    def on_receive(self, message: Any) -> Any:
        if message == "exit":
            sys.exit(1)
        if message == "crash":
            raise RuntimeError("crash")
        if message == "block":
            RELEASE.wait(WAIT_S)
        self.count += 1
        return self.count


def spec(name: str, journal: Journal, restart: str = "permanent", **kwargs: Any) -> ChildSpec:
    return ChildSpec(name, StartChild(Worker, (name, journal)), restart=restart, name=name, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
def names() -> Names:
    return Names()


def started_sup(children: list[ChildSpec], names: Names, **kwargs: Any) -> pykka.ActorRef[Any]:
    return start_link(Supervisor, children, names=names, **kwargs)


def refs(names: Names, *ids: str) -> list[Any]:
    return [names.whereis(i) for i in ids]


def crash_and_wait(names: Names, child: str, journal: Journal, starts: int) -> None:
    ref = names.whereis(child)
    assert ref is not None
    ref.tell("crash")
    assert wait_for(lambda: journal.starts(child) == starts and names.whereis(child) not in (None, ref))


def test_one_for_one_restarts_only_the_failed_child(journal: Journal, names: Names) -> None:
    sup = started_sup([spec("a", journal), spec("b", journal), spec("c", journal)], names)
    a, b, c = refs(names, "a", "b", "c")
    crash_and_wait(names, "b", journal, 2)
    assert refs(names, "a", "c") == [a, c] and journal.starts("a") == journal.starts("c") == 1
    assert not b.is_alive()
    sup.stop()


def test_one_for_all_restarts_every_child_in_order(journal: Journal, names: Names) -> None:
    sup = started_sup([spec("a", journal), spec("b", journal), spec("c", journal)], names, strategy="one_for_all")
    journal.lines.clear()
    crash_and_wait(names, "b", journal, 1)
    assert wait_for(lambda: journal.starts("c") == 1)
    assert journal.lines == ["stop c", "stop a", "start a", "start b", "start c"]
    sup.stop()


def test_rest_for_one_restarts_the_child_and_those_started_after_it(journal: Journal, names: Names) -> None:
    sup = started_sup([spec("a", journal), spec("b", journal), spec("c", journal)], names, strategy="rest_for_one")
    a = names.whereis("a")
    journal.lines.clear()
    crash_and_wait(names, "b", journal, 1)
    assert wait_for(lambda: journal.starts("c") == 1)
    assert journal.lines == ["stop c", "start b", "start c"]
    assert names.whereis("a") is a
    sup.stop()


def test_restart_types(journal: Journal, names: Names) -> None:
    sup = started_sup(
        [spec("perm", journal), spec("trans", journal, "transient"), spec("temp", journal, "temporary")], names
    )
    for name in ("perm", "trans", "temp"):
        ref = names.whereis(name)
        assert ref is not None
        ref.stop()  # a normal exit
    assert wait_for(lambda: journal.starts("perm") == 2)
    assert wait_for(lambda: len(sup.proxy().which_children().get(timeout=WAIT_S)) == 2)
    children = {c.id: c for c in sup.proxy().which_children().get(timeout=WAIT_S)}
    assert children["perm"].alive and children["perm"].restarts == 1
    assert not children["trans"].alive and children["trans"].restarts == 0  # normal exit: not restarted
    assert "temp" not in children  # temporary: forgotten
    sup.stop()
    sup = started_sup([spec("trans", journal, "transient"), spec("temp", journal, "temporary")], names)
    for name in ("trans", "temp"):
        ref = names.whereis(name)
        assert ref is not None
        ref.tell("crash")
    assert wait_for(lambda: journal.starts("trans") == 2)  # abnormal exit: restarted
    assert journal.starts("temp") == 2  # the one from the first supervisor and this one; never restarted
    assert wait_for(lambda: [c.id for c in sup.proxy().which_children().get(timeout=WAIT_S)] == ["trans"])
    sup.stop()


def test_a_base_exception_in_a_child_is_a_failure_of_that_child_only(journal: Journal, names: Names) -> None:
    sup = started_sup([spec("a", journal), spec("b", journal)], names)
    a, b = refs(names, "a", "b")
    with pytest.raises(ActorExit, match="SystemExit"):
        a.ask("exit", timeout=WAIT_S)
    assert wait_for(lambda: journal.starts("a") == 2)
    assert b.is_alive() and sup.is_alive()
    sup.stop()


def test_intensity_exceeded_stops_the_supervisor_and_escalates(journal: Journal, names: Names) -> None:
    inner = ChildSpec(
        "inner",
        StartChild(Supervisor, ([spec("w", journal)],), {"names": names, "max_restarts": 2, "max_seconds": 60,
                                                         "label": "inner"}),
        type="supervisor",
        name="inner",
    )
    reports = Reports()
    outer = started_sup([inner], names, max_restarts=5, max_seconds=60, label="outer", report=reports)
    first_inner = names.whereis("inner")
    downs: list[object] = []
    assert first_inner is not None
    monitor(first_inner, lambda _r, reason: downs.append(reason))
    for starts in (2, 3):
        crash_and_wait(names, "w", journal, starts)
    worker = names.whereis("w")
    assert worker is not None
    worker.tell("crash")  # the third restart in the period: past max_restarts=2
    assert wait_for(lambda: len(downs) == 1)
    assert isinstance(downs[0], RestartIntensityExceeded) and "more than 2 restarts" in str(downs[0])
    # the outer supervisor restarted the inner one, which started a fresh worker
    assert wait_for(lambda: names.whereis("inner") not in (None, first_inner) and journal.starts("w") == 4)
    children = outer.proxy().which_children().get(timeout=WAIT_S)
    assert children[0].restarts == 1
    assert reports.kinds() == [("started", "inner"), ("escalated", "inner"), ("restarted", "inner")]
    assert "inner: more than 2 restarts" in (reports.events[1].reason or "")
    outer.stop()


def test_shutdown_is_in_reverse_order_and_bounded(journal: Journal, names: Names) -> None:
    slow_stop = threading.Event()
    slow = ChildSpec("slow", StartChild(Worker, ("slow", journal, slow_stop)), shutdown=50, name="slow")
    brutal = ChildSpec("brutal", StartChild(Worker, ("brutal", journal)), shutdown="brutal_kill", name="brutal")
    sup = started_sup([spec("a", journal), slow, spec("b", journal), brutal], names)
    busy = names.whereis("brutal")
    assert busy is not None
    RELEASE.clear()
    busy.tell("block")  # busy: a brutal kill does not wait for it
    journal.lines.clear()
    sup.stop(timeout=WAIT_S)  # returns although "slow" is still cleaning up: it was given 50 ms
    assert journal.lines == ["stop b", "stop a"]  # reverse order; "slow" abandoned, "brutal" not waited for
    slow_stop.set()
    assert wait_for(lambda: journal.lines[-1] == "stop slow")  # it finished its clean-up on its own
    RELEASE.set()
    assert wait_for(lambda: not busy.is_alive())
    assert "stop brutal" in journal.lines  # killed once its message was done


def test_monitors_report_the_reason(journal: Journal) -> None:
    downs: list[tuple[str, object]] = []

    class Watcher(Actor):
        def on_receive(self, message: Any) -> None:
            if isinstance(message, Down):
                downs.append(("message", message.reason))

    watcher = Watcher.start()
    for how in ("stop", "crash", "exit", "kill"):
        ref = Worker.start(how, journal)

        def record(_ref: object, reason: object, how: str = how) -> None:
            downs.append((how, reason))

        monitor(ref, record)
        if how == "stop":
            monitor(ref, watcher)
            ref.stop()
        elif how == "kill":
            kill(ref, "shutdown")
        else:
            ref.tell(how)
    assert wait_for(lambda: len(downs) == 5)
    reasons = dict(downs)
    assert reasons["stop"] == NORMAL and reasons["message"] == NORMAL
    assert isinstance(reasons["crash"], RuntimeError)
    assert isinstance(reasons["exit"], SystemExit)
    assert reasons["kill"] == "shutdown"
    dead = Worker.start("dead", journal)
    dead.stop()
    late: list[object] = []
    monitor(dead, lambda _r, reason: late.append(reason))
    assert late == ["noproc"]
    watcher.stop()
    with pytest.raises(TypeError, match=r"not a rho_actors\.Actor"):
        monitor(pykka.ThreadingActor.start(), lambda _r, _reason: None)
    pykka.ActorRegistry.stop_all()


def test_whereis_follows_a_restart_and_an_old_ref_fails_fast(journal: Journal, names: Names) -> None:
    sup = started_sup([spec("kv", journal)], names)
    old = names.whereis("kv")
    assert old is not None and old.ask("hi", timeout=WAIT_S) == 1
    crash_and_wait(names, "kv", journal, 2)
    new = names.whereis("kv")
    assert new is not None and new.ask("hi", timeout=WAIT_S) == 1  # fresh state
    began = time.monotonic()
    with pytest.raises(pykka.ActorDeadError):
        old.ask("hi", timeout=WAIT_S)
    assert time.monotonic() - began < slack(1.0)
    sup.stop()


def test_a_child_that_fails_to_start_fails_its_supervisor_start(journal: Journal, names: Names) -> None:
    class Broken(Actor):
        def on_start(self) -> None:
            raise ValueError("no database")

    with pytest.raises(RuntimeError, match="failed to start"):
        started_sup([spec("a", journal), ChildSpec("broken", StartChild(Broken))], names)
    assert wait_for(lambda: "stop a" in journal.lines)  # the started sibling was stopped again


def test_bad_child_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="restart must be one of"):
        ChildSpec("x", StartChild(Worker), restart="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shutdown must be"):
        ChildSpec("x", StartChild(Worker), shutdown=-1)
    with pytest.raises(ValueError, match="strategy must be one of"):
        Supervisor(strategy="all_for_none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unique"):
        Supervisor([ChildSpec("x", StartChild(Worker)), ChildSpec("x", StartChild(Worker))])


def test_crashing_children_for_a_while_leaves_no_thread_after_stop(journal: Journal, names: Names) -> None:
    before = set(threading.enumerate())
    sup = started_sup(
        [spec(f"w{i}", journal) for i in range(4)], names, strategy="rest_for_one", max_restarts=10_000, max_seconds=1
    )
    began = time.monotonic()
    crashes = 0
    while time.monotonic() - began < 2.5 or crashes <= 50:  # crashing for 2.5 s, and more than 50 times
        assert time.monotonic() - began < WAIT_S, f"{crashes} crashes in {WAIT_S} s"
        ref = names.whereis(f"w{crashes % 4}")
        if ref is not None:
            ref.tell("crash" if crashes % 2 else "exit")
            crashes += 1
        time.sleep(0.002)
    assert crashes > 50
    assert sup.is_alive()
    sup.stop(timeout=WAIT_S)
    assert extra_threads(before) == []


def test_a_child_that_never_starts_again_makes_its_supervisor_give_up_stopping_the_siblings(
    journal: Journal, names: Names
) -> None:
    class Fragile(Worker):
        starts = 0

        def on_start(self) -> None:
            type(self).starts += 1
            if type(self).starts > 1:
                raise ValueError("cannot come back")
            super().on_start()

    fragile = ChildSpec("fragile", StartChild(Fragile, ("fragile", journal)), name="fragile")
    temp = spec("temp", journal, "temporary")
    sup = started_sup([spec("a", journal), temp, fragile], names, strategy="one_for_all")
    downs: list[object] = []
    monitor(sup, lambda _r, reason: downs.append(reason))
    first_a = names.whereis("a")
    assert first_a is not None
    ref = names.whereis("fragile")
    assert ref is not None
    ref.tell("crash")
    assert wait_for(lambda: len(downs) == 1)
    assert isinstance(downs[0], RestartIntensityExceeded)
    assert "more than 3 restarts" in str(downs[0]) and "cannot come back" in str(downs[0])
    assert names.whereis("a") is None and names.whereis("temp") is None  # nothing left unsupervised
    assert journal.starts("temp") == 1  # a temporary child is not restarted with its group
    assert wait_for(lambda: not first_a.is_alive())


def test_on_stop_raising_a_base_exception_still_stops_with_that_reason() -> None:
    class ExitsOnStop(Actor):
        def on_stop(self) -> None:
            raise SystemExit(3)

    other = Worker.start("other", Journal())
    ref = ExitsOnStop.start()
    downs: list[object] = []
    monitor(ref, lambda _r, reason: downs.append(reason))
    assert ref.stop(timeout=WAIT_S) is True
    assert wait_for(lambda: len(downs) == 1) and isinstance(downs[0], SystemExit)
    assert other.is_alive()  # pykka would have stopped every actor
    other.stop()


class Flaky(Worker):
    """Its start number ``n`` raises when ``n`` is in ``failing`` (a socket not ready yet)."""

    failing: frozenset[int] = frozenset()
    attempts = 0

    def on_start(self) -> None:
        type(self).attempts += 1
        if type(self).attempts in self.failing:
            raise ConnectionRefusedError(f"start {type(self).attempts}: not ready")
        super().on_start()


class Reports:
    """A supervisor's ``report`` callback that keeps (kind, child) pairs."""

    def __init__(self) -> None:
        self.events: list[SupervisorEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: SupervisorEvent) -> None:
        with self.lock:
            self.events.append(event)

    def kinds(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(e.kind, e.child) for e in self.events]


def test_a_restart_that_fails_once_is_tried_again_within_the_intensity(journal: Journal, names: Names) -> None:
    class FailsOnce(Flaky):
        failing = frozenset({2})  # the first restart

    reports = Reports()
    sup = started_sup([spec("a", journal), ChildSpec("f", StartChild(FailsOnce, ("f", journal)), name="f")], names,
                      report=reports, label="sup")
    first = names.whereis("f")
    assert first is not None
    first.tell("crash")
    assert wait_for(lambda: names.whereis("f") not in (None, first))
    assert sup.is_alive() and names.lookup("f").ask("hi", timeout=WAIT_S) == 1
    assert FailsOnce.attempts == 3 and journal.starts("a") == 1
    # reported once the restarted child is up (it is named first): awaited, not read at once
    assert wait_for(lambda: reports.kinds() == [("started", "a"), ("started", "f"), ("crashed", "f"),
                                                ("start_failed", "f"), ("restarted", "f")]), reports.kinds()
    failed = reports.events[3]
    assert failed.supervisor == "sup" and "ConnectionRefusedError: start 2: not ready" in (failed.reason or "")
    assert reports.events[2].reason == "RuntimeError: crash" and reports.events[4].restarts == 2
    sup.stop()


def test_a_restart_that_keeps_failing_gives_up_at_the_intensity_only(journal: Journal, names: Names) -> None:
    class NeverAgain(Flaky):
        failing = frozenset(range(2, 100))

    reports = Reports()
    sup = started_sup([ChildSpec("n", StartChild(NeverAgain, ("n", journal)), name="n")], names,
                      report=reports, max_restarts=3, max_seconds=60)
    downs: list[object] = []
    monitor(sup, lambda _r, reason: downs.append(reason))
    names.lookup("n").tell("crash")
    assert wait_for(lambda: len(downs) == 1)
    assert isinstance(downs[0], RestartIntensityExceeded)
    assert NeverAgain.attempts == 4  # the first start, then 3 restarts that failed: the 4th restart is one too many
    kinds = [k for k, _ in reports.kinds()]
    assert kinds == ["started", "crashed", "start_failed", "start_failed", "start_failed", "gave_up"]
    with pytest.raises(NotRunningError, match=r"its supervisor gave up on it .*more than 3 restarts") as err:
        names.lookup("n")
    assert err.value.reason is downs[0] and names.exit_reason("n") is downs[0]
    assert isinstance(err.value, pykka.ActorDeadError)


def test_auto_shutdown_ends_a_supervisor_with_its_significant_child(journal: Journal, names: Names) -> None:
    with pytest.raises(ValueError, match="permanent child cannot be significant"):
        ChildSpec("x", StartChild(Worker), significant=True)
    child = ChildSpec("t", StartChild(Worker, ("t", journal)), restart="transient", significant=True, name="t")
    sup = started_sup([spec("a", journal), child], names, auto_shutdown="any_significant")
    downs: list[object] = []
    monitor(sup, lambda _r, reason: downs.append(reason))
    names.lookup("t").tell("crash")  # abnormal: restarted, no shutdown
    # restarted once its name is back (the start is journaled before the supervisor registers it)
    assert wait_for(lambda: journal.starts("t") == 2 and names.whereis("t") is not None) and sup.is_alive()
    names.lookup("t").stop()  # normal: not restarted, so the supervisor ends too
    assert wait_for(lambda: downs == [NORMAL])
    assert "stop a" in journal.lines and names.exit_reason("t") == NORMAL


def test_which_and_count_children_are_plain_calls_and_names_need_no_registry_object(journal: Journal) -> None:
    sup = start_link(Supervisor, [spec("solo-a", journal), spec("solo-b", journal, "transient")])
    try:
        assert [c.id for c in which_children(sup)] == ["solo-a", "solo-b"]
        assert count_children(sup) == {"specs": 2, "active": 2, "supervisors": 0, "workers": 2}
        ref = whereis("solo-a")  # the process's own registry, as Erlang's register/whereis
        assert ref is not None and ref.ask("hi", timeout=WAIT_S) == 1
    finally:
        sup.stop()
    assert whereis("solo-a") is None
    with pytest.raises(pykka.ActorDeadError):
        which_children(sup)


def test_the_guide_s_supervision_snippet_runs_as_written() -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "supervision.md").read_text()
    section = guide.split("## Supervision (OTP)", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    [snippet] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, "supervision.md", "exec"), {"__name__": "guide_snippet"})
    after = section.split(snippet, 1)[1]  # the output block follows the snippet
    expected = re.findall(r"```text\n(.*?)```", after, flags=re.S)[0]
    assert printed.getvalue() == expected


class HeldRestart(Worker):
    """Its restarts (not its first start) wait for ``GATE``."""

    GATE = threading.Event()

    def on_start(self) -> None:
        if self.journal.starts(self.name):
            HeldRestart.GATE.wait(WAIT_S)
        super().on_start()


def test_await_name_waits_for_a_restart_and_not_for_a_name_given_up(journal: Journal, names: Names) -> None:
    HeldRestart.GATE.clear()
    sup = started_sup([ChildSpec("kv", StartChild(HeldRestart, ("kv", journal)), name="kv")], names)
    old = names.whereis("kv")
    assert old is not None
    old.tell("crash")
    assert wait_for(lambda: names.whereis("kv") is None)  # held in its restart
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(names.await_name("kv", WAIT_S)))
    waiter.start()
    assert names.await_name("kv", 0.0) is None  # no patience: none now
    HeldRestart.GATE.set()
    waiter.join(WAIT_S)
    assert got and got[0] is not None and got[0] is not old and got[0].ask("hi", timeout=WAIT_S) == 1
    sup.stop()
    # a name whose supervisor gave up, or a wait abandoned, returns at once, not at the bound
    names.gave_up("gone", RestartIntensityExceeded("gone: more than 1 restart in 1 s"))
    began = time.monotonic()
    assert names.await_name("gone", 2 * WAIT_S) is None
    assert names.await_name("never", 2 * WAIT_S, abandon=lambda: True) is None
    assert time.monotonic() - began < WAIT_S


def test_actor_urns_are_random_version_4_uuids_found_in_the_registry() -> None:
    urns = {new_urn() for _ in range(20_000)}
    assert len(urns) == 20_000
    for urn in list(urns)[:500]:
        assert urn.startswith("urn:uuid:")
        parsed = uuid.UUID(urn.removeprefix("urn:uuid:"))
        assert parsed.urn == urn and parsed.version == 4 and parsed.variant == uuid.RFC_4122
    ref = Actor.start()
    try:
        assert uuid.UUID(ref.actor_urn.removeprefix("urn:uuid:")).version == 4
        found = pykka.ActorRegistry.get_by_urn(ref.actor_urn)
        assert found is not None and found.actor_urn == ref.actor_urn
    finally:
        ref.stop()
