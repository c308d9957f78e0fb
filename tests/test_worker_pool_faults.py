"""A worker pool's call path when a worker dies, a caller's thread is interrupted, a
cancel token outlives its calls, or a tool leaves something writing to its reply pipe
(DESIGN §5 "A call's path"): every call id still gets exactly one result, no worker is
lost for good, and no call is damaged by what another call left behind.

Each race is forced, not hoped for: a hook pauses a thread at the point the race needs
(synchronised with events), a worker is killed with a real ``SIGKILL``, an interrupt is
the ``KeyboardInterrupt`` a signal handler raises there. Every wait is bounded.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

import cloudpickle
import pytest

from rho_actors.cancel import CancelToken
from rho_actors.function_tool import tool
from rho_actors.sandbox import WorkerCall, WorkerPool
from rho_actors.sandbox.channel import Channel
from rho_actors.sandbox.replies import OpenCall, Replies
from rho_actors.tool import ToolResult

from .conftest import WAIT_S, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(120)


@tool
def echo(text: str) -> str:
    """Return ``text``."""
    return text


def a_call(args: Mapping[str, Any], call_id: str, session: str = "s1", cancel: CancelToken | None = None,
           the_tool: Any = echo) -> WorkerCall:
    return WorkerCall.of(the_tool, dict(args), {"session_id": session, "call_id": call_id},
                         time.monotonic() + WAIT_S, 10_000, cancel=cancel)


class Results:
    """Every result each call id got (a second one is kept too, to be seen)."""

    def __init__(self) -> None:
        self.got: dict[str, list[ToolResult]] = {}
        self.arrived = threading.Condition()

    def done(self, call_id: str) -> Any:
        def give(result: ToolResult) -> None:
            with self.arrived:
                self.got.setdefault(call_id, []).append(result)
                self.arrived.notify_all()
        return give

    def wait(self, call_id: str, count: int = 1) -> list[ToolResult]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.got.get(call_id, ())) >= count, WAIT_S), \
                f"no result for {call_id}"
            return list(self.got[call_id])


def _wait_ended(sentinel: int | None) -> None:
    assert sentinel is not None
    assert select.select([sentinel], [], [], WAIT_S)[0], "the killed worker did not end"


# --- 1. a call taken back while its worker's end is being read ---------------------------------


def test_a_call_taken_back_as_its_worker_dies_gets_exactly_one_result(
        pool: WorkerPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's thread is interrupted once the reader has the call, before any byte
    of it is written, so the call is taken back (answered by its caller); at that very
    moment its worker is killed (kill -9) and the reader reads the worker's end. The
    reader and the take-back both want the call: exactly one of them may have it."""
    add, serve, outcomes = Replies.add, Replies._serve, Replies._outcomes
    in_serve, go, round_over = threading.Event(), threading.Event(), threading.Event()
    target: list[OpenCall] = []
    took: list[OpenCall] = []

    def adding(self: Replies, call: OpenCall) -> None:
        if target:
            return add(self, call)
        target.append(call)
        os.kill(call.worker.pid, signal.SIGKILL)
        _wait_ended(call.sentinel)
        add(self, call)
        assert in_serve.wait(WAIT_S), "the reader never read the worker's end"
        raise KeyboardInterrupt  # what a signal handler raises in the caller's thread here

    def serving(self: Replies, call: OpenCall, fd: int, mask: int) -> Any:
        if target and call is target[0] and not in_serve.is_set():
            in_serve.set()  # past the reader's look at whether the call is still its own
            assert go.wait(WAIT_S)
        return serve(self, call, fd, mask)

    def taking(self: Replies, events: list[tuple[int, int]]) -> Any:
        taken = outcomes(self, events)
        if in_serve.is_set() and not round_over.is_set():
            took.extend(call for call, _, _ in taken)
            round_over.set()
        return taken

    monkeypatch.setattr(Replies, "add", adding)
    monkeypatch.setattr(Replies, "_serve", serving)
    monkeypatch.setattr(Replies, "_outcomes", taking)
    results = Results()
    with pytest.raises(KeyboardInterrupt):
        pool.try_start(a_call({"text": "once"}, "c1"), results.done("c1"))
    go.set()
    assert round_over.wait(WAIT_S)
    first = results.wait("c1")
    if took:  # the reader had it too: it finishes it (sends it again), a second result
        results.wait("c1", 2)
    assert len(results.got["c1"]) == 1, [r.content for r in results.got["c1"]]
    assert first[0].call_id == "c1"
    stats = pool.stats()
    assert stats["idle"] <= stats["alive"], stats  # the worker given back once, not twice
    monkeypatch.undo()
    assert pool.run_call(a_call({"text": "after"}, "c2")).content == "after"


# --- 4. a cancel token that outlives its calls -------------------------------------------------


@tool
def nap_then(marker: str, seconds: float) -> str:
    """Write this process's pid to ``marker``, then sleep ``seconds``."""
    from pathlib import Path

    Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
    return "woke"


def _waiting(token: CancelToken) -> int:
    """The callbacks ``token`` keeps until it is set."""
    return len(token._inline) + len(token._callbacks)


def test_a_long_lived_cancel_token_keeps_no_callback_of_a_call_that_ended(tmp_path: Any) -> None:
    """A session's token, given to a thousand calls one after another (each path: a
    blocking call, a call started from its caller's thread, a call that waits its turn
    under a cap), holds no callback of any ended call; cancelled afterwards, it cancels
    only the call that runs then."""
    from rho_actors.sandbox import WorkerSlots

    token = CancelToken()
    p = WorkerPool(warm=1, codec="pickle", slots=WorkerSlots(2))
    try:
        assert p.wait_warm(WAIT_S)
        results = Results()
        for n in range(1000):
            call = a_call({"text": str(n)}, f"c{n}", cancel=token)
            if n % 3 == 0:
                assert p.run_call(call).content == str(n)
            elif n % 3 == 1:
                if not p.try_start(call, results.done(call.call_id)):
                    p.start(call, results.done(call.call_id))
                assert results.wait(call.call_id)[0].content == str(n)
            else:
                p.start(call, results.done(call.call_id))
                assert results.wait(call.call_id)[0].content == str(n)
            assert _waiting(token) <= 1, f"{_waiting(token)} callbacks kept after {n + 1} calls"
        assert wait_for(lambda: _waiting(token) == 0)
        marker = tmp_path / "pid"
        running = threading.Thread(target=lambda: results.done("last")(p.run_call(
            a_call({"marker": str(marker), "seconds": 60}, "last", cancel=token, the_tool=nap_then))))
        running.start()
        assert wait_for(marker.exists)
        assert wait_for(lambda: _waiting(token) == 1)  # the running call's only (hooked once its request is out)
        killed = p.stats()["killed"]
        token.cancel("stopping")
        [last] = results.wait("last")
        running.join(WAIT_S)
        assert last.error_kind is not None and "cancel" in last.content, last
        assert p.stats()["killed"] == killed + 1
    finally:
        p.stop()


# --- 2. and 3. an interrupt between a worker's take and its call's hand-over -----------------


def _interrupt_once(monkeypatch: pytest.MonkeyPatch, cls: type, name: str, after: bool = True,
                    skip: int = 0) -> threading.Event:
    """Make ``cls.name`` raise ``KeyboardInterrupt`` (what a signal handler raises in the
    caller's thread) once, on its ``skip + 1``-th call, after it ran (``after``) or instead
    of it; the event is set once it was raised."""
    original = getattr(cls, name)
    raised = threading.Event()
    seen = [0]

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if raised.is_set() or seen[0] <= skip:
            return original(self, *args, **kwargs)
        raised.set()
        if after:
            original(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(cls, name, interrupted)
    return raised


def _capped_pool(warm: int) -> WorkerPool:
    """A pool under a cap of one worker: a worker lost for good leaves none."""
    from rho_actors.sandbox import WorkerSlots

    p = WorkerPool(warm=warm, codec="pickle", slots=WorkerSlots(1))
    assert warm == 0 or p.wait_warm(WAIT_S)
    return p


@pytest.mark.parametrize("how", ["try_start", "start", "start_new_worker"])
def test_an_interrupt_after_a_worker_is_marked_busy_gives_it_back_and_answers_the_call(
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The caller's thread is interrupted right after its call's worker was marked busy
    (an idle one taken, or a new one started for it) and before the caller holds it: the
    call gets its one result, the worker is given back, the cap's place too, and the
    next call runs (under a cap of one worker, none would otherwise)."""
    from rho_actors.sandbox.warm_workers import WarmWorkers

    p = _capped_pool(0 if how == "start_new_worker" else 1)
    try:
        raised = _interrupt_once(monkeypatch, WarmWorkers, "_note_demand_locked")
        results = Results()
        call = a_call({"text": "x"}, "c1")
        with pytest.raises(KeyboardInterrupt):
            if how == "try_start":
                p.try_start(call, results.done("c1"))
            else:
                p.start(call, results.done("c1"))
        assert raised.is_set()
        [result] = results.wait("c1")
        assert not result.ok and "interrupted" in result.content, result
        assert p.stats()["busy"] == 0, p.stats()
        monkeypatch.undo()
        later = a_call({"text": "after"}, "c2")
        assert p.run_call(later).content == "after"
        assert len(results.got["c1"]) == 1
    finally:
        p.stop()


def test_an_interrupt_while_an_undelivered_call_is_sent_again_answers_it_once_and_loses_no_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A blocking call's worker is killed (kill -9) after it was taken and before it had
    the call, so the call is sent again, to another worker, from the caller's thread;
    that thread is interrupted while it takes that other worker. The call gets exactly
    one result, and neither a worker nor the session's place under the cap is lost."""
    from rho_actors.sandbox.taking import WorkerTaking
    from rho_actors.sandbox.warm_workers import WarmWorkers

    p = _capped_pool(1)
    try:
        take = WorkerTaking._take
        taken: list[int] = []

        def taking(self: WorkerTaking, *args: Any, **kwargs: Any) -> Any:
            worker = take(self, *args, **kwargs)
            if not taken:
                taken.append(worker.pid)
                os.kill(worker.pid, signal.SIGKILL)
                _wait_ended(worker.channel.sentinel)
            return worker

        monkeypatch.setattr(WorkerTaking, "_take", taking)
        raised = _interrupt_once(monkeypatch, WarmWorkers, "_take_idle", after=True, skip=1)
        results = Results()
        with pytest.raises(KeyboardInterrupt):
            p.start(a_call({"text": "x"}, "c1"), results.done("c1"), here=True)
        assert raised.is_set() and taken
        [result] = results.wait("c1")
        assert not result.ok and "interrupted" in result.content, result
        assert p.stats()["busy"] == 0, p.stats()
        monkeypatch.undo()
        assert p.run_call(a_call({"text": "after"}, "c2")).content == "after"
        assert len(results.got["c1"]) == 1
    finally:
        p.stop()


# --- 5. the worker's reply pipe and the programs a tool runs ------------------------------------


@tool
def pipe_in_a_program() -> str:
    """Whether a program this tool runs (``os.system``: every descriptor not close-on-exec
    inherited) holds this worker's reply pipe."""
    import gc

    from rho_actors.sandbox.channel import Channel

    fd = next(o for o in gc.get_objects() if isinstance(o, Channel)).fd
    return "held" if os.system(f"test -e /proc/self/fd/{fd}") == 0 else "not held"


def test_a_program_a_tool_runs_never_holds_its_workers_reply_pipe(pool: WorkerPool) -> None:
    """The reply pipe is close-on-exec: a program a tool starts (a server kept for later
    calls) can never write into a later call's reply, and its worker serves on."""
    assert pool.run_call(a_call({}, "c1", the_tool=pipe_in_a_program)).content == "not held"


def test_an_interrupt_while_a_tool_is_loaded_ahead_loses_no_worker_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    """``preload`` sends a tool to an idle worker from the caller's thread; interrupted
    there (the worker off the idle set, its ``LOAD`` maybe half sent), the worker is
    replaced, not left neither idle nor busy (under a cap of one worker, holding the
    only place)."""
    from rho_actors.sandbox.warm_workers import WarmWorkers

    p = _capped_pool(1)
    try:
        raised = _interrupt_once(monkeypatch, WarmWorkers, "_load_into", after=False)
        with pytest.raises(KeyboardInterrupt):
            p.preload(echo)
        assert raised.is_set()
        monkeypatch.undo()
        assert p.run_call(a_call({"text": "after"}, "c1")).content == "after"
    finally:
        p.stop()


# --- 6. a worker's close, or its retirement, that raises -------------------------------------------


class _PipeClosingBadly:
    """A worker's channel whose close closes it, then raises (a step of the worker's close
    that fails)."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def close(self) -> None:
        self._channel.close()
        raise OSError("closing the pipe failed (test)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def _retire_by_the_keeper(p: WorkerPool) -> Any:
    """Mark the pool's idle worker for retirement (as an unregistered tool's scope does)
    and wake the keeper, which retires it; the worker."""
    with p._lock:
        [worker] = p._idle
        worker.doomed = True
        p._changed.notify_all()
    return worker


def _assert_replaced_and_serving(p: Any, retired_pid: int) -> None:
    """The pool's keeper lived on: a new worker replaced the retired one and serves a call."""
    assert p.wait_warm(WAIT_S) and p.pids() != [retired_pid], "no worker replaced the retired one"
    assert p._keeper.is_alive()
    assert p.run_call(a_call({"text": "after"}, "c1")).content == "after"


def test_a_close_whose_step_raises_runs_every_later_step_and_the_keeper_goes_on(logs: list[str]) -> None:
    """A worker's pipe that fails to close: its cgroup, folder and slot are still given
    back (under a cap of one worker, a slot kept would leave no place for any other), the
    failure is logged, and the pool's keeper lives on to start its replacement."""
    p = _capped_pool(1)
    try:
        with p._lock:
            [worker] = p._idle
            worker.channel = cast(Channel, _PipeClosingBadly(worker.channel))
        _retire_by_the_keeper(p)
        assert worker.wait_closed(WAIT_S), "the keeper did not retire the worker"
        _assert_replaced_and_serving(p, worker.pid)
        assert any(f"worker {worker.pid}: closing its pipe failed" in line for line in logs)
    finally:
        p.stop()


def test_a_retirement_that_raises_still_closes_the_worker_and_the_keeper_goes_on(
        monkeypatch: pytest.MonkeyPatch, logs: list[str]) -> None:
    """A reap that raises as the keeper retires a worker: the worker is still closed and
    forgotten (its slot given back), the keeper logs it and goes on."""
    from rho_actors.sandbox import processes, worker_handle

    p = _capped_pool(1)
    try:
        real_reap = processes.reap
        target: list[int] = []

        def reap_raising(proc: Any, timeout_s: float) -> int | None:
            code = real_reap(proc, timeout_s)
            if proc.pid in target:
                raise RuntimeError("reaping failed (test)")
            return code

        monkeypatch.setattr(worker_handle, "reap", reap_raising)
        with p._lock:
            target.append(p._idle[0].pid)
        worker = _retire_by_the_keeper(p)
        assert worker.wait_closed(WAIT_S), "the worker was not closed"
        _assert_replaced_and_serving(p, worker.pid)
        assert any(f"retiring worker {worker.pid} failed" in line for line in logs)
    finally:
        p.stop()
