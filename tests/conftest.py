"""Shared fixtures: a fresh ActorSystem per test, and helpers that wait with a bound."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pykka
import pytest
from loguru import logger

from rho_actors import ActorSystem
from rho_actors.otp.supervisor import Supervisor
from rho_actors.sandbox.clean import preload_modules

from .wire_server import WireServer

WAIT_S = 10.0
"""Upper bound on any wait in the tests: reaching it means a failure, never a pass."""


def wait_for(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Poll ``predicate`` until true or ``timeout_s``; returns its last value."""
    until = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > until:
            return False
        time.sleep(0.005)
    return True


def read_line(stream: IO[str], timeout_s: float = WAIT_S) -> str:
    """The next line of ``stream`` (a child's pipe), failing the test when none comes within
    ``timeout_s`` seconds (the reading thread is a daemon: a stuck pipe does not hold
    pytest)."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no line within {timeout_s} s") from None


def extra_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads alive now that were not in ``before``, after giving them up to WAIT_S to end."""
    for thread in set(threading.enumerate()) - before:
        thread.join(WAIT_S)
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    sys_ = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    try:
        yield sys_
    finally:
        sys_.stop()


@pytest.fixture
def logs() -> Iterator[list[str]]:
    """Messages rho_actors logs during the test (loguru enabled for its duration)."""
    seen: list[str] = []
    logger.enable("rho_actors")
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="DEBUG")
    try:
        yield seen
    finally:
        logger.remove(sink)
        logger.disable("rho_actors")


class Recorder:
    """Collects call events from a system subscription."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        with self._lock:
            self.events.append(event)

    def kinds(self, call_id: str) -> list[str]:
        with self._lock:
            return [e.kind for e in self.events if getattr(e, "call_id", None) == call_id]


# Untrusted children start from rho's clean fork server, which never imports the host's
# main module: have it import pytest once, as multiprocessing's fork server did through
# the test runner's __main__, so a tool defined in a test module loads as fast as before.
preload_modules("pytest")


@pytest.fixture
def server() -> Iterator[WireServer]:
    """A loopback server speaking the providers' wire rules (:class:`WireServer`), per test."""
    with WireServer() as srv:
        yield srv


def supervisors_labelled(label: str) -> list[pykka.ActorRef[Any]]:
    """The running supervisors whose ``label`` is ``label`` (``"session:s1"``...)."""
    found = []
    for ref in pykka.ActorRegistry.get_by_class(Supervisor):
        try:
            if ref.proxy().label.get(timeout=WAIT_S) == label:
                found.append(ref)
        except pykka.ActorDeadError:
            pass
    return found
