"""An untrusted tool's declaration read, bounded in size and in number (DESIGN §3, §5):
its answer is at most what a valid declaration can be, its arrays and objects are
counted before any is built, and reads take a place under the system's worker cap."""

from __future__ import annotations

import gc
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from rho_actors import ActorSystem, UntrustedReads
from rho_actors.sandbox import IsolatedReadError, declaration_answer_bytes, wire

from .conftest import WAIT_S, wait_for

_MIB = 2**20


class Flood:
    """Writes its own declaration answer on the read's channel: 31 MiB of empty objects
    (``{"answers": {"name": {"type": "str", "value": [{}, {}, ...]}}}``), then waits."""

    size = 31 * _MIB

    @classmethod
    def name(cls) -> str:
        [channel] = [o for o in gc.get_objects() if type(o).__name__ == "Channel"]
        fd = channel.conn.fileno()
        os.set_blocking(fd, True)
        body = b'{"answers": {"name": {"type": "str", "value": [' + b"{}," * (cls.size // 3) + b"{}]}}}"
        os.write(fd, struct.pack("!cQ", b"D", len(body)))
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view[: 4 * _MIB]):]
        time.sleep(30)  # ended by the host
        return "flood"

    description = staticmethod(lambda: "Flood.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    run = staticmethod(lambda args, ctx: "x")


class Packed(Flood):
    """The same within the answer's byte bound: 170,000 empty objects in 500 KB."""

    size = 500_000


class Wide:
    """A declaration too wide to be valid: a schema of 300,000 empty objects (its own
    callback returns it; the read answers within its bound, naming why it is not sent)."""

    name = staticmethod(lambda: "wide")
    description = staticmethod(lambda: "Wide.")
    parameter_schema = staticmethod(lambda: {"type": "object", "x": [{}] * 300_000})
    run = staticmethod(lambda args, ctx: "x")


def _host_rss() -> int:
    return int(psutil.Process().memory_info().rss)


def test_a_declaration_answer_is_bounded_to_what_a_valid_declaration_can_be(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, untrusted=UntrustedReads(timeout_s=WAIT_S), shutdown_ms=1_000) as system:
        before = _host_rss()
        registration = system.register(Flood, untrusted=True)
        assert not registration.offered
        bound = declaration_answer_bytes()
        assert bound < _MIB and registration.reason is not None
        assert f"more than the limit of {bound:,}" in registration.reason, registration.reason
        assert _host_rss() - before < 32 * _MIB  # read whole: +1.2 GiB, 9 to 12 s of host CPU
        registration = system.register(Packed, untrusted=True)
        assert not registration.offered and registration.reason is not None
        assert "JSON of more than 16,400 arrays and objects (166,671)" in registration.reason, registration.reason
        registration = system.register(Wide, untrusted=True)
        assert not registration.offered and registration.reason is not None
        assert "parameter_schema" in registration.reason and "arrays and objects" in registration.reason, (
            registration.reason)


class Slow:
    """A declaration that takes its time: each read is a process alive for 0.6 s."""

    def __init__(self, n: int) -> None:
        self.n = n

    def name(self) -> str:
        time.sleep(0.6)
        return f"slow{self.n}"

    description = staticmethod(lambda: "Slow.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    run = staticmethod(lambda args, ctx: "x")


def test_declaration_reads_take_places_under_the_worker_cap(tmp_path: Path) -> None:
    seen: list[int] = []
    stop = threading.Event()
    host = psutil.Process()

    def watch() -> None:
        while not stop.is_set():
            try:  # the fork server and its children: each read is one
                seen.append(len(host.children(recursive=True)))
            except psutil.Error:
                pass
            time.sleep(0.02)

    with ActorSystem(data_dir=tmp_path, untrusted=UntrustedReads(timeout_s=WAIT_S), max_workers=2,
                     shutdown_ms=1_000) as system:
        system.register(Slow(-1), untrusted=True)  # the fork server is up before the count starts
        base = len(host.children(recursive=True))
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        tools = [Slow(i) for i in range(8)]
        done = []

        def register(tool: Any) -> None:
            done.append(system.register(tool, untrusted=True))

        threads = [threading.Thread(target=register, args=(t,)) for t in tools]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S * 3)
        stop.set()
        watcher.join(WAIT_S)
        assert len(done) == 8 and all(r.offered for r in done), [r.reason for r in done]
        assert wait_for(lambda: len(system.tools()) == 9)
        assert max(seen) - base <= 2, (base, max(seen))  # today all 8 at once



def _slow_start_child(channel: Any, payload: Any) -> None:
    """A throwaway child whose start takes ``payload[0]`` seconds (a loaded machine's, a
    heavy import's) before its ``READY`` (none with ``None``), then answers at once."""
    delay, ready = payload
    time.sleep(delay)
    if ready:
        channel.send(wire.READY, b"")
    channel.send(wire.DECLARATION, b'{"answers": {}}')
    channel.recv()


def _answer(delay: float, ready: bool, timeout_s: float, start_s: float) -> Any:
    from rho_actors.sandbox.child import ChildSetup
    from rho_actors.sandbox.processes import context, spawn
    from rho_actors.sandbox.reads import await_answer

    child = spawn(context("forkserver"), _slow_start_child, (delay, ready), ChildSetup(0, env=dict(os.environ)),
                  name="rho-test-read")
    try:
        return await_answer(child, lambda: "reading the declaration of t", wire.DECLARATION, 1 << 20, timeout_s, None,
                            start_s=start_s)
    except IsolatedReadError as exc:
        return exc


def test_a_declaration_reads_timeout_counts_from_its_childs_start_bounded_apart() -> None:
    """A read's ``timeout_s`` (2 s by default) bounds the tool's load and declaration code,
    counted from the child's ``READY``; the child's start before it (a fork server's, a
    loaded machine's seconds: 1-2.5 s measured at load 30-37) is bounded by the start
    bound, as a worker's (``UntrustedReads.start_timeout_s``, by default 10 s or
    ``RHO_ACTORS_START_TIMEOUT_MS``). Before, the 2 s counted from the spawn: a start as
    slow as the bound left the tool out. A child that never says ``READY`` is a timeout
    naming the start bound."""
    for timeout_s in (2.0, 8.0):  # a start 1 s longer than the read's bound; (a loaded machine may pause the
        answer = _answer(timeout_s + 1, True, timeout_s, WAIT_S)  # child between its two frames: longer again)
        if answer == b'{"answers": {}}':
            break
    assert answer == b'{"answers": {}}', answer
    late = _answer(2.0, False, WAIT_S, 0.5)
    assert isinstance(late, IsolatedReadError) and late.kind == "timeout", late
    assert "did not start within 0.5 s (the start bound, RHO_ACTORS_START_TIMEOUT_MS)" in str(late), late



class Held:
    """A declaration read that never ends on its own: its process is killed at the stop."""

    @staticmethod
    def name() -> str:
        time.sleep(3600)
        return "held"

    description = staticmethod(lambda: "Held.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    run = staticmethod(lambda args, ctx: "x")


_HELPERS = ("rho-declaration-read", "rho-deliver")


def test_no_declaration_read_thread_runs_on_once_the_systems_stop_returned(tmp_path: Path) -> None:
    """A system stopped while an untrusted declaration is read: the read is cancelled and
    its thread has ended when ``stop()`` returns (it was cancelled after the tree was
    down and never waited for: still running, its process maybe still being killed,
    after the stop returned). The registration waiting for it fails, naming the stop."""
    before = set(threading.enumerate())
    system = ActorSystem(data_dir=tmp_path, untrusted=UntrustedReads(timeout_s=WAIT_S), shutdown_ms=1_000)
    outcome: list[BaseException | object] = []

    def register() -> None:
        try:
            outcome.append(system.register(Held, untrusted=True))
        except BaseException as exc:  # the stop's
            outcome.append(exc)

    registering = threading.Thread(target=register, daemon=True)
    try:
        registering.start()
        assert wait_for(lambda: any(t.name == "rho-declaration-read" and t not in before
                                    for t in threading.enumerate())), "the read never began"
    finally:
        system.stop()
    left = [t.name for t in threading.enumerate() if t.name in _HELPERS and t not in before and t.is_alive()]
    assert not left, left
    registering.join(WAIT_S)
    [got] = outcome
    assert isinstance(got, RuntimeError) and "stopped" in str(got), got
