"""A call's worker and the warm spares (DESIGN §5 "Starting a worker"): a call with a
start bound that finds no idle worker takes the spare the keeper is already starting,
when that spare is one it may use, instead of starting a second worker beside it (each
start costs a process, start time and, confined, a uid of the range).

Real workers; the spare's readiness is held by the test (an event), so the race a
loaded machine hits by chance (the call arriving while the spare still starts) is forced.
Every wait is bounded by ``WAIT_S``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import Any

import cloudpickle
import pytest

from rho_actors.function_tool import tool
from rho_actors.sandbox import WorkerPool
from rho_actors.sandbox.warm_workers import WarmWorkers
from rho_actors.sandbox.worker_handle import WorkerHandle

from .conftest import WAIT_S, wait_for
from .test_worker_pool_faults import Results, a_call

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(120)


@tool
def worker_pid() -> str:
    """The id of the worker process that runs the call."""
    return str(os.getpid())


class _Seen(threading.Condition):
    """A pool's ``_warmed`` condition that says when a call first waits on it."""

    def __init__(self, lock: Any, waited: threading.Event) -> None:
        super().__init__(lock)
        self.waited = waited

    def wait_for(self, predicate: Any, timeout: float | None = None) -> Any:
        self.waited.set()
        return super().wait_for(predicate, timeout)


def pool_with_held_spare(monkeypatch: pytest.MonkeyPatch, waited: threading.Event,
                         **settings: Any) -> tuple[WorkerPool, int, threading.Event]:
    """A ``WorkerPool(warm=1, **settings)`` whose keeper's spare runs but is not ready
    (its ``READY`` read held) until the returned event is set; ``waited`` is set when a
    call first waits for a worker others start. Returns the pool (the caller stops it),
    the spare's pid and that event."""
    ready = threading.Event()
    await_ready = WarmWorkers._await_ready

    def held(self: WarmWorkers, worker: WorkerHandle, wanted: bool = False) -> bool:
        if not wanted:  # the keeper's spare: ready when the test says
            ready.wait(WAIT_S)
        return await_ready(self, worker, wanted)

    monkeypatch.setattr(WarmWorkers, "_await_ready", held)
    p = WorkerPool(warm=1, codec="pickle", **settings)
    try:
        assert wait_for(lambda: len(p.pids()) == 1)  # the spare's process runs; it is not ready yet
    except BaseException:
        ready.set()
        p.stop()
        raise
    [spare] = p.pids()
    p._warmed = _Seen(p._lock, waited)
    return p, spare, ready


def test_a_calls_first_worker_is_the_spare_being_started_not_a_second_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The keeper's spare has started but is not ready (its ``READY`` read held by the
    test) when a call with a start bound comes: the call waits for that spare (it may
    use it: the same environment, no scope yet) and runs on it; no worker is started for
    it beside the spare (before, the call started one of its own: two new workers at
    once, as a loaded run saw for an untrusted session's first call)."""
    decided = threading.Event()
    own_starts: list[Any] = []
    p, spare, ready = pool_with_held_spare(monkeypatch, decided)
    try:
        start_for_call = p._start_for_call

        def own(env_key: Any, start: Any) -> None:
            own_starts.append(env_key)
            decided.set()
            start_for_call(env_key, start)

        monkeypatch.setattr(p, "_start_for_call", own)
        results = Results()
        call = dataclasses.replace(a_call({}, "c", the_tool=worker_pid), start_by=time.monotonic() + WAIT_S)
        caller = threading.Thread(target=p.start, args=(call, results.done("c")), daemon=True)
        caller.start()
        assert decided.wait(WAIT_S)  # the call waits for a worker, or started its own
        assert own_starts == [] and p.pids() == [spare], (own_starts, p.pids(), spare)
        ready.set()
        [result] = results.wait("c")
        assert result.ok and result.content == str(spare), (result, spare)
        caller.join(WAIT_S)
    finally:
        ready.set()
        p.stop()
