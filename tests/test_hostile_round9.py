"""Hostile round 9: a worker hanging while it loads a tool, and the keeper's spare.

1. An untrusted plugin file whose top level, when it is loaded in one kind of child (the
   discovery child, the declaration read's child, or a call's worker, told apart by the
   frames that load it), sleeps for ever, spins, stops itself with ``SIGSTOP``, or forks a
   child and waits for it for ever. At discovery or at the declaration read the tool is
   not offered (the read's bound); at a call's first use in a worker each call gets one
   ``timeout`` result within its deadline, the worker and what it forked are killed and
   reaped, and the next call is served. Broke: a failed declaration read named a plugin
   file's stand-in class, not the file; a stopped system left its plugin folders' two
   read threads running for good (they idled until the source was closed).

2. A call that got no worker within its start bound was ``unavailable`` naming the
   pool's ``start_timeout_ms`` (a pool's default: 10 s, or the environment's), not the
   bound the call had (its ``start_by``, 300 ms here): the message now names the call's.

3. A call that found no idle worker while the keeper's spare was starting waited for
   that spare, and only for it, until it said ``READY`` or its start ended: a spare
   stopped with ``SIGSTOP`` held every such call until the spare's own ``READY`` bound
   (30 s) ended it, or until the call's start bound made it ``unavailable``; another
   call's start stuck so held it the same way. Now a call counts on a spare only until
   the spare is overdue (three times the pool's slowest recent start), and on no start
   but its own once half its start bound has passed; then it starts its own worker.

4. A host that exited without ``stop()`` while an untrusted call ran left every worker's
   cgroup and private folder behind (a pool's finalizer kills its process groups only)
   until some later start on the machine swept them; one that exited right after
   ``stop()`` could too, busy and starting workers being closed by the threads that own
   them after ``stop()`` returned. Now ``stop()`` waits (within its bound) for those
   closes, and every pool still running at the interpreter's exit is stopped then.

Every wait is bounded by :data:`~tests.conftest.WAIT_S`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest

from rho_actors import ActorSystem, PluginFolder, ToolCall, UntrustedReads
from rho_actors.sandbox import WorkerPool, WorkerSlots
from rho_actors.sandbox.taking import WorkerTaking
from rho_actors.sandbox.warm_workers import WarmWorkers
from rho_actors.sandbox.worker_handle import WorkerHandle
from rho_actors.tool import ErrorKind, ToolResult

from .conftest import WAIT_S, slack, wait_for
from .helpers import make_tool
from .test_untrusted_lifecycle import _leftovers
from .test_worker_pool_faults import Results, a_call
from .test_worker_spares import worker_pid

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(300)

SESSIONS = itertools.count()

_HANGING = '''
import os, signal, sys, time

PHASES = {{"discovery": "discovery_child", "read": "declaration_child", "call": "serve_request"}}


def _loaded_by(function):
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def _record():
    try:
        with open({pids!r}, "a") as f:
            f.write(str(os.getpid()) + "\\n")
    except OSError:  # confined: the file is outside the worker's reach
        pass


if _loaded_by(PHASES[{phase!r}]):
    _record()
    mode = {mode!r}
    if mode == "sleep":
        time.sleep(3600)
    elif mode == "spin":
        while True:
            pass
    elif mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
    elif mode == "fork":
        child = os.fork()
        if child == 0:
            _record()
            time.sleep(3600)
            os._exit(0)
        os.waitpid(child, 0)

from rho_actors import tool


@tool(timeout_ms={timeout_ms})
def hangs_{phase}_{mode}() -> str:
    """Answer once loaded."""
    return "loaded"
'''

MODES = ["sleep", "spin", "stop", "fork"]
READ_S = 2.0  # the discovery's and the declaration read's bound here
DEADLINE_MS = 1_000


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _call(system: ActorSystem, name: str) -> ToolResult:
    loop = system.start_loop(f"s-{next(SESSIONS)}")
    try:
        [result] = loop.run_turn([ToolCall(f"c-{name}", name, json.dumps({}))], timeout_s=WAIT_S)
        return result
    finally:
        loop.stop()


def _system(tmp_path: Path) -> ActorSystem:
    # the plugin records its pids in a file outside its private folder: no OS confinement here
    return ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, confinement=False,
                       untrusted=UntrustedReads(timeout_s=READ_S))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("phase", ["discovery", "read"])
def test_a_plugin_hanging_as_it_is_read_is_not_offered_and_leaves_no_process(
        tmp_path: Path, phase: str, mode: str) -> None:
    folder, pids = tmp_path / "plugins", tmp_path / "pids"
    folder.mkdir()
    path = folder / f"hangs_{phase}_{mode}.py"
    path.write_text(_HANGING.format(pids=str(pids), phase=phase, mode=mode, timeout_ms=DEADLINE_MS))
    system = _system(tmp_path)
    try:
        started = time.monotonic()
        handle = system.add_source(PluginFolder(folder, discovery_timeout_s=READ_S), poll_s=None)
        row = handle.status()["tools"][str(path)]
        assert row["offered"] is False and str(path) in row["reason"], row  # the file named
        assert time.monotonic() - started < 2 * READ_S + slack(3.0)
        assert _pids(pids), "the plugin's hanging phase never ran"
        assert wait_for(lambda: not any(_running(p) for p in _pids(pids))), _pids(pids)
    finally:
        system.stop()


@pytest.mark.parametrize("mode", MODES)
def test_a_plugin_hanging_as_a_worker_loads_it_gets_one_timeout_per_call_and_the_next_call_is_served(
        tmp_path: Path, mode: str) -> None:
    folder, pids = tmp_path / "plugins", tmp_path / "pids"
    folder.mkdir()
    name = f"hangs_call_{mode}"
    (folder / f"{name}.py").write_text(_HANGING.format(pids=str(pids), phase="call", mode=mode,
                                                        timeout_ms=DEADLINE_MS))
    (folder / "fine.py").write_text('from rho_actors import tool\n\n\n@tool\ndef fine() -> str:\n'
                                    '    """Answer."""\n    return "fine"\n')
    before_threads = {t.ident for t in threading.enumerate()}
    system = _system(tmp_path)
    try:
        handle = system.add_source(PluginFolder(folder, discovery_timeout_s=WAIT_S), poll_s=None)
        assert handle.status()["tools"][str(folder / f"{name}.py")]["offered"] is True
        for _ in range(2):  # the worker that hung is gone; the next one hangs the same way
            result = _call(system, name)
            assert result.error_kind is ErrorKind.TIMEOUT, result  # its deadline's, not WAIT_S's
        assert _pids(pids), "the plugin's hanging phase never ran"
        assert wait_for(lambda: not any(_running(p) for p in _pids(pids))), _pids(pids)
        served = _call(system, "fine")
        assert served.ok and served.content == "fine", served
    finally:
        system.stop()
    def left() -> list[str]:  # the threads of the system still running (the process's one output pump aside)
        return [t.name for t in threading.enumerate() if t.ident not in before_threads and t.name != "rho-child-output"]

    assert wait_for(lambda: not left()), left()


@pytest.mark.parametrize("mode", ["stop", "fork"])
def test_a_confined_worker_hanging_as_it_loads_a_tool_leaves_no_cgroup(tmp_path: Path, mode: str) -> None:
    """As above with the default confinement: each hung worker's cgroup (and private
    folder) is removed once its call is answered and the system stopped."""
    from rho_actors.sandbox.confine import cgroups

    if isinstance(cgroups.find_hierarchy(), str):
        pytest.skip(f"no cgroup: {cgroups.find_hierarchy()}")
    folder = tmp_path / "plugins"
    folder.mkdir()
    name = f"hangs_call_{mode}"
    (folder / f"{name}.py").write_text(_HANGING.format(pids=str(tmp_path / "pids"), phase="call", mode=mode,
                                                        timeout_ms=DEADLINE_MS))
    before = set(_leftovers(os.getpid()))
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000, untrusted=UntrustedReads(timeout_s=WAIT_S))
    try:
        handle = system.add_source(PluginFolder(folder, discovery_timeout_s=WAIT_S), poll_s=None)
        assert handle.status()["tools"][str(folder / f"{name}.py")]["offered"] is True
        for _ in range(2):
            result = _call(system, name)
            assert result.error_kind is ErrorKind.TIMEOUT, result
        made = set(_leftovers(os.getpid())) - before
    finally:
        system.stop()
    assert wait_for(lambda: not [p for p in made if p.exists()]), [p for p in made if p.exists()]


# --- 2. the start bound an unavailable call names ------------------------------------------------


def _gated(args: Any, ctx: Any) -> str:
    """Hold the worker until the file ``args["gate"]`` exists (bounded by WAIT_S)."""
    gate, until = Path(args["gate"]), time.monotonic() + WAIT_S
    while not gate.exists() and time.monotonic() < until:
        time.sleep(0.01)
    return "opened"


def test_an_unavailable_call_names_the_start_bound_it_had_not_the_pools_setting(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    pool = WorkerPool(warm=0, codec="pickle", slots=WorkerSlots(1))
    try:
        results = Results()
        gated = make_tool("gated", _gated, timeout_ms=int(WAIT_S * 1000))
        holder = a_call({"gate": str(gate)}, "holder", the_tool=gated)
        pool.start(holder, results.done("holder"))
        assert wait_for(lambda: pool.stats()["busy"] == 1)  # the only worker the cap allows is held
        late = a_call({}, "late")
        late = dataclasses.replace(late, start_by=late.started + 0.3)
        pool.start(late, results.done("late"))
        [result] = results.wait("late")
        assert result.error_kind is ErrorKind.UNAVAILABLE, result
        assert "within its start bound of 300 ms" in result.content, result.content
    finally:
        gate.touch()
        pool.stop()


# --- 3. a spare stopped with SIGSTOP before it was ready ---------------------------------------------


def test_a_call_does_not_wait_on_a_stopped_spare_past_when_it_is_overdue(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool measured one start (its first spare's); its next spare is started, held
    unready by the test (its ``READY`` read waits) and stopped with ``SIGSTOP``. A call
    with a start bound of WAIT_S, finding no idle worker, waits for the spare only until
    it is overdue, then starts its own worker and is served by it, while the spare is
    still stopped and held (before: it waited for the spare until the test let the read
    go, at WAIT_S)."""
    p = WorkerPool(warm=1, codec="pickle")
    held = threading.Event()
    try:
        assert p.wait_warm(WAIT_S)  # the first spare's start is measured
        [first] = p.pids()
        await_ready = WarmWorkers._await_ready

        def hold(self: WarmWorkers, worker: WorkerHandle, wanted: bool = False) -> bool:
            if not wanted:  # the keeper's next spare: not ready while the test holds it
                held.wait(WAIT_S)
            return await_ready(self, worker, wanted)

        monkeypatch.setattr(WarmWorkers, "_await_ready", hold)
        assert p.retire_one_idle()  # the keeper starts the next spare
        assert wait_for(lambda: len(p.pids()) == 1 and p.pids()[0] != first)
        [spare] = p.pids()
        os.kill(spare, signal.SIGSTOP)
        results = Results()
        call = dataclasses.replace(a_call({}, "c", the_tool=worker_pid), start_by=time.monotonic() + WAIT_S)
        threading.Thread(target=p.start, args=(call, results.done("c")), daemon=True).start()
        [result] = results.wait("c")
        assert result.ok and result.content not in (str(spare), str(first)), (result, spare)
        assert not held.is_set() and spare in p.pids()  # the spare was never ready: the call did not wait for it
    finally:
        held.set()
        p.stop()


# --- 4. a host that exits: with stop(), right after it, or without it ------------------------------

_EXITING_HOST = """
import sys, time
from rho_actors import ActorSystem, ToolCall

class Busy:
    name = staticmethod(lambda: "busy")
    description = staticmethod(lambda: "Spins.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    timeout_ms = staticmethod(lambda: 600_000)

    @staticmethod
    def run(args, ctx):
        while True:
            pass

if __name__ == "__main__":
    system = ActorSystem(sys.argv[1], warm_workers=1)
    system.register(Busy, untrusted=True)
    system.start_loop("s").submit_turn([ToolCall("b", "busy", "{}")])
    until = time.monotonic() + float(sys.argv[3])
    while system.stats().get("untrusted_workers_busy", 0) < 1 and time.monotonic() < until:
        time.sleep(0.01)
    print("busy" if system.stats().get("untrusted_workers_busy", 0) else "never busy", flush=True)
    if sys.argv[2] == "stop":
        system.stop()
"""


@pytest.mark.parametrize("how", ["stop", "exit"])
def test_a_host_that_exits_leaves_no_worker_cgroup_nor_folder(tmp_path: Path, how: str) -> None:
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(_EXITING_HOST))
    host = subprocess.Popen([sys.executable, str(script), str(tmp_path / "data"), how, str(WAIT_S)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    out, err = host.communicate(timeout=3 * WAIT_S)
    assert host.returncode == 0 and out.decode().split() == ["busy"], (out, err.decode()[-2000:])
    # what the host left (a start of another test's system may sweep it: then none is seen, never a false one)
    assert _leftovers(host.pid) == []


def test_a_call_counts_on_another_calls_stuck_start_only_until_half_its_start_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Call B's own worker start is held unready (its ``READY`` read waits) past B's start
    bound: B is ``unavailable``, its start still under way. Call A (start bound 4 s) finds
    that start under way and no other waiting call: it counts on it, but only until half
    its bound (2 s), then starts a worker of its own (before: it waited on B's start for
    its whole bound, a stuck start holding every later call)."""
    p = WorkerPool(warm=0, codec="pickle")
    held, readied, starts = threading.Event(), [], []
    await_ready, start_for_call = WarmWorkers._await_ready, WorkerTaking._start_for_call

    def hold(self: WarmWorkers, worker: WorkerHandle, wanted: bool = False) -> bool:
        readied.append(worker.pid)
        if len(readied) == 1:  # B's start: not ready while the test holds it
            held.wait(WAIT_S)
        return await_ready(self, worker, wanted)

    def counted(self: WorkerTaking, env_key: Any, start: Any) -> None:
        starts.append(start)
        start_for_call(self, env_key, start)

    monkeypatch.setattr(WarmWorkers, "_await_ready", hold)
    monkeypatch.setattr(WorkerTaking, "_start_for_call", counted)
    try:
        results = Results()
        b = a_call({}, "b", the_tool=worker_pid)
        p.start(dataclasses.replace(b, start_by=b.started + 0.3), results.done("b"))
        [unavailable] = results.wait("b")
        assert unavailable.error_kind is ErrorKind.UNAVAILABLE and len(starts) == 1, (unavailable, starts)
        # B's worker may reach its READY read only after B's 0.3 s (a start under load takes seconds): held there
        # first, so that the start A finds under way is B's, held, and never A's own
        assert wait_for(lambda: len(readied) == 1), readied
        a = a_call({}, "a", the_tool=worker_pid)
        threading.Thread(target=p.start, args=(dataclasses.replace(a, start_by=a.started + 4.0), results.done("a")),
                         daemon=True).start()
        [result] = results.wait("a")
        assert len(starts) == 2 and not held.is_set(), (result, starts)  # its own start, B's still held
        assert result.ok or result.error_kind is ErrorKind.UNAVAILABLE, result  # (served if its own was ready in 2 s)
        assert result.content != str(readied[0]), result
    finally:
        held.set()
        p.stop()
