"""The live observer and ``rho-actors top``, against a real system and real sockets."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.cli import main
from rho_actors.observe.observer import Observer
from rho_actors.observe.top import TopView, connect, messages
from tests.conftest import WAIT_S, slack

RELEASE = threading.Event()


@tool(timeout_ms=30_000)
def hold(n: int) -> int:
    """Wait until released."""
    RELEASE.wait(WAIT_S)
    return n


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder: Unix socket paths are limited to ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rho-obs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def read_until(stream: Iterator[dict[str, Any]], predicate: Any) -> list[dict[str, Any]]:
    """Messages up to and including the first that satisfies ``predicate`` (within WAIT_S)."""
    seen = []
    until = time.monotonic() + WAIT_S
    for message in stream:
        seen.append(message)
        if predicate(message):
            return seen
        assert time.monotonic() < until, "the awaited message never came"
    raise AssertionError("the observer closed the stream")


def test_snapshot_and_stream_show_running_calls_with_time_left_then_their_end(
    system: ActorSystem, short_dir: Path
) -> None:
    RELEASE.clear()
    system.register(hold)
    system.register(add)
    observer = system.observe(short_dir / "obs.sock", interval_s=0.05)
    sock = connect(observer.address)
    sock.settimeout(WAIT_S)
    stream = messages(sock)
    first = next(stream)
    assert first["type"] == "snapshot" and first["tree"]["id"] == "root" and first["calls"] == []
    loops = [system.start_loop(f"s{i}") for i in range(3)]
    futures = [loop.submit_turn([ToolCall(f"{loop.session_id}-c{j}", "hold", f'{{"n": {j}}}') for j in range(2)]
                                + [ToolCall(f"{loop.session_id}-add", "add", '{"a": 1}')]) for loop in loops]
    finished: set[str] = set()

    def note(message: dict[str, Any]) -> dict[str, Any]:
        if message["type"] == "event" and message["kind"] == "finished":
            finished.add(message["call_id"])
        return message

    seen = read_until(map(note, stream), lambda m: m["type"] == "snapshot" and len(m["calls"]) == 6)
    view = seen[-1]
    assert {c["call_id"] for c in view["calls"]} == {f"s{i}-c{j}" for i in range(3) for j in range(2)}
    assert all(0 < c["ms_left"] <= 30_000 and c["tool"] == "hold" for c in view["calls"])
    assert {s["session_id"] for s in view["sessions"]} == {"s0", "s1", "s2"}
    assert any(e["kind"] == "started" and e["tool"] == "hold" for e in view["events"])
    assert view["dropped"] == 0 and "abandoned_threads_running" in view["stats"]
    RELEASE.set()
    read_until(map(note, stream), lambda m: len(finished) == 9)
    assert all(f.result(WAIT_S) for f in futures)
    sock.close()
    observer.close()
    assert not Path(observer.address).exists()


def test_a_tcp_observer_asks_for_its_token(system: ActorSystem) -> None:
    observer = system.observe(0)
    assert observer.address.startswith("127.0.0.1:") and observer.token
    with pytest.raises(ValueError, match="needs its token"):
        connect(observer.address)
    bad = connect(observer.address, "wrong")
    bad.settimeout(WAIT_S)
    with pytest.raises(ConnectionError, match="token"):
        next(messages(bad))
    bad.close()
    good = connect(observer.address, observer.token)
    good.settimeout(WAIT_S)
    assert next(messages(good))["type"] == "snapshot"
    good.sendall(b'{"stop": true}\nanything at all\n')  # nothing a viewer sends is acted upon
    assert system.start_loop("after").run_turn([]) == []
    good.close()


def test_a_viewer_that_never_reads_does_not_slow_the_system_and_its_drops_are_counted(
    system: ActorSystem, short_dir: Path
) -> None:
    system.register(add)
    observer = Observer(system, short_dir / "slow.sock", interval_s=60, max_queued=5)
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(observer.address)
    loop = system.start_loop("busy")
    done = 0
    while observer.dropped == 0 and done < 20_000:  # the stalled viewer's buffers fill, then it drops
        results = loop.run_turn([ToolCall(f"c{done + i}", "add", '{"a": 1}') for i in range(100)], timeout_s=WAIT_S)
        assert all(r.ok for r in results)
        done += 100
    assert observer.dropped > 0
    stalled.close()  # a dead viewer: the system goes on
    assert loop.run_turn([ToolCall("last", "add", '{"a": 2}')], timeout_s=WAIT_S)[0].content == "2"
    observer.close()


def test_top_renders_a_call_appearing_and_finishing(system: ActorSystem, short_dir: Path) -> None:
    RELEASE.clear()
    system.register(hold)
    observer = system.observe(short_dir / "top.sock", interval_s=0.05)
    sock = connect(observer.address)
    sock.settimeout(WAIT_S)
    stream = messages(sock)
    view = TopView()

    def screen() -> str:
        out = io.StringIO()
        Console(file=out, width=140, color_system=None).print(view.render())
        return out.getvalue()

    view.update(next(stream))
    assert "running calls (0)" in screen() and "sessions" in screen()
    bound = system.stats()["governor"]["max_thread_calls"]
    assert f"governor: thread calls 0/{bound}   running: -   queued: -   refused: -   retried: 0" in screen()
    future = system.start_loop("watched").submit_turn([ToolCall("call-7", "hold", '{"n": 7}')])
    for message in read_until(stream, lambda m: m["type"] == "event" and m["kind"] == "started"):
        view.update(message)
    shown = screen()
    assert "running calls (1)" in shown and "call-7" in shown and "hold" in shown
    RELEASE.set()
    for message in read_until(stream, lambda m: m["type"] == "event" and m["kind"] == "finished"):
        view.update(message)
    shown = screen()
    assert "running calls (0)" in shown and "finished" in shown and "ok" in shown
    assert future.result(WAIT_S)[0].content == "7"
    sock.close()


def test_top_once_json_prints_one_snapshot(
    system: ActorSystem, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    observer = system.observe(short_dir / "once.sock")
    system.start_loop("s1")
    assert main(["top", "--connect", observer.address, "--once", "--json"]) == 0
    snapshot = json.loads(capsys.readouterr().out)
    assert snapshot["type"] == "snapshot" and [s["session_id"] for s in snapshot["sessions"]] == ["s1"]
    assert main(["top", "--connect", observer.address, "--once"]) == 0
    assert "supervision tree" in capsys.readouterr().out
    assert main(["top", "--connect", str(short_dir / "missing.sock"), "--once"]) == 2
    assert "cannot reach the observer" in capsys.readouterr().err


def test_tcp_connections_that_withhold_their_token_are_capped_and_closed_at_a_deadline(system: ActorSystem) -> None:
    """Slow connections on the TCP port get no thread past ``max_unauthenticated``; one
    that trickles its token line a byte at a time is closed at ``token_deadline_s`` in
    all (a per-recv timeout never fires for it); a viewer with the token is served after."""
    observer = system.observe(0, max_unauthenticated=3, token_deadline_s=1.0)
    host, port = observer.address.split(":")
    before = threading.active_count()
    opened = time.monotonic()  # no deadline of theirs begins before this
    slow = [socket.create_connection((host, int(port)), WAIT_S) for _ in range(3)]
    for s in slow:
        s.sendall(b'{"tok')
    assert _wait(lambda: observer.stats()["unauthenticated"] == 3)
    extra = [socket.create_connection((host, int(port)), WAIT_S) for _ in range(5)]
    for s in extra:  # refused at once, with a reason, before any thread is given to them
        s.settimeout(WAIT_S)
        assert b"too many connections are waiting" in s.recv(200)
        assert s.recv(200) == b""
    assert observer.stats()["refused"] == 5
    assert threading.active_count() <= before + 3
    started = time.monotonic()  # every deadline of theirs began by now, or begins soon after (its thread late)
    closed = 0
    while closed < 3:  # a byte every 0.1 s: only an absolute deadline ends these
        assert time.monotonic() - started < WAIT_S, "slow connections were never closed"
        for s in slow:
            with contextlib.suppress(OSError):
                s.sendall(b"x")
        time.sleep(0.1)
        closed = sum(1 for s in slow if _closed(s))
    # not before a second from their connecting (the refused ones may have taken longer than that on a loaded
    # machine), nor long after a second from the look that found all three waiting
    assert time.monotonic() - opened >= 0.9 and time.monotonic() - started < 1.0 + slack(2.0)
    assert observer.stats() | {"refused": 5} == {
        "viewers": 0, "unauthenticated": 0, "max_unauthenticated": 3, "token_deadline_s": 1.0,
        "refused": 5, "timed_out": 3, "dropped": 0}
    good = connect(observer.address, observer.token)
    good.settimeout(WAIT_S)
    assert next(messages(good))["type"] == "snapshot"
    assert observer.stats()["viewers"] == 1
    for s in [*slow, *extra, good]:
        s.close()
    observer.close()
    with pytest.raises(ValueError, match="max_unauthenticated"):
        system.observe(0, max_unauthenticated=0)


def _wait(predicate: Any) -> bool:
    until = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > until:
            return False
        time.sleep(0.01)
    return True


def _closed(sock: socket.socket) -> bool:
    """Whether the peer has closed ``sock`` (its error line read and discarded)."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)
