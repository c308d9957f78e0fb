"""ThreadPool: fresh actors on reused threads; a stuck job never holds up another."""

from __future__ import annotations

import contextvars
import functools
import threading
from typing import Any

import pytest

from rho_actors import Actor, monitor
from rho_actors.otp.threads import ThreadPool

from .conftest import WAIT_S, wait_for

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="fresh")


def run_and_wait(pool: ThreadPool, job: Any, name: str = "job") -> None:
    done = threading.Event()

    def wrapped() -> None:
        try:
            job()
        finally:
            done.set()

    pool.submit(wrapped, name)
    assert done.wait(WAIT_S)


def test_a_finished_job_s_thread_serves_the_next_job_in_a_fresh_context() -> None:
    pool = ThreadPool()
    seen: list[tuple[threading.Thread, str, str, bool]] = []

    def job() -> None:
        thread = threading.current_thread()
        seen.append((thread, thread.name, VAR.get(), thread.daemon))
        VAR.set("changed by an earlier job")

    try:
        run_and_wait(pool, job, "first")
        assert wait_for(lambda: pool.idle() == 1)
        run_and_wait(pool, job, "second")
    finally:
        pool.shutdown()
    (t1, name1, var1, daemon1), (t2, name2, var2, _) = seen
    assert t1 is t2 and pool.threads_started == 1
    assert (name1, name2) == ("first", "second")
    assert var1 == var2 == "fresh"  # each job starts in a new, empty contextvars context
    assert daemon1  # never keeps the process alive
    t1.join(WAIT_S)
    assert not t1.is_alive()  # shutdown ended the idle thread


def test_a_stuck_job_keeps_its_thread_and_the_next_job_gets_another() -> None:
    pool = ThreadPool()
    release, entered = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def stuck() -> None:
        threads.append(threading.current_thread())
        entered.set()
        release.wait(WAIT_S)

    try:
        pool.submit(stuck, "stuck")
        assert entered.wait(WAIT_S)
        run_and_wait(pool, lambda: threads.append(threading.current_thread()), "next")
        assert threads[0] is not threads[1] and pool.threads_started == 2
        release.set()
        assert wait_for(lambda: pool.idle() == 2)  # the stuck thread rejoined once its job returned
    finally:
        release.set()
        pool.shutdown()


def test_idle_threads_are_bounded_in_number_and_time() -> None:
    pool = ThreadPool(idle_s=0.05, max_idle=1)
    release = threading.Event()
    started = threading.Barrier(3, timeout=WAIT_S)
    threads: list[threading.Thread] = []

    def job() -> None:
        threads.append(threading.current_thread())
        started.wait()
        release.wait(WAIT_S)

    try:
        pool.submit(job, "a")
        pool.submit(job, "b")
        started.wait()
        release.set()
        for thread in threads:  # one ends at once (max_idle), the other after idle_s
            thread.join(WAIT_S)
            assert not thread.is_alive()
        assert pool.idle() == 0
    finally:
        pool.shutdown()


def test_a_raising_job_is_logged_and_its_thread_serves_on(logs: list[str]) -> None:
    pool = ThreadPool()
    try:
        pool.submit(lambda: 1 / 0, "broken")
        assert wait_for(lambda: pool.idle() == 1)
        run_and_wait(pool, lambda: None)
        assert pool.threads_started == 1
    finally:
        pool.shutdown()
    assert any("a job of thread broken raised" in m for m in logs)


def test_after_shutdown_jobs_still_run_each_on_a_thread_not_kept() -> None:
    pool = ThreadPool()
    pool.shutdown()
    threads: list[threading.Thread] = []
    run_and_wait(pool, lambda: threads.append(threading.current_thread()))
    threads[0].join(WAIT_S)
    assert not threads[0].is_alive() and pool.idle() == 0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="idle_s must be > 0"):
        ThreadPool(idle_s=0)
    with pytest.raises(ValueError, match="max_idle >= 0"):
        ThreadPool(max_idle=-1)


class Probe(Actor):
    def __init__(self, pool: ThreadPool) -> None:
        super().__init__()
        self.thread_pool = pool

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError("probe crashed")
        return threading.current_thread(), self.actor_urn


def test_an_actor_on_a_pooled_thread_is_fresh_each_start_and_keeps_exit_semantics() -> None:
    pool = ThreadPool()
    try:
        first = Probe.start(pool)
        thread1, urn1 = first.ask("who", timeout=WAIT_S)
        first.stop(timeout=WAIT_S)
        assert wait_for(lambda: pool.idle() == 1)
        second = Probe.start(pool)
        thread2, urn2 = second.ask("who", timeout=WAIT_S)
        assert thread1 is thread2 and urn1 != urn2 and thread2 is not None and thread2.name.startswith("Probe-")
        down = threading.Event()
        reasons: list[object] = []

        def on_down(_ref: Any, reason: object) -> None:
            reasons.append(reason)
            down.set()

        monitor(second, on_down)
        second.tell("crash")
        assert down.wait(WAIT_S)
        assert isinstance(reasons[0], RuntimeError)
        assert wait_for(lambda: pool.idle() == 1)  # a crashed actor gives its thread back too
    finally:
        pool.shutdown()


def test_a_job_handed_over_runs_on_the_same_thread_once_the_current_job_returns() -> None:
    pool = ThreadPool()
    order: list[str] = []
    threads: list[threading.Thread] = []
    done, plain = threading.Event(), threading.Event()

    def second() -> None:
        threads.append(threading.current_thread())
        order.append("second")
        done.set()

    def first() -> None:
        threads.append(threading.current_thread())
        with pool.hand_over():
            pool.submit(plain.set, "plain")  # not marked: runs on another thread at once
            assert plain.wait(WAIT_S)
            pool.submit(second, "second", may_take_over=True)
        order.append("first ends")

    try:
        pool.submit(first, "first")
        assert done.wait(WAIT_S)
        assert order == ["first ends", "second"]
        assert threads[0] is threads[1] and pool.threads_started == 2
        outside = threading.Event()
        with pool.hand_over():  # not a pool thread: submits as usual
            pool.submit(outside.set, "outside", may_take_over=True)
        assert outside.wait(WAIT_S)
    finally:
        pool.shutdown()


def test_jobs_submitted_together_all_run_at_once_each_on_its_own_thread() -> None:
    pool = ThreadPool()
    n = 6
    together = threading.Barrier(n, timeout=WAIT_S)  # passes only once all n jobs run at the same time
    threads: list[threading.Thread] = []
    done = threading.Semaphore(0)

    def job() -> None:
        together.wait()
        threads.append(threading.current_thread())
        done.release()

    try:
        for i in range(n):  # queued in a burst: each thread that takes one wakes the next before it runs it
            pool.submit(job, f"job-{i}")
        for _ in range(n):
            assert done.acquire(timeout=WAIT_S)
    finally:
        pool.shutdown()
    assert len(set(threads)) == n and pool.threads_started == n


def test_jobs_queued_behind_a_stuck_one_run_while_it_is_stuck() -> None:
    pool = ThreadPool()
    release = threading.Event()
    ran: list[str] = []
    done = threading.Semaphore(0)

    def quick(name: str) -> None:
        ran.append(name)
        done.release()

    try:
        pool.submit(lambda: release.wait(WAIT_S), "stuck")
        for name in ("a", "b", "c"):  # whichever thread comes for the queue, none waits behind the stuck job
            pool.submit(functools.partial(quick, name), name)
        for _ in range(3):
            assert done.acquire(timeout=WAIT_S)
        assert sorted(ran) == ["a", "b", "c"] and not release.is_set()
    finally:
        release.set()
        pool.shutdown()


def test_a_job_given_straight_to_an_idle_thread_counts_none_on_its_way_and_a_burst_after_still_runs_at_once() -> None:
    """A job its submitter waits for alone goes straight to the idle thread (no queue, no
    thread counted on its way to it): the same thread serves each, and a burst submitted
    after them still runs all at once, the idle thread taking one and each new thread the next."""
    pool = ThreadPool()
    seen: list[threading.Thread] = []
    try:
        for i in range(4):
            done = threading.Event()

            def one(done: threading.Event = done) -> None:
                seen.append(threading.current_thread())
                done.set()

            pool.submit(one, f"one-{i}", alone=True)
            assert done.wait(WAIT_S)
            assert wait_for(lambda: pool.idle() == 1)
        assert len(set(seen)) == 1 and pool.threads_started == 1
        assert pool._coming == 0 and not pool._waiting  # nothing left counted on or queued
        n = 4
        together = threading.Barrier(n, timeout=WAIT_S)  # passes only once all n jobs run at the same time
        ran = threading.Semaphore(0)

        def job() -> None:
            together.wait()
            ran.release()

        for i in range(n):
            pool.submit(job, f"burst-{i}")
        for _ in range(n):
            assert ran.acquire(timeout=WAIT_S)
    finally:
        pool.shutdown()
    assert pool.threads_started == n  # the idle one served the burst too
