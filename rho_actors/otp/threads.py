"""Reused OS threads for short-lived actors: a fresh actor need not be a fresh thread.

Starting a ``threading.Thread`` costs tens of microseconds (it waits until the new
thread runs), more than a whole no-op tool call. A :class:`ThreadPool` runs jobs (an
actor's loop, see :attr:`rho_actors.Actor.thread_pool`) on threads it keeps. The actor
itself is still new for every start (its own state, inbox and identity); only the OS
thread is reused.

- **One wake for a burst of jobs**: a job waits in the pool's queue, first in first
  out, and one thread is on its way to take jobs from it (an idle one woken, or a new
  one); a thread taking a job while others still wait wakes the next one before it runs
  its own, and a thread whose job returned takes the next waiting job before it idles.
  So every waiting job has a thread coming that runs no job yet, and a job never waits
  behind a running one, while a turn's eight quick calls cost one or two thread wakes
  instead of eight. A job its submitter waits for alone (``submit(alone=True)``: nothing
  more comes from that thread meanwhile), submitted when none waits and no thread is on its
  way, goes straight to an idle thread, which runs it without a look at the queue. A job
  queued more than 1 ms after the last thread was woken for the
  queue wakes one more (the ones on their way may wait for the interpreter: a burst of
  jobs then starts as fast as if each woke its own thread). A submit counts on the
  threads on their way and the idle ones, one a waiting job; a job beyond them gets a
  new thread started by the submit itself, so the host's thread limit reaches the
  submitter (``RuntimeError``) and never leaves a job queued with no thread coming; a
  submit interrupted as it starts that thread (a signal handler's ``KeyboardInterrupt``
  in the host's thread) counts no thread that was never started, and takes back a job
  then left with none coming (the interrupt tells the submitter).

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

import collections
import contextlib
import contextvars
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from loguru import logger

__all__ = ["ThreadPool", "host_code"]

Job = Callable[[], object]
_Handoff = tuple[Job, str]
_Wake = bool | _Handoff  # what wakes an idle thread: come for the waiting jobs (True), end (False), or a job of its own
_T = TypeVar("_T")


def _end() -> None:
    """Never run: the job of :data:`_END`."""


_PATIENCE_S = 0.001  # a job queued this long after the last thread was woken for the queue wakes another
_END: _Handoff = (_end, "")  # what a thread takes when none waits and it is to end


class _ThreadState(threading.local):
    """Per thread: ``pool``, the ThreadPool it serves, and ``host``, the host_code depth.
    The class's values are every thread's until it sets its own: reading them on a thread
    that never did raises and clears no ``AttributeError`` (a ``getattr`` default would,
    formatting its message: on every call submitted from a host's thread)."""

    pool: ThreadPool | None = None
    host = 0


class _PoolLocal(threading.local):
    """Per thread of one pool: ``handing`` (within :meth:`ThreadPool.hand_over`) and
    ``next`` (a job handed over), set on its own threads only: ``handing`` is ``False``
    elsewhere without an ``AttributeError`` raised and cleared (:class:`_ThreadState`),
    and ``next`` is missing there (what tells a pool's thread from others)."""

    handing = False


_THREAD = _ThreadState()


_STARTED_WAIT_S = 5.0  # how long an interrupted start waits for a thread it may have started to say so


def _began(thread: threading.Thread) -> bool:
    """Whether ``thread``, whose ``start()`` was interrupted, was started (it runs, or soon
    will): ``threading`` puts it in its ``_limbo`` before it starts the OS thread, which
    sets ``_started`` before it leaves ``_limbo``; interrupted before that start, it is
    taken out of ``_limbo`` here (else ``threading.enumerate()`` lists it for good)."""
    limbo = getattr(threading, "_limbo", None)
    in_limbo = limbo is not None and thread in limbo  # looked at before _started: see above
    if thread._started.is_set():  # type: ignore[attr-defined]
        return True
    if not in_limbo:
        return limbo is None and thread.is_alive()  # never put there (interrupted before): not started
    if thread._started.wait(_STARTED_WAIT_S):  # type: ignore[attr-defined]  # started a moment ago
        return True
    with threading._active_limbo_lock:  # type: ignore[attr-defined]
        limbo.pop(thread, None)  # type: ignore[union-attr]
    return False


class _HostCode:
    """Around the host's code run on this thread (a callback that may block, e.g. on a
    turn of another session): a job this thread's pool holds back for it
    (:meth:`ThreadPool.hand_over`) is started on another thread now, and no job
    submitted within the block is held back. Elsewhere a cheap no-op. A class, not a
    generator, and :func:`host_code` is the class itself (no call around its making):
    it is entered around every result handed to the host."""

    __slots__ = ("_depth",)

    def __enter__(self) -> None:
        pool = _THREAD.pool
        if pool is None:
            self._depth = -1
            return
        pool.release()
        self._depth = depth = _THREAD.host
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
        self._idle: list[queue.SimpleQueue[_Wake]] = []  # a stack: the most recent waits least
        self._waiting: collections.deque[_Handoff] = collections.deque()  # jobs no thread has taken yet
        self._coming = 0  # threads on their way to take waiting jobs (woken, or started), running none
        self._woken_at = 0.0  # when the last of them was woken (time.monotonic())
        self._closed = False
        self._local = _PoolLocal()  # per thread: ``handing`` (bool) and ``next`` (a job handed over)
        self.threads_started = 0
        """How many threads this pool has started."""

    def submit(self, job: Job, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        """Run ``job()`` on a pooled thread (renamed ``name``): queued, and an idle
        thread woken for it or a new daemon thread started unless one is on its way to
        the queue already (the module doc). Never blocks on other jobs. What ``job`` raises is logged; what starting a
        thread raises (``RuntimeError``: the host at its thread limit) is raised. With
        ``may_take_over``, inside :meth:`hand_over` it runs on this thread instead, once
        the current job returns: only for a job that nothing in the current job waits for.
        ``alone``: the submitting thread submits nothing more until this job has run (it
        waits for it alone): when none is queued and no thread is on its way, the job goes
        straight to an idle thread (no burst to wake threads one after another for)."""
        local = self._local
        if may_take_over and local.handing and getattr(local, "next", None) is None and not _THREAD.host:
            local.next = (job, name)  # runs on this thread once its current job returns
            return
        handoff: queue.SimpleQueue[_Wake] | None = None
        entry = (job, name)
        covered = False
        with self._lock:
            closed = self._closed
            if alone and not closed and self._idle and not self._waiting and not self._coming:
                # none queued, none on its way, none to follow from this thread: straight to an idle
                # thread, which runs it without a look at the queue (PROFILE §43)
                handoff = self._idle.pop()
            elif not closed:
                self._waiting.append(entry)
                now = time.monotonic()
                coming, idle = self._coming, len(self._idle)
                covered = len(self._waiting) <= coming + idle  # threads on their way or idle, one a job
                if covered and coming and now - self._woken_at < _PATIENCE_S:  # one on its way takes it
                    return
                self._coming += 1  # none on its way, none got going yet (the interpreter busy elsewhere), or too few
                self._woken_at = now
                handoff = self._idle.pop() if covered and idle else None
            if handoff is None:
                self.threads_started += 1
        if handoff is not None:
            handoff.put(True if covered else entry)  # covered: woken for the queue; else the job is its own
            return
        thread = threading.Thread(target=self._serve, args=(entry if closed else None,),
                                  name=name if closed else self.name, daemon=True)
        try:
            thread.start()
        except Exception:  # no thread could be started (the host at its limit): none counted
            if self._not_started(entry, closed, covered):
                raise
            # taken meanwhile by a thread whose job returned, or only one more to be faster: it runs
        except BaseException:  # interrupted (a signal handler's KeyboardInterrupt): as above unless it began
            if not _began(thread):
                self._not_started(entry, closed, covered)  # (else no thread counted on would ever come)
            raise

    def _not_started(self, entry: _Handoff, closed: bool, covered: bool) -> bool:
        """The thread :meth:`submit` started for ``entry`` did not start: it is not
        counted; whether the submitter is to be told (its job is not queued, or the pool
        was closed: it does not run)."""
        with self._lock:
            self.threads_started -= 1
            if closed:
                return True
            self._coming -= 1
            if covered:  # one more was only to be faster: the threads counted take it
                return False
            for i, queued in enumerate(self._waiting):
                if queued is entry:  # not taken yet: not queued
                    del self._waiting[i]
                    return True
        return False

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

    def run_handing_over(self, job: Callable[[_T], object], arg: _T) -> None:
        """``job(arg)`` inside :meth:`hand_over` (the same, without a context manager's
        cost: for a call thread's reply, on every call)."""
        local = self._local
        if not hasattr(local, "next"):  # not one of this pool's threads
            job(arg)
            return
        local.handing = True
        try:
            job(arg)
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
            needed = min(len(idle), len(self._waiting) - self._coming)  # the jobs waiting still get their threads
            if needed > 0:
                self._coming += needed
        for i, handoff in enumerate(idle):
            handoff.put(i < needed)

    def _serve(self, first: _Handoff | None) -> None:
        """A pooled thread: ``first`` (a job of a closed pool), else the waiting jobs, one
        after another, then idle until woken to take more (the module doc)."""
        thread = threading.current_thread()
        local = self._local
        local.next = None
        _THREAD.pool = self
        handoff: queue.SimpleQueue[_Wake] = queue.SimpleQueue()
        coming = first is None  # started to take waiting jobs
        while True:
            if first is None:
                first = self._take(handoff, coming)
                if first is _END:
                    return
                if first is None:  # idle until woken (True), given a job, or ended (False, or idle too long)
                    thread._name = self.name  # type: ignore[attr-defined]  # what thread.name= sets, without its frame
                    try:
                        woken = handoff.get(True, self.idle_s)  # (positional: no keyword parsed, on every job)
                    except queue.Empty:
                        with self._lock:
                            still_idle = handoff in self._idle
                            if still_idle:  # end, unless counted on for a waiting job: then it comes for it
                                self._idle.remove(handoff)
                                if len(self._waiting) <= self._coming + len(self._idle):
                                    return
                                self._coming += 1
                        woken = True if still_idle else handoff.get()  # else woken just now
                    if woken is False:
                        return
                    if woken is not True:  # a job of its own (submit's straight hand-off): no look at the queue
                        first, coming = woken, False
                    else:
                        coming = True
                        continue
                else:
                    coming = False
            thread._name = first[1]  # type: ignore[attr-defined]  # (as above: on every job)
            try:
                contextvars.Context().run(first[0])
            except BaseException:  # this thread serves later jobs: nothing ends it
                logger.exception("a job of thread {} raised", thread.name)
            first = None  # let the finished job's objects go while idle
            if local.next is not None:  # handed over by the job that just ended
                first, local.next = local.next, None

    def _take(self, handoff: queue.SimpleQueue[_Wake], coming: bool) -> _Handoff | None:
        """The next waiting job for this thread (``coming``: the one on its way to them),
        waking the next thread for the jobs left when it was; ``None``: none waits, and
        the thread is idle now (``handoff`` in the idle stack); ``_END``: none waits, and
        the thread is to end (the pool closed, or enough threads idle)."""
        wake: queue.SimpleQueue[_Wake] | None = None
        start = False
        lock = self._lock
        # acquire/release, not ``with`` (~1.1k instructions less a job, PROFILE §48): only a pool thread runs
        # this, never the main one, where alone a signal handler's exception could come between the two
        lock.acquire()
        try:
            if self._waiting:
                taken = self._waiting.popleft()
                if coming:
                    if len(self._waiting) >= self._coming:  # the next thread comes for them before this one runs a job
                        self._woken_at = time.monotonic()
                        wake = self._idle.pop() if self._idle else None
                        if wake is None:  # none idle, as submit counted on (the pool closed meanwhile)
                            start = True
                            self.threads_started += 1
                    else:  # the others on their way take them
                        self._coming -= 1
            else:
                taken = None
                if coming:
                    self._coming -= 1
                if self._closed or len(self._idle) >= self.max_idle:
                    return _END
                self._idle.append(handoff)
        finally:
            lock.release()
        if wake is not None:
            wake.put(True)
        elif start:
            try:
                threading.Thread(target=self._serve, args=(None,), name=self.name, daemon=True).start()
            except Exception:  # the host at its thread limit: the jobs left wait for a thread to take them
                with self._lock:
                    self.threads_started -= 1
                    self._coming -= 1
                logger.exception("no thread could be started for waiting jobs: a running thread takes them")
        return taken
