"""The host's background loops when one step of theirs raises what they did not expect
(DESIGN §5): the output pump that reads every child's output, the memory watch of a
process tree without a cgroup, the thread that gives a confined child's uid back, the
Ray node watcher, the MCP server's reaper of absent sessions and its announcer of
tool-list changes, a stdio MCP server's stderr reader. Each logs it with loguru and goes
on (the pump with its other children, the watch with its next look); none ends
silently, leaving every child's output unread (each blocks in its own ``write`` once its
pipe is full), a tree's memory unbounded, absent clients' sessions held for good or
clients never told of a change.

Each failure is forced once by a hook; every wait is bounded by ``WAIT_S``.
"""

from __future__ import annotations

import asyncio
import importlib
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


class _Gone:
    """An HTTP guard whose every client is gone (for the reaper alone)."""

    client_gone_s = 0.004  # a round each millisecond
    idle_timeout_s = 3600.0
    reaped = 0

    def absent_for(self, http_id: str) -> float:
        return 3600.0


def _mcp_session(number: int) -> Any:
    session: Any = type("Session", (), {})()
    session.loop = type("Loop", (), {"session_id": f"s{number}"})()
    session.http_id, session.handle, session.offered_version = f"h{number}", None, -1
    return session


def test_the_mcp_reaper_whose_look_at_a_session_raises_logs_it_and_reaps_on(
        monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    """The MCP server's reaper of absent clients' sessions, when looking at one session
    raises (twice): logged, the other session of that round is stopped, and the next
    round stops the first (the task ended at the first: the server stopped reaping, for
    good, with no word)."""
    pytest.importorskip("mcp")
    kept = importlib.import_module("rho_actors.mcp.served_sessions")
    first, second = _mcp_session(1), _mcp_session(2)
    looks: list[str] = []
    closed: list[Any] = []

    def busy(session: Any) -> bool:
        looks.append(session.loop.session_id)
        if session is first and looks.count("s1") <= 2:
            raise RuntimeError("looking failed (test)")
        return False

    both = asyncio.Event()

    async def close(served: Any, session: Any) -> None:
        closed.append(session)
        served.sessions.discard(session)
        if not served.sessions:
            both.set()

    monkeypatch.setattr(kept, "_busy", busy)
    monkeypatch.setattr(kept, "close_session", close)
    served: Any = type("Served", (), {})()
    served.sessions = {first, second}

    async def main() -> None:
        reaper = asyncio.ensure_future(kept.reap_absent(served, _Gone()))
        try:
            await asyncio.wait([reaper, asyncio.ensure_future(both.wait())], timeout=WAIT_S,
                               return_when=asyncio.FIRST_COMPLETED)
            assert not reaper.done(), f"the reaper ended: {reaper.exception()!r}"
            assert both.is_set()
        finally:
            reaper.cancel()

    asyncio.run(main())
    assert set(closed) == {first, second}
    told = [line for line in logs if "reaping session s1 failed; the reaper goes on" in line]
    assert len(told) == 2 and told[1].endswith("(2 failures in a row; the next logged at 4)"), logs
    assert "MCP: the reaper of absent sessions: a round passed again after 2 failures in a row" in logs


def test_the_mcp_announcer_whose_announcement_raises_logs_it_and_announces_the_next_change(
        logs: list[str]) -> None:
    """The MCP server's announcer of tool-list changes, when an announcement raises (the
    listen streams' bus): logged, and the next change reaches the connections (the task
    ended there: no client heard of a change again)."""
    pytest.importorskip("mcp")
    serve = importlib.import_module("rho_actors.mcp.serve")
    heard: list[int] = []
    published: list[int] = []
    session = _mcp_session(1)

    took = asyncio.Event()
    told = asyncio.Event()

    async def publish(event: Any) -> None:
        published.append(1)
        took.set()
        if len(published) == 1:
            raise RuntimeError("publishing failed (test)")

    async def send_tool_list_changed() -> None:
        heard.append(served.system.tool_set().version)
        told.set()

    session.notify = type("Notify", (), {"send_tool_list_changed": staticmethod(send_tool_list_changed)})()
    served: Any = type("Served", (), {})()
    served.sessions = {session}
    served.bus = type("Bus", (), {"publish": staticmethod(publish)})()
    versions = iter(range(1, 100))
    tool_set = type("ToolSet", (), {})()
    served.system = type("System", (), {"tool_set": staticmethod(lambda: tool_set)})()

    async def main() -> None:
        changed = asyncio.Event()
        announcer = asyncio.ensure_future(serve._announce_changes(served, changed))
        try:
            tool_set.version = next(versions)
            changed.set()
            await asyncio.wait_for(took.wait(), WAIT_S)  # the first change taken (changed cleared): it raises
            tool_set.version = next(versions)
            changed.set()
            await asyncio.wait([announcer, asyncio.ensure_future(told.wait())], timeout=WAIT_S,
                               return_when=asyncio.FIRST_COMPLETED)
            assert not announcer.done(), f"the announcer ended: {announcer.exception()!r}"
        finally:
            announcer.cancel()

    asyncio.run(main())
    assert heard == [2]
    assert any("announcing a change of the tool set failed; the next change is announced" in line
               for line in logs), logs


def test_an_mcp_servers_stderr_line_that_cannot_be_logged_is_logged_so_and_the_next_read(
        monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    """A stdio MCP server's stderr reader whose handling of a line raises: it says so and
    reads the next line (the thread ended there: the server's stderr unread, the server
    blocked in its own ``write`` once the pipe was full)."""
    stderr_log = importlib.import_module("rho_actors.mcp.stderr_log")
    real = stderr_log.shown_bytes

    def shown(raw: bytes) -> str:
        if raw == b"bad":
            raise RuntimeError("showing failed (test)")
        return str(real(raw))

    monkeypatch.setattr(stderr_log, "shown_bytes", shown)
    log = stderr_log.StderrLog("noisy")
    log.writer.write("bad\ngood\n")
    log.close_writer()
    assert log.done.wait(WAIT_S)
    assert "MCP server noisy: a stderr line could not be logged; the next is read" in logs, logs
    assert "MCP server noisy: good" in logs, logs
