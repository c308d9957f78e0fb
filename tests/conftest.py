"""Shared fixtures: a fresh ActorSystem per test, and helpers that wait with a bound.

Time in the tests comes from here, and scales with the machine. A test either waits on
an event (a future, a line, a process's exit) bounded by :data:`WAIT_S`, a bound only a
hang reaches, or checks a duration the product promises (a deadline met "within 0.5 s
of slack") against :func:`slack`, which grows with the machine's load per core at the
moment of the check. ``RHO_TEST_TIME_FACTOR`` (a number, default 1) multiplies both, and
every test's pytest-timeout too, for a machine slower than load alone shows (an emulated
or instrumented interpreter). A worker's start is such an event: the product's default
bound on it (``start_timeout_ms``, 10 s, past which a call is ``unavailable``) is raised
to :data:`WAIT_S` for every system and pool the tests build without their own, and in
every process they start (``RHO_ACTORS_START_TIMEOUT_MS``). ``make test-loaded`` runs the suite while busy loops keep
every core busy (``tests/loaded.py``): it must pass as a quiet run does.

Files a confined process (uid 65534) must read go in :func:`open_folder`, never in the
checkout or ``tmp_path``, which may lie in folders only their owner can enter.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, AnyStr

import pykka
import pytest
from loguru import logger

from rho_actors import ActorSystem, UntrustedReads
from rho_actors.otp.supervisor import Supervisor
from rho_actors.sandbox import START_TIMEOUT_ENV
from rho_actors.sandbox.clean import preload_modules

if TYPE_CHECKING:
    from rho_actors.sandbox import WorkerPool

    from .wire_server import WireServer

def _time_factor() -> float:
    text = os.environ.get("RHO_TEST_TIME_FACTOR", "").strip()
    try:
        factor = float(text) if text else 1.0
    except ValueError:
        raise ValueError(f"RHO_TEST_TIME_FACTOR must be a number, not {text!r}") from None
    if not factor >= 1.0:
        raise ValueError(f"RHO_TEST_TIME_FACTOR must be at least 1, not {text!r}")
    return factor


TIME_FACTOR = _time_factor()
"""``RHO_TEST_TIME_FACTOR`` (default 1): multiplies every time bound of the tests."""

WAIT_S = 60.0 * TIME_FACTOR
"""Upper bound on any wait for an event in the tests: reaching it means a hang (a
failure), never a pass; a working run on a machine at a load of 15 on 2 cores stays
far below it."""

os.environ.setdefault(START_TIMEOUT_ENV, str(int(WAIT_S * 1000)))  # a worker's start is waited for as an event

READS = UntrustedReads(timeout_s=WAIT_S)
"""How the tests' systems read untrusted declarations: within :data:`WAIT_S`, not the
default 2 s, which a throwaway child on a loaded machine (its imports, a tool module
imported by value) can pass: the read fails ``(timeout)`` and the tool is not offered.
Tests of the read's own bound give theirs."""


def load_per_core() -> float:
    """The machine's load per core now, at least 1: the tasks runnable this instant or,
    when more, the last minute's load average, over the cores."""
    runnable = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/loadavg") as f:
        runnable = float(f.read().split()[3].split("/")[0]) - 1  # less the reader itself
    return max(1.0, max(runnable, os.getloadavg()[0]) / (os.cpu_count() or 1))


def slack(seconds: float) -> float:
    """``seconds`` of slack, a quiet machine's, as this machine allows now: times
    :data:`TIME_FACTOR` and :func:`load_per_core`. For a duration the product promises
    (``elapsed < deadline + slack(0.5)``); a wait for an event takes :data:`WAIT_S`."""
    return seconds * TIME_FACTOR * load_per_core()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test's pytest-timeout (its mark's, else the configured one) is a hang bound
    too: scaled by :data:`TIME_FACTOR` and the load per core at the start, at least
    twice :data:`WAIT_S`."""
    factor = TIME_FACTOR * load_per_core()
    for item in items:
        marker = item.get_closest_marker("timeout")
        given = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
        if not given:
            continue
        item.add_marker(pytest.mark.timeout(max(float(given) * factor, 2 * WAIT_S)), append=False)


def closed_to_others(path: Path) -> str | None:
    """Why a user other than this file's owner (uid 65534, a confined process) cannot
    reach ``path`` by mode bits: the first folder on the way not searchable by others,
    or ``None``."""
    for folder in [*reversed(path.resolve().parents), path.resolve()]:
        mode = folder.stat().st_mode
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return f"{folder} (mode {stat.filemode(mode)}) is closed to other users"
    return None


@contextlib.contextmanager
def open_folder(*copies: Path | str) -> Iterator[Path]:
    """A fresh folder every user can enter and read (mode 0755, in the system's
    temporary folder, not under ``tmp_path``'s 0700 parents), holding a readable copy of
    each file of ``copies``; removed afterwards. For files a confined process must read."""
    folder = Path(tempfile.mkdtemp(prefix="rho-open-"))
    try:
        folder.chmod(0o755)
        for copy in copies:
            shutil.copy(copy, folder / Path(copy).name)
            (folder / Path(copy).name).chmod(0o644)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def reuse_pid(pid: int, *, session: bool = False) -> Any:
    """A new process (``sleep``) with the pid ``pid`` of one that ended and was reaped,
    made through ``ns_last_pid`` (root); ``session``: it leads a new session, so its
    process group has that id too (what a ``killpg`` of the old pid would reach). Skips
    the test where that cannot be done."""
    import subprocess

    last = Path("/proc/sys/kernel/ns_last_pid")
    if os.geteuid() != 0 or not os.access(last, os.W_OK):
        pytest.skip("making a pid be reused needs root and /proc/sys/kernel/ns_last_pid")
    for _ in range(50):  # another process may take the pid first: made again
        last.write_text(str(pid - 1))
        proc = subprocess.Popen(["sleep", "120"], start_new_session=session)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait(WAIT_S)
    pytest.skip(f"pid {pid} could not be made again")


def wait_for(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Poll ``predicate`` until true or ``timeout_s``; returns its last value."""
    until = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > until:
            return False
        time.sleep(0.005)
    return True


def read_line(stream: IO[AnyStr], timeout_s: float = WAIT_S) -> AnyStr:
    """The next line of ``stream`` (a child's pipe, text or bytes), failing the test when
    none comes within ``timeout_s`` seconds (the reading thread is a daemon: a stuck pipe
    does not hold pytest). Unlike ``select`` on the pipe, lines already in the stream's
    buffer are found."""
    lines: queue.Queue[AnyStr] = queue.Queue()
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
    sys_ = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, untrusted=READS)
    try:
        yield sys_
    finally:
        sys_.stop()


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    """A process ``WorkerPool`` with one warm worker (pickle codec), stopped after the test."""
    from rho_actors.sandbox import WorkerPool

    p = WorkerPool(warm=1, codec="pickle")
    try:
        assert p.wait_warm(WAIT_S)
        yield p
    finally:
        p.stop()


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
    from .wire_server import WireServer

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


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file each run of a counting test tool appends a line to (``$RHO_TEST_RUNS``, set
    here for this test's processes and the hosts it starts): runs counted across processes."""
    path = tmp_path / "runs.log"
    path.touch()
    monkeypatch.setenv("RHO_TEST_RUNS", str(path))
    return path
