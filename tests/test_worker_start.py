"""A ``process`` call's ``timeout_ms`` is the tool's own time, start to close (DESIGN §5
"Starting a worker"): waiting for a worker to start or to become free is bounded
separately by ``ActorSystem(start_timeout_ms=...)``, and a call that never got a worker is
``unavailable`` naming that bound, not a ``timeout`` of its tool. Registration warms the
tool's workers. Real workers, a real cap: one worker for the whole system, held by a
call of the test's choosing. A fresh fork server's first worker can take seconds on a
loaded machine: warm workers are waited for up to 3 x WAIT_S."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall
from rho_actors.sandbox import DEFAULT_START_TIMEOUT_MS, START_TIMEOUT_ENV, default_start_timeout_ms
from tests.conftest import WAIT_S, wait_for
from tests.helpers import make_tool


def _sleep(args: dict[str, Any], ctx: Any) -> str:
    time.sleep(args["s"])
    return f"slept {args['s']}"


def _sleeper(timeout_ms: int) -> Any:
    return make_tool("sleeper", _sleep, timeout_ms=timeout_ms,
                     schema={"type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"]})


def _held(args: dict[str, Any], ctx: Any) -> str:
    """Holds its worker until the test creates ``args["gate"]`` (at most a minute), then
    for ``args["s"]`` seconds more: how long it holds the worker counts from the test's say."""
    gate, until = Path(args["gate"]), time.monotonic() + 60
    while not gate.exists() and time.monotonic() < until:
        time.sleep(0.01)
    time.sleep(args.get("s", 0.0))
    return "held"


def _hog() -> Any:
    return make_tool("hog", _held, timeout_ms=int(3 * WAIT_S * 1000), schema={"type": "object"})


def _turn(system: ActorSystem, session: str, seconds: float, tool: str = "sleeper") -> Any:
    return system.start_loop(session).submit_turn([ToolCall(f"{session}-c", tool, json.dumps({"s": seconds}))])


def test_registration_warms_the_tools_workers_before_any_call(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, warm_workers=2) as system:
        system.register(_sleeper(5_000), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_idle", 0) == 2, 3 * WAIT_S), system.stats()
        assert system.stats()["workers_started"] == 2


def test_waiting_for_a_worker_does_not_count_against_the_calls_timeout(tmp_path: Path) -> None:
    """The only worker is busy until 1.5 s after the waiting call was submitted; that call,
    with a 1 s timeout, waits for it, then runs its 50 ms within its own second. (The hog
    holds its worker from the test's say, not for a fixed time from its own start: on a
    loaded machine submitting the second call can take longer than any fixed hold.)"""
    gate = tmp_path / "gate"
    with ActorSystem(tmp_path, max_workers=1, warm_workers=1) as system:
        system.register(_sleeper(1_000), isolation="process")
        system.register(_hog(), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_idle", 0) == 1, 3 * WAIT_S)
        hold = json.dumps({"gate": str(gate), "s": 1.5})
        hog = system.start_loop("hog").submit_turn([ToolCall("hog-c", "hog", hold)])
        assert wait_for(lambda: system.stats()["workers_busy"] == 1)
        waits = _turn(system, "waits", 0.05)
        gate.touch()  # the hog holds the worker 1.5 s from now: the waiting call waits longer than its timeout
        [waited] = waits.result(WAIT_S)
        assert waited.ok, waited.content
        assert waited.duration_ms > 1_000  # it did wait past its timeout, for the worker
        assert hog.result(WAIT_S)[0].ok


def test_a_call_that_never_gets_a_worker_is_unavailable_naming_the_start_bound(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with ActorSystem(tmp_path, max_workers=1, warm_workers=1, start_timeout_ms=300) as system:
        system.register(_sleeper(5_000), isolation="process")
        system.register(_hog(), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_idle", 0) == 1, 3 * WAIT_S)
        hog = system.start_loop("hog").submit_turn([ToolCall("hog-c", "hog", json.dumps({"gate": str(gate)}))])
        assert wait_for(lambda: system.stats()["workers_busy"] == 1)
        try:
            [never] = _turn(system, "never", 0.0).result(WAIT_S)  # the hog holds the worker until the gate
        finally:
            gate.touch()
        assert never.error_kind is ErrorKind.UNAVAILABLE, never.content
        assert "start bound of 300 ms" in never.content and "did not run" in never.content, never.content
        assert "did not finish" not in never.content  # not a timeout of the tool
        assert hog.result(WAIT_S)[0].ok


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_a_bad_start_timeout_is_refused(tmp_path: Path, bad: object) -> None:
    words = rf"ActorSystem\(start_timeout_ms=...\) must be whole milliseconds > 0 or None, not {bad!r}"
    with pytest.raises(ValueError, match=words):
        ActorSystem(tmp_path, start_timeout_ms=bad)  # type: ignore[arg-type]


def test_the_default_start_bound_is_the_environments_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RHO_ACTORS_START_TIMEOUT_MS`` sets the default of systems and pools given none (a
    loaded machine's, as the tests set it); unset, 10 s; anything but milliseconds > 0 is
    refused naming the variable."""
    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    assert default_start_timeout_ms() == DEFAULT_START_TIMEOUT_MS == 10_000
    monkeypatch.setenv(START_TIMEOUT_ENV, "45000")
    assert default_start_timeout_ms() == 45_000
    for bad in ("0", "-5", "1.5", "soon"):
        monkeypatch.setenv(START_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=rf"{START_TIMEOUT_ENV} must be whole milliseconds > 0, not '{bad}'"):
            default_start_timeout_ms()


def test_the_first_call_after_registration_finds_a_warm_worker_holding_its_tool(tmp_path: Path) -> None:
    """Registration had time to finish (the warm workers idle, the tool loaded into each):
    the first call starts no worker and ships no tool (the pool's own counts)."""
    with ActorSystem(tmp_path, warm_workers=2) as system:
        system.register(_sleeper(5_000), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_idle", 0) == 2
                        and system.stats().get("workers_loaded", 0) == 2, 3 * WAIT_S), system.stats()
        [first] = _turn(system, "s", 0.0).result(WAIT_S)
        assert first.ok, first.content
        stats = system.stats()
        assert (stats["workers_started"], stats["workers_shipped"]) == (2, 0), stats


def test_a_tool_registered_later_is_loaded_into_the_idle_workers(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, warm_workers=2) as system:
        system.register(_sleeper(5_000), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_loaded", 0) == 2, 3 * WAIT_S), system.stats()
        system.register(make_tool("later", _sleep, timeout_ms=5_000, schema={"type": "object"}), isolation="process")
        assert wait_for(lambda: system.stats()["workers_loaded"] == 4), system.stats()
        [result] = _turn(system, "s", 0.0, tool="later").result(WAIT_S)
        assert result.ok and system.stats()["workers_shipped"] == 0, (result.content, system.stats())


def _kill_my_fork_server(args: dict[str, Any], ctx: Any) -> str:
    os.kill(os.getppid(), signal.SIGKILL)  # the fork server this worker came from, as a kill from outside would
    time.sleep(60)  # its end takes this worker with it
    return "never"


def test_a_fork_servers_death_is_not_blamed_on_the_tool_and_the_next_call_runs(tmp_path: Path) -> None:
    """The fork server a worker came from ends mid-call (killed from outside): the worker
    ends with it; the call is ``unavailable`` naming the fork server, never a ``crashed``
    or ``exited`` of its tool, and the next call runs on a worker of a new fork server."""
    # a fork server's own start (an interpreter importing rho_actors) is not what is tested: bounded by WAIT_S
    with ActorSystem(tmp_path, warm_workers=1, start_timeout_ms=int(WAIT_S * 1000)) as system:
        system.register(make_tool("killer", _kill_my_fork_server, timeout_ms=60_000, schema={"type": "object"}),
                        isolation="process")
        system.register(_sleeper(5_000), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_idle", 0) == 1, 3 * WAIT_S), system.stats()
        [lost] = _turn(system, "s", 0.0, tool="killer").result(3 * WAIT_S)
        assert lost.error_kind is ErrorKind.UNAVAILABLE, lost.content
        assert "the fork server its worker process came from" in lost.content and "not the tool's" in lost.content
        [after] = _turn(system, "t", 0.0).result(3 * WAIT_S)
        assert after.ok, after.content


def _rebuilt_here() -> Any:
    """What a ``_DiesWhenLoaded`` unpickles to: itself in this host, a dead process in a
    worker (a child of a fork server)."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        os._exit(3)
    return _DiesWhenLoaded()


class _DiesWhenLoaded:
    """A trusted tool whose unpickling kills the worker process that loads it."""

    def name(self) -> str:
        return "dies_when_loaded"

    def description(self) -> str:
        return "Kills its worker as it is loaded."

    def parameter_schema(self) -> dict[str, Any]:
        return {"type": "object"}

    def run(self, args: Any, ctx: Any) -> str:
        return "never"

    def __reduce__(self) -> Any:
        return (_rebuilt_here, ())


def test_a_tool_whose_load_kills_its_worker_is_no_longer_loaded_ahead_of_other_tools_calls(tmp_path: Path) -> None:
    """Loaded ahead into every idle worker, a tool that kills the worker as it is
    unpickled must not become another tool's failure: its load is answered or the worker
    is lost there, and it is loaded ahead no more (only its own calls meet it)."""
    with ActorSystem(tmp_path, warm_workers=2) as system:
        system.register(_sleeper(5_000), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_loaded", 0) == 2, 3 * WAIT_S), system.stats()
        system.register(_DiesWhenLoaded(), isolation="process")
        for n in range(3):
            [result] = _turn(system, f"victim{n}", 0.0).result(3 * WAIT_S)
            assert result.ok and result.content == "slept 0.0", result.content
        [own] = _turn(system, "own", 0.0, tool="dies_when_loaded").result(3 * WAIT_S)
        assert not own.ok and "exit code 3" in own.content, own.content  # its own call says what it does


def _marked_here(path: str) -> Any:
    """What a ``_MarkedWhenLoaded`` unpickles to; in a worker it first appends the
    worker's pid to ``path``."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        with open(path, "a", encoding="ascii") as f:
            f.write(f"{os.getpid()}\n")
    return _MarkedWhenLoaded(path)


class _MarkedWhenLoaded:
    """A trusted tool that notes, in a file, each worker process that loads it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def name(self) -> str:
        return "marked"

    def description(self) -> str:
        return "Notes the workers that load it."

    def parameter_schema(self) -> dict[str, Any]:
        return {"type": "object"}

    def run(self, args: Any, ctx: Any) -> str:
        return "marked"

    def __reduce__(self) -> Any:
        return (_marked_here, (self.path,))


SLOW_LOAD_S = 6.0
"""Longer than the 5 s a load was once given: what importing torch or a large app takes on
a busy machine."""


def _slow_here() -> Any:
    """What a ``_SlowToLoad`` unpickles to: in a worker, after :data:`SLOW_LOAD_S`."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        time.sleep(SLOW_LOAD_S)
    return _SlowToLoad()


class _SlowToLoad(_DiesWhenLoaded):
    """A trusted tool whose unpickling in a worker takes :data:`SLOW_LOAD_S` (a heavy import)."""

    def name(self) -> str:
        return "slow_to_load"

    def __reduce__(self) -> Any:
        return (_slow_here, ())


def test_a_tool_whose_load_takes_seconds_is_still_loaded_ahead_of_its_first_call(tmp_path: Path) -> None:
    """A load is bounded as a worker's start is (30 s), not by a bound a heavy import
    outlasts on a busy machine: the tool is loaded ahead, and its first call ships nothing."""
    with ActorSystem(tmp_path, warm_workers=1) as system:
        system.register(_SlowToLoad(), isolation="process")
        assert wait_for(lambda: system.stats().get("workers_loaded", 0) == 1
                        and system.stats().get("workers_idle", 0) == 1, 3 * WAIT_S + SLOW_LOAD_S), system.stats()
        [first] = system.start_loop("s").submit_turn([ToolCall("c", "slow_to_load", "{}")]).result(WAIT_S)
        assert first.ok and first.content == "never", first.content
        stats = system.stats()
        assert (stats["workers_started"], stats["workers_shipped"]) == (1, 0), stats


def _exit_worker(args: dict[str, Any], ctx: Any) -> str:
    os._exit(0)


def test_an_unregistered_tool_is_loaded_into_no_new_worker(tmp_path: Path) -> None:
    """Unregistered, a tool is loaded ahead no more: a worker started after (replacing
    one that ended) does not load it (the file its unpickling writes names the workers
    that did)."""
    marks = tmp_path / "loaded-by"
    with ActorSystem(tmp_path / "data", warm_workers=2) as system:
        system.register(_MarkedWhenLoaded(str(marks)), isolation="process")
        system.register(make_tool("exits", _exit_worker, timeout_ms=5_000, schema={"type": "object"}),
                        isolation="process")
        assert wait_for(lambda: system.stats().get("workers_loaded", 0) == 4, 3 * WAIT_S), system.stats()
        assert len(marks.read_text().split()) == 2
        assert system.unregister("marked")
        [ended] = _turn(system, "s", 0.0, tool="exits").result(WAIT_S)
        assert ended.error_kind is ErrorKind.EXITED, ended.content
        assert wait_for(lambda: system.stats()["workers_started"] == 3 and system.stats()["workers_idle"] == 2,
                        3 * WAIT_S), system.stats()
        assert system.stats()["workers_loaded"] == 5, system.stats()  # the new worker loaded "exits" only
        assert len(marks.read_text().split()) == 2


def _stuck_here() -> Any:
    """What a ``_HangsWhenLoaded`` unpickles to: itself in this host; in a worker, it
    never returns (the worker is killed when its system stops)."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        time.sleep(3_600)
    return _HangsWhenLoaded()


class _HangsWhenLoaded(_DiesWhenLoaded):
    """A trusted tool whose unpickling hangs in a worker."""

    def name(self) -> str:
        return "hangs_when_loaded"

    def __reduce__(self) -> Any:
        return (_stuck_here, ())


@pytest.fixture
def loads_never_give_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung load lasts as long as the test (how long the pool waits for a load is not
    what these tests are about: at its 30 s a loaded machine could end the hang first)."""
    from rho_actors.sandbox import preloads

    monkeypatch.setattr(preloads, "_LOAD_TIMEOUT_S", 3 * WAIT_S)


@contextlib.contextmanager
def _beside_a_hung_load(tmp_path: Path, *, hung_first: bool) -> Iterator[ActorSystem]:
    """A system of two warm workers serving ``_sleeper(5_000)`` and a ``_HangsWhenLoaded``
    registered before the workers are ready (``hung_first``) or once both hold the
    sleeper; yielded once one worker is idle (the other holds the hung load)."""
    with ActorSystem(tmp_path, warm_workers=2) as system:
        if hung_first:
            system.register(_HangsWhenLoaded(), isolation="process")
        system.register(_sleeper(5_000), isolation="process")
        ready = 1 if hung_first else 2
        assert wait_for(lambda: system.stats().get("workers_idle", 0) == ready
                        and system.stats().get("workers_loaded", 0) == ready, 3 * WAIT_S), system.stats()
        if not hung_first:
            system.register(_HangsWhenLoaded(), isolation="process")
            assert wait_for(lambda: system.stats()["workers_idle"] == 1), system.stats()
        yield system


def _slept_at_once(system: ActorSystem, session: str) -> None:
    """The sleeper's call of 0 s in ``session`` ran."""
    [result] = _turn(system, session, 0.0).result(WAIT_S)
    assert result.ok and result.content == "slept 0.0", result.content


@pytest.mark.usefixtures("loads_never_give_up")
def test_a_load_that_hangs_at_registration_holds_one_worker_and_delays_no_other_tool(tmp_path: Path) -> None:
    """Registered before the warm workers are ready, a tool whose unpickling hangs is
    tried by one worker; the other becomes ready holding the other tool, whose first
    call then needs no new worker and ships nothing."""
    with _beside_a_hung_load(tmp_path, hung_first=True) as system:
        _slept_at_once(system, "s")
        stats = system.stats()
        assert (stats["workers_started"], stats["workers_shipped"]) == (2, 0), stats


@pytest.mark.usefixtures("loads_never_give_up")
def test_a_load_that_hangs_later_holds_one_worker_and_the_others_serve(tmp_path: Path) -> None:
    """Registered once the warm workers hold the other tool, a tool whose unpickling
    hangs takes one idle worker to try it; the other stays idle and serves the other
    tool's call (no new worker, which would be held by the same load)."""
    with _beside_a_hung_load(tmp_path, hung_first=False) as system:
        for n in range(2):
            _slept_at_once(system, f"s{n}")
        stats = system.stats()
        assert (stats["workers_started"], stats["workers_shipped"], stats["workers_idle"]) == (2, 0, 1), stats


def test_an_idle_worker_is_healthy_only_while_it_runs_sent_nothing_and_its_fork_server_runs() -> None:
    # one poll of its pipe, its process and its fork server's pidfd (a call takes an idle
    # worker only after this look): each of the three alone makes it unhealthy
    import socket
    import subprocess

    from rho_actors.sandbox.channel import Channel
    from rho_actors.sandbox.processes import ServerWatch
    from rho_actors.sandbox.worker_handle import WorkerHandle

    def handle() -> tuple[WorkerHandle, Any, Any, socket.socket]:
        worker = subprocess.Popen(["sleep", "60"])
        server = subprocess.Popen(["sleep", "60"])
        ours, theirs = socket.socketpair()
        return (WorkerHandle(worker, Channel(ours, os.pidfd_open(worker.pid)), None, None,
                             server=ServerWatch(server.pid)), worker, server, theirs)

    made = [handle() for _ in range(3)]
    try:
        assert all(h.healthy() for h, _, _, _ in made)
        (sent, _, _, theirs), (ended, worker, _, _), (orphaned, _, server, _) = made
        theirs.send(b"\x00")  # a frame's first byte, unasked
        assert wait_for(lambda: not sent.healthy())
        worker.kill()
        assert wait_for(lambda: not ended.healthy())
        server.kill()
        assert wait_for(lambda: not orphaned.healthy())
        assert orphaned.server_gone() and not ended.server_gone()
    finally:
        for h, worker, server, theirs in made:
            for proc in (worker, server):
                proc.kill()
                proc.wait()
            h.channel.close()
            theirs.close()
            if h.channel.sentinel is not None:
                os.close(h.channel.sentinel)
