"""The host's background loops when one step of theirs raises what they did not expect
(DESIGN §5): the output pump that reads every child's output, the memory watch of a
process tree without a cgroup, the thread that gives a confined child's uid back. Each
logs it with loguru and goes on (the pump with its other children, the watch with its
next look); none ends silently, leaving every child's output unread (each blocks in its
own ``write`` once its pipe is full) or a tree's memory unbounded.

Each failure is forced once by a hook; every wait is bounded by ``WAIT_S``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from rho_actors.sandbox.confine.enclosure import Enclosure
from rho_actors.sandbox.confine.trees import RssSampler
from rho_actors.sandbox.output import OutputPump, OutputStream

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(120)


def test_a_stream_whose_read_fails_is_dropped_and_the_pump_reads_the_others_on(
        monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    """A child's output whose handling raises (here its lines' split): that stream is
    logged and dropped, and another child's output is still read and logged (the pump's
    one thread ended there: no child's output was read again)."""
    real_feed = OutputStream.feed
    failed = threading.Event()

    def feed(self: OutputStream, data: bytes) -> None:
        if self.label == "bad child":
            failed.set()
            raise RuntimeError("feeding failed (test)")
        real_feed(self, data)

    monkeypatch.setattr(OutputStream, "feed", feed)
    pump = OutputPump()
    bad_r, bad_w = os.pipe()
    good_r, good_w = os.pipe()
    try:
        pump.add(bad_r, "bad child")
        os.write(bad_w, b"boom\n")
        assert failed.wait(WAIT_S), "the pump never read the first child's output"
        pump.add(good_r, "good child")
        os.write(good_w, b"hello\n")
        assert wait_for(lambda: any(line == "output of good child: hello" for line in logs)), logs
        assert any("reading the output of bad child failed" in line for line in logs), logs
    finally:
        os.close(bad_w)
        os.close(good_w)


def test_a_memory_watch_whose_look_raises_goes_on_and_still_kills_a_tree_over_its_bound(
        monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    """The memory watch of a tree without a cgroup (``RssSampler``) whose look raises
    once: it logs it and looks again, and kills the tree once over its bound (its
    thread ended there: the tree ran on unbounded)."""
    real_check = RssSampler.check
    raised = threading.Event()

    def check(self: RssSampler) -> bool:
        if not raised.is_set():
            raised.set()
            raise RuntimeError("looking failed (test)")
        return bool(real_check(self))

    monkeypatch.setattr(RssSampler, "check", check)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    sampler = RssSampler(child.pid, bound_bytes=1)  # any process is over one byte
    try:
        sampler.start()
        assert raised.wait(WAIT_S)
        assert sampler.exceeded.wait(WAIT_S), "the watch stopped at a look that raised"
        assert child.wait(WAIT_S) == -9
        assert any(f"the memory watch of process {child.pid} failed to look" in line for line in logs), logs
    finally:
        sampler.stop()
        child.kill()
        child.wait(WAIT_S)


def test_giving_a_uid_back_that_fails_is_logged_and_keeps_the_uid_leased(logs: list[str]) -> None:
    """The thread that gives a confined child's uid back once its tree is gone, when
    looking at that tree raises: it says so, naming the uid, and the uid stays leased
    (never given to another child while a process of it may run)."""
    released: list[int] = []
    enclosure: Any = Enclosure.__new__(Enclosure)
    enclosure.cgroup = None
    enclosure.uid_lease = type("Lease", (), {"uid": 61_234, "release": lambda self: released.append(self.uid)})()

    def tree_gone() -> bool:
        raise PermissionError("/proc unreadable (test)")

    enclosure._tree_gone = tree_gone
    enclosure._dispose_once_gone()  # raised here, in its own thread: ended it with no word in the log
    assert not released
    assert any("disposing of uid 61234 failed; it stays leased" in line for line in logs), logs


def test_a_ray_node_watcher_round_that_raises_is_logged_and_the_watcher_watches_on(
        monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    """A round of the Ray node watcher that raises (a lost node's server that fails to be
    told): logged, and the next round comes (the thread ended there: calls on lost
    nodes were no longer ended at once, and a local Ray's processes, which die with the
    thread that started them, this one, died with it)."""
    pytest.importorskip("ray")
    from rho_actors.isolation.ray_tasks import RayRuntime

    runtime = RayRuntime()  # not connected: the watcher's loop alone, run here
    rounds: list[int] = []

    def watch_round() -> None:
        rounds.append(1)
        if len(rounds) == 1:
            runtime._wake.set()  # the next round at once
            raise RuntimeError("telling a server failed (test)")
        runtime._closing.set()  # the second round: the runtime shuts down
        runtime._closed.set()
        runtime._wake.set()

    monkeypatch.setattr(runtime, "_watch_round", watch_round)
    runtime._wake.set()
    runtime._watch()  # returns once shut down
    assert len(rounds) == 2
    assert any("a round of the Ray node watcher failed; it watches on" in line for line in logs), logs


def test_a_ray_node_watcher_round_that_raises_every_round_is_logged_at_each_doubling_only(
        monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    """A round that raises every time (once a second while calls are on Ray): the 1st,
    2nd, 4th and 8th of 9 failures in a row are logged (each was: a traceback a second,
    for as long as it lasted), then once that a round passed again."""
    pytest.importorskip("ray")
    from rho_actors.isolation.ray_tasks import RayRuntime

    runtime = RayRuntime()
    rounds: list[int] = []

    def watch_round() -> None:
        rounds.append(1)
        runtime._wake.set()  # the next round at once
        if len(rounds) <= 9:
            raise RuntimeError("telling a server failed (test)")
        if len(rounds) == 11:  # a second passing round: the run ended at the first
            runtime._closing.set()
            runtime._closed.set()

    monkeypatch.setattr(runtime, "_watch_round", watch_round)
    runtime._wake.set()
    runtime._watch()
    told = [line for line in logs if "a round of the Ray node watcher failed" in line]
    assert len(told) == 4, told
    assert told[-1].endswith("(8 failures in a row; the next logged at 16)"), told
    assert [line for line in logs if "a round passed again" in line] == [
        "the Ray node watcher: a round passed again after 9 failures in a row"], logs
