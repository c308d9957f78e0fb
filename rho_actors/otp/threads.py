"""Reused OS threads for short-lived actors: a fresh actor need not be a fresh thread.

Starting a ``threading.Thread`` costs tens of microseconds (it waits until the new
thread runs), more than a whole no-op tool call. A :class:`ThreadPool` runs jobs (an
actor's loop, see :attr:`rho_actors.Actor.thread_pool`) on threads it keeps: a job goes
to an idle thread when one waits, else to a new one. The actor itself is still new for
every start (its own state, inbox and identity); only the OS thread is reused.

- **A stuck job keeps its thread** (a tool past its deadline is abandoned, not killed:
  DESIGN §5): the pool never waits for it; the next job simply gets another thread, so
  a hung call delays no other. The thread rejoins the pool if its job ever returns.
- **Bounded idling**: at most ``max_idle`` threads wait for work, each for at most
  ``idle_s`` seconds; a thread past either bound ends.
- **Never keeps the process alive**: every thread is a daemon thread.
- **Each job starts as on a new thread**: in a new, empty :mod:`contextvars` context,
  with the thread named for the job. What a job leaves in a ``threading.local`` (an
  ``asyncio`` event loop set with ``set_event_loop``, say) is seen by later jobs on that
  thread: a job must not rely on thread-local state being fresh.

A job that is about to end can hand its thread over (:meth:`ThreadPool.hand_over`): the
next job it submits runs on the same thread right after it, with no other thread woken
(the next call of an exclusive turn, started as the call before it replies). The host's
own code run by such a job (a turn's ``on_result``, its future's done callbacks, event
subscribers) runs inside :func:`host_code`: a job handed over before it goes to another
thread at once, and none is handed over within it, so what the host's code waits for
(a turn of another session, run from a callback) never waits for that code to return.

After :meth:`ThreadPool.shutdown` idle threads end, busy ones end with their job, and
each new job runs on its own thread, not kept.

Example::

    pool = ThreadPool()
    pool.submit(lambda: print("on a pooled thread"), "job-1")
    pool.shutdown()
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable, Iterator

from loguru import logger

__all__ = ["ThreadPool", "host_code"]

Job = Callable[[], object]
_Handoff = tuple[Job | None, str]
_THREAD = threading.local()  # per thread: ``pool`` (the ThreadPool it serves), ``host`` (host_code depth)


class _HostCode:
    """Around the host's code run on this thread (a callback that may block, e.g. on a
    turn of another session): a job this thread's pool holds back for it
    (:meth:`ThreadPool.hand_over`) is started on another thread now, and no job
    submitted within the block is held back. Elsewhere a cheap no-op. A class, not a
    generator, and :func:`host_code` is the class itself (no call around its making):
    it is entered around every result handed to the host."""

    __slots__ = ("_depth",)

    def __enter__(self) -> None:
        pool: ThreadPool | None = getattr(_THREAD, "pool", None)
        if pool is None:
            self._depth = -1
            return
        pool.release()
        self._depth = depth = getattr(_THREAD, "host", 0)
        _THREAD.host = depth + 1

    def __exit__(self, *exc_info: object) -> None:
        if self._depth >= 0:
            _THREAD.host = self._depth


host_code: Callable[[], contextlib.AbstractContextManager[None]] = _HostCode
"""``with host_code(): ...`` around the host's code run on this thread (see :class:`_HostCode`)."""


class ThreadPool:
    """Daemon threads that run jobs one after another (see the module doc).

    Arguments: ``idle_s``, how long an idle thread waits for a job before it ends
    (seconds); ``max_idle``, how many threads may wait at once (a thread finding that
    many waiting ends at once); ``name``, the name of an idle thread.
    """

    def __init__(self, *, idle_s: float = 30.0, max_idle: int = 64, name: str = "rho_actors-idle") -> None:
        if idle_s <= 0 or max_idle < 0:
            raise ValueError(f"idle_s must be > 0 and max_idle >= 0, got {idle_s} and {max_idle}")
        self.idle_s = idle_s
        self.max_idle = max_idle
        self.name = name
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Handoff]] = []  # a stack: the most recent waits least
        self._closed = False
        self._local = threading.local()  # per thread: ``handing`` (bool) and ``next`` (a job handed over)
        self.threads_started = 0
        """How many threads this pool has started."""

    def submit(self, job: Job, name: str, *, may_take_over: bool = False) -> None:
        """Run ``job()`` on an idle thread (renamed ``name``) or on a new daemon thread.
        Never blocks on other jobs. What ``job`` raises is logged; what starting a
        thread raises (``RuntimeError``: the host at its thread limit) is raised. With
        ``may_take_over``, inside :meth:`hand_over` it runs on this thread instead, once
        the current job returns: only for a job that nothing in the current job waits for."""
        local = self._local
        if (may_take_over and getattr(local, "handing", False) and getattr(local, "next", None) is None
                and not getattr(_THREAD, "host", 0)):
            local.next = (job, name)  # runs on this thread once its current job returns
            return
        with self._lock:
            handoff = self._idle.pop() if self._idle else None
            if handoff is None:
                self.threads_started += 1
        if handoff is not None:
            handoff.put((job, name))
            return
        try:
            threading.Thread(target=self._serve, args=(job,), name=name, daemon=True).start()
        except Exception:  # no thread could be started (the host at its limit): none counted
            with self._lock:
                self.threads_started -= 1
            raise

    @contextlib.contextmanager
    def hand_over(self) -> Iterator[None]:
        """Within this block, in a job running on this pool's thread, the first job
        submitted from this thread with ``may_take_over`` runs on it right after the
        current job returns, instead of waking another thread. Use it only where the
        current job ends next (an actor's last hook): the handed-over job waits for it.
        Elsewhere a no-op."""
        local = self._local
        if not hasattr(local, "next"):  # not one of this pool's threads
            yield
            return
        local.handing = True
        try:
            yield
        finally:
            local.handing = False

    def run_handing_over(self, job: Callable[[], object]) -> None:
        """``job()`` inside :meth:`hand_over` (the same, without a context manager's
        cost: for a call thread's reply, on every call)."""
        local = self._local
        if not hasattr(local, "next"):  # not one of this pool's threads
            job()
            return
        local.handing = True
        try:
            job()
        finally:
            local.handing = False

    def release(self) -> None:
        """Start the job held back on this thread by :meth:`hand_over` (if any) on
        another thread now, as :meth:`submit` would."""
        pending = getattr(self._local, "next", None)
        if pending is not None:
            self._local.next = None
            self.submit(pending[0], pending[1])

    def idle(self) -> int:
        """How many threads wait for a job now."""
        with self._lock:
            return len(self._idle)

    def shutdown(self) -> None:
        """End the idle threads now and every busy one once its job returns (never
        waited for). Jobs submitted from now on each get a thread of their own."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for handoff in idle:
            handoff.put((None, ""))

    def _serve(self, job: Job) -> None:
        thread = threading.current_thread()
        local = self._local
        local.next = None
        _THREAD.pool = self
        handoff: queue.SimpleQueue[_Handoff] = queue.SimpleQueue()
        next_job: Job | None = job
        while next_job is not None:
            try:
                contextvars.Context().run(next_job)
            except BaseException:  # this thread serves later jobs: nothing ends it
                logger.exception("a job of thread {} raised", thread.name)
            if local.next is not None:  # handed over by the job that just ended
                (next_job, name), local.next = local.next, None
                thread.name = name
                continue
            next_job = None  # let the finished job's objects go while idle
            with self._lock:
                if self._closed or len(self._idle) >= self.max_idle:
                    return
                self._idle.append(handoff)
            thread.name = self.name
            try:
                next_job, name = handoff.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if handoff in self._idle:  # still idle: end
                        self._idle.remove(handoff)
                        return
                next_job, name = handoff.get()  # a job was handed over just now
            thread.name = name
