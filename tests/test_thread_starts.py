"""An actor whose thread cannot be started (the host at its thread limit): its first
messages are neither stranded nor answered twice, a stop or a kill still ends it, a start
interrupted once its thread runs never starts a second loop, a thread never started is
not counted, and a shutdown at the limit ends every idle loop."""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import ActorSystem, CancelToken, ErrorKind, ToolCall
from rho_actors.loop.messages import Offered, SetWithheld
from rho_actors.otp.actor import Actor, kill, monitor

from .conftest import WAIT_S, wait_for
from .helpers import make_tool

pytestmark = pytest.mark.timeout(120)


class _NoThreads:
    """A thread pool that cannot start a thread (the host at its thread or pid limit)."""

    def submit(self, job: Any, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        raise RuntimeError("can't start new thread")


def test_a_loop_whose_first_message_found_no_thread_is_still_ended_by_its_stop(tmp_path: Path) -> None:
    """A LoopActor takes its thread at its first message: when that thread could not be
    started, the actor stayed claimed as started, with no loop: its stop was queued and
    never run (``Loop.stop`` waited its bound and abandoned it), its monitors never fired,
    its turns never closed. Now the start is undone: the teller gets the error, and the
    stop ends the actor in the stopping thread, the queued message first."""
    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("echo", lambda args, ctx: "ok"))
        loop = system.start_loop("no-threads")
        ref = loop.ref
        actor = ref._actor_weakref()
        assert actor is not None
        actor.thread_pool = _NoThreads()
        with pytest.raises(RuntimeError, match="can't start new thread"):
            ref.tell(SetWithheld(frozenset({"echo"})))
        ended = threading.Event()
        reasons: list[object] = []

        def down(_ref: Any, reason: object) -> None:
            reasons.append(reason)
            ended.set()

        monitor(ref, down)
        loop.stop(timeout_s=WAIT_S)
        assert ended.wait(WAIT_S) and reasons == ["normal"]
        assert not ref.is_alive()
        assert actor.turns.closed is not None
        assert actor.turns._kept.names == frozenset({"echo"})  # the queued message ran before the stop
        with pytest.raises(pykka.ActorDeadError):
            loop.run_turn([ToolCall("c1", "echo", "{}")], timeout_s=WAIT_S)


def test_a_cancel_whose_message_finds_no_thread_for_the_loop_still_cancels_the_turn(tmp_path: Path) -> None:
    """The host's cancel of a turn is a ``CancelTurn`` told to the loop: when that first
    message could not start the loop's thread, the cancel was lost (the calls ran on to
    their end). Now the turn is cancelled in the cancelling thread instead."""
    def wait(args: Any, ctx: Any) -> str:
        return "cancelled" if ctx["cancel"].wait(WAIT_S) else "ran to its end"

    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("wait", wait, timeout_ms=60_000))
        loop = system.start_loop("no-threads")
        actor = loop.ref._actor_weakref()
        assert actor is not None
        actor.thread_pool = _NoThreads()
        token = CancelToken()
        future = loop.submit_turn([ToolCall("c1", "wait", "{}")], cancel=token)
        token.cancel("enough")
        results = future.result(WAIT_S)
        loop.stop(timeout_s=WAIT_S)
    assert [r.error_kind for r in results] == [ErrorKind.CANCELLED], results


class _CountingQueue:
    """A ``SimpleQueue`` that sets ``second`` once it holds a second message."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.second = threading.Event()
        self._puts = 0

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self._queue.put(item)
        self._puts += 1
        if self._puts >= 2:
            self.second.set()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return self._queue.get(block, timeout)

    def empty(self) -> bool:
        return self._queue.empty()


class _FailsOnceWhenSecondQueued:
    """A thread pool whose first start fails, once a second message is queued (another
    teller put it while the first start was under way); later starts work."""

    def __init__(self, real: Any, second: threading.Event) -> None:
        self._real, self._second = real, second
        self.failed = False

    def submit(self, job: Any, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        if not self.failed:
            self.failed = True
            assert self._second.wait(WAIT_S)
            raise RuntimeError("can't start new thread")
        self._real.submit(job, name, may_take_over=may_take_over, alone=alone)


def test_a_message_told_while_a_failing_first_start_is_under_way_is_not_stranded(tmp_path: Path) -> None:
    """The first message of a waking actor claims its start; a second teller, seeing it
    claimed, returned at once with its message queued. When that start then failed and
    was undone, the second message waited with no loop for it (its ``ask`` unanswered
    until some later message or the stop): a put that returns has its message run.
    Now a teller that finds a start under way waits for its outcome, and starts the loop
    itself when it failed."""
    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("echo", lambda args, ctx: "ok"))
        loop = system.start_loop("racing-starts")
        ref = loop.ref
        actor = ref._actor_weakref()
        assert actor is not None
        inbox: Any = ref.actor_inbox
        counting = _CountingQueue()
        inbox._queue = counting
        pool = _FailsOnceWhenSecondQueued(actor.thread_pool, counting.second)
        actor.thread_pool = pool
        downs: list[object] = []
        ended = threading.Event()

        def down(_ref: Any, reason: object) -> None:
            downs.append(reason)
            ended.set()

        monitor(ref, down)
        first_error: list[BaseException] = []

        def first() -> None:
            try:
                ref.tell(Offered())
            except RuntimeError as exc:
                first_error.append(exc)

        teller = threading.Thread(target=first)
        teller.start()
        answers: list[Any] = []
        second = threading.Thread(target=lambda: answers.append(ref.ask(Offered(), block=False)))
        second.start()
        second.join(WAIT_S)
        teller.join(WAIT_S)
        assert not second.is_alive() and not teller.is_alive()
        assert pool.failed and len(first_error) == 1
        assert len(answers) == 1
        assert answers[0].get(timeout=WAIT_S) is not None  # run by a loop, not left for the stop
        loop.stop(timeout_s=WAIT_S)
        assert ended.wait(WAIT_S) and downs == ["normal"]


class _FailsFirst:
    """A thread pool whose first ``failures`` starts fail (from any thread)."""

    def __init__(self, real: Any, failures: int) -> None:
        self._real = real
        self._left = failures
        self._lock = threading.Lock()

    def submit(self, job: Any, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        with self._lock:
            fail, self._left = self._left > 0, self._left - 1
        if fail:
            raise RuntimeError("can't start new thread")
        self._real.submit(job, name, may_take_over=may_take_over, alone=alone)


def _ask_four(ref: Any, barrier: threading.Barrier, told: list[Any], raised: list[BaseException]) -> None:
    barrier.wait(WAIT_S)
    for _ in range(4):
        try:
            told.append(ref.ask(Offered(), block=False))
        except RuntimeError as exc:
            raised.append(exc)


@pytest.mark.parametrize("failures", [0, 1, 3, 7, 100])
def test_many_first_messages_racing_failing_starts_and_a_stop_each_get_one_answer(
        tmp_path: Path, failures: int) -> None:
    """Eight threads ask a waking loop at once while its thread starts fail for a while,
    then it is stopped: every ask that was told is answered (by the loop or, for those
    the stop found queued, in the stopping thread), a tell that raised raised the start's
    error, the monitor fires once, nothing hangs."""
    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("echo", lambda args, ctx: "ok"))
        for round_ in range(5):
            loop = system.start_loop(f"racing-{round_}")
            ref = loop.ref
            actor = ref._actor_weakref()
            assert actor is not None
            actor.thread_pool = _FailsFirst(actor.thread_pool, failures)
            downs: list[object] = []
            ended = threading.Event()

            def down(_ref: Any, reason: object, downs: list[object] = downs, ended: threading.Event = ended) -> None:
                downs.append(reason)
                ended.set()

            monitor(ref, down)
            barrier = threading.Barrier(9)
            told: list[Any] = []
            raised: list[BaseException] = []

            threads = [threading.Thread(target=_ask_four, args=(ref, barrier, told, raised)) for _ in range(8)]
            for thread in threads:
                thread.start()
            barrier.wait(WAIT_S)
            for thread in threads:
                thread.join(WAIT_S)
                assert not thread.is_alive()
            loop.stop(timeout_s=WAIT_S)
            assert ended.wait(WAIT_S) and downs == ["normal"]
            assert not ref.is_alive()
            assert len(told) + len(raised) == 32
            assert len(raised) <= failures
            assert all("can't start new thread" in str(exc) for exc in raised)
            for future in told:
                assert future.get(timeout=WAIT_S) is not None


class _StartsThenInterrupted:
    """A thread pool whose start is interrupted (Ctrl-C in ``Thread.start``'s wait) once
    the thread runs: the loop has its thread, the teller gets ``KeyboardInterrupt``."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.starts = 0

    def submit(self, job: Any, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        self.starts += 1
        self._real.submit(job, name, may_take_over=may_take_over, alone=alone)
        if self.starts == 1:
            raise KeyboardInterrupt


def test_a_start_interrupted_after_its_thread_runs_never_starts_a_second_loop(tmp_path: Path) -> None:
    """A start that raised anything was undone, so the next message started a second
    loop on the same actor when the first had its thread already (an interrupt arriving
    in ``Thread.start`` once the thread runs): two threads taking one actor's messages.
    Only a start's ``Exception`` (no thread could be started) is undone now."""
    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        loop = system.start_loop("interrupted")
        ref = loop.ref
        actor = ref._actor_weakref()
        assert actor is not None
        pool = _StartsThenInterrupted(actor.thread_pool)
        actor.thread_pool = pool
        with pytest.raises(KeyboardInterrupt):
            ref.tell(Offered())
        assert ref.ask(Offered(), timeout=WAIT_S) is not None
        loop.stop(timeout_s=WAIT_S)
        assert pool.starts == 1


def test_a_thread_that_could_not_be_started_is_not_counted_as_started(monkeypatch: pytest.MonkeyPatch) -> None:
    from rho_actors.otp.threads import ThreadPool

    pool = ThreadPool(idle_s=1.0)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refuse)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            pool.submit(lambda: None, "refused")
    assert pool.threads_started == 0
    ran = threading.Event()
    pool.submit(ran.set, "started")
    assert ran.wait(WAIT_S) and pool.threads_started == 1


class _NoThreadsPool:
    def submit(self, job: Any, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        raise RuntimeError("can't start new thread")


def test_a_system_shutdown_at_the_thread_limit_ends_every_idle_loop(tmp_path: Path) -> None:
    """Loops that never got a message are ended by the system's shutdown: at the host's
    thread limit (no thread for any stop message), each must still end once, its
    monitor told, and the shutdown return."""
    reasons: dict[str, list[object]] = {}
    ended: dict[str, threading.Event] = {}

    def down(ref: Any, reason: object) -> None:
        reasons[ref.actor_urn].append(reason)
        ended[ref.actor_urn].set()

    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        refs = [system.start_loop(f"idle-{i}").ref for i in range(3)]
        for ref in refs:
            actor = ref._actor_weakref()
            assert actor is not None
            actor.thread_pool = _NoThreadsPool()
            reasons[ref.actor_urn], ended[ref.actor_urn] = [], threading.Event()
            monitor(ref, down)
    for key, event in ended.items():
        assert event.wait(WAIT_S) and len(reasons[key]) == 1, key
    assert all(not ref.is_alive() for ref in refs)


class _WakingLazy(Actor):
    starts_on_first_message = True

    def __init__(self) -> None:
        super().__init__()
        self.thread_pool = _NoThreadsPool()  # type: ignore[assignment]


def test_a_kill_of_a_waking_actor_with_no_thread_ends_it_with_its_reason() -> None:
    """``kill`` of an actor that never got a message, at the host's thread limit: the
    ``RuntimeError`` of its start escaped ``kill`` and the actor lived on."""
    ref = _WakingLazy.start()
    reasons: list[object] = []
    monitor(ref, lambda _ref, reason: reasons.append(reason))
    kill(ref, "enough")
    assert not ref.is_alive() and reasons == ["enough"]


_PIDS = Path("/sys/fs/cgroup/pids")


def _removed(cgroup: Path) -> bool:
    """Whether ``cgroup`` is gone, removing it if it can be (once a host's last child, its
    fork server, has left it), with the cgroups of the host's workers made inside it: a
    host whose stop gave up at its ``shutdown_ms`` (a loaded machine) left its last
    worker's for a later start's sweep, which only looks beside that start's own cgroup."""
    with contextlib.suppress(FileNotFoundError):
        try:
            for inner in cgroup.glob("rho-actors-*"):  # once its worker, killed, has left it
                inner.rmdir()
            cgroup.rmdir()
        except OSError:
            return False
    return True


@pytest.mark.skipif(os.geteuid() != 0 or not (_PIDS / "cgroup.procs").exists(),
                    reason="a real thread limit needs root and the cgroup v1 pids controller")
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_deadline_met_at_the_thread_limit_still_answers_its_call(tmp_path: Path, isolation: str) -> None:
    """A deadline claims its call's answer in the timer thread and hands the delivery to a
    thread (``thread``: the deadlines thread, started at the first timeout; ``process``: the
    backstop's, for a call not yet in a worker): at the host's thread limit that start
    failed, the claimed answer was never delivered and the turn never ended. A real limit:
    the host runs in a pids cgroup whose ``pids.max`` is set to the tasks it has."""
    cgroup = _PIDS / f"rho-test-{os.getpid()}-{isolation}"
    cgroup.mkdir()
    try:
        def enter() -> None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        host = subprocess.run(
            [sys.executable, str(Path(__file__).parent / "thread_limit_host.py"), isolation, str(cgroup),
             str(tmp_path / "ready")], check=False, preexec_fn=enter, capture_output=True, text=True, timeout=WAIT_S,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                                             os.environ.get("PYTHONPATH")]))})
        assert host.stdout.splitlines()[-1:] == ['{"call_id": "c1", "error_kind": "timeout"}'], (
            host.stdout, host.stderr[-3000:])
    finally:
        assert wait_for(functools.partial(_removed, cgroup))


@pytest.mark.skipif(os.geteuid() != 0 or not (_PIDS / "cgroup.procs").exists(),
                    reason="a real thread limit needs root and the cgroup v1 pids controller")
def test_a_job_queued_for_a_thread_that_cannot_be_started_is_never_left_waiting(tmp_path: Path) -> None:
    """Two jobs submitted at once to a pool with one idle thread, at the host's thread
    limit (a pids cgroup), the first waiting for the second: the second's submit
    returned (the woken thread was to start a thread for it), that start failed and was
    only logged, and the second job waited until a thread was free, which none would be.
    Now a submit relies on threads on their way or idle alone: it starts the thread a
    job needs, and the limit's error reaches it."""
    cgroup = _PIDS / f"rho-test-{os.getpid()}-pool"
    cgroup.mkdir()
    try:
        def enter() -> None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        host = subprocess.run(
            [sys.executable, str(Path(__file__).parent / "thread_limit_pool.py"), str(cgroup)],
            check=False, preexec_fn=enter, capture_output=True, text=True, timeout=1.5 * WAIT_S,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                                             os.environ.get("PYTHONPATH")]))})
        assert host.stdout.splitlines()[-1:] in (["raised"], ["ran"]), (host.stdout, host.stderr[-3000:])
    finally:
        assert wait_for(functools.partial(_removed, cgroup))
