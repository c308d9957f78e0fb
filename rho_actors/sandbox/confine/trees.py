"""Process trees seen from the host (internal): killing one whole
(:func:`kill_tree`), bounding its memory where no cgroup can (:class:`RssSampler`) and
naming what ended a worker (:func:`classify_ending`). Used by the host's side of the
sandbox and by the fork servers; confines nothing itself (that is
:mod:`rho_actors.sandbox.confine.confinement`'s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass

import psutil
from loguru import logger

from rho_actors.tool import ErrorKind

__all__ = ["Ending", "RssSampler", "classify_ending", "end_own_tree", "kill_tree"]


# --- process trees ----------------------------------------------------------------------------


def kill_tree(pid: int, timeout_s: float = 2.0, *, include_root: bool = True) -> list[int]:
    """SIGKILL process ``pid`` and all its descendants; returns the pids signalled.

    The tree is frozen first (``SIGSTOP``, re-walked until no new process appears) so
    nothing forks past the kill. A ``setsid`` escape is found while its parent lives, and
    after that when it reparented to a subreaper inside the tree (a confined child is
    one, ``Confinement.subreaper``). Waits at most ``timeout_s`` seconds until each is
    gone or a zombie (never reaps: a parent keeps its child's exit status); a process
    that vanished meanwhile is skipped. Raises ``psutil.NoSuchProcess``
    only when ``pid`` itself is gone."""
    root = psutil.Process(pid)
    seen: dict[int, psutil.Process] = {root.pid: root} if include_root else {}
    for _ in range(64):
        for p in seen.values():
            with contextlib.suppress(psutil.Error):
                p.suspend()
        new = [p for p in _descendants(root) if p.pid not in seen]
        if not new:
            break
        seen.update((p.pid, p) for p in new)
    for p in seen.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
    deadline = time.monotonic() + timeout_s
    while not all(_gone(p) for p in seen.values()) and time.monotonic() < deadline:
        time.sleep(0.002)
    return list(seen)


def end_own_tree(timeout_s: float = 2.0) -> None:
    """A fork server's end (it is a child subreaper): kill every process of its tree,
    then reap its children (its own, and the orphans reparented to it) until none is
    left, ``timeout_s`` seconds at most. Unreaped, each would stay a zombie, a process
    with its pid, until the host's init reaps it in its own time (a microVM's init here:
    1.2 s under load), past the stop that ended the fork server."""
    with contextlib.suppress(psutil.Error):
        kill_tree(os.getpid(), timeout_s, include_root=False)
    deadline, pause = time.monotonic() + timeout_s, 0.001
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if pid:
            continue
        if time.monotonic() >= deadline:
            return
        time.sleep(pause)  # (a killed child not yet exited: it ends promptly)
        pause = min(pause * 2, 0.05)


def _descendants(root: psutil.Process) -> list[psutil.Process]:
    try:
        return list(root.children(recursive=True))
    except psutil.Error:
        return []


def _gone(p: psutil.Process) -> bool:
    """Ended (a zombie counts: its parent reaps it; waiting here would steal its status)."""
    try:
        return p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return True


# --- memory bound without a cgroup, and how a worker ended -------------------------------------


class RssSampler:
    """The memory bound of a process tree when no cgroup can be made: every
    ``interval_s`` seconds, sum the tree's proportional set size (PSS: RSS with each
    shared page divided among its sharers, so forked children are not counted for their
    parent's pages) and :func:`kill_tree` it once the sum exceeds ``bound_bytes``.

    :meth:`start` samples in a daemon thread until :meth:`stop` or the kill; :meth:`check`
    takes one sample. ``exceeded`` is set once it killed; ``peak_bytes`` is the largest sum."""

    def __init__(self, pid: int, bound_bytes: int, interval_s: float = 0.05) -> None:
        self.pid, self.bound_bytes, self.interval_s = pid, bound_bytes, interval_s
        self.exceeded = threading.Event()
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False  # a look raised (logged once)

    def check(self) -> bool:
        """Sample once; kill the tree and return True if it is over the bound."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return False
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                info = p.memory_full_info()
                total += getattr(info, "pss", info.rss)
        self.peak_bytes = max(self.peak_bytes, total)
        if total <= self.bound_bytes:
            return False
        self.exceeded.set()
        with contextlib.suppress(psutil.Error):
            kill_tree(self.pid)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._look():
                return

    def _look(self) -> bool:
        """:meth:`check`, from the sampling thread: whatever it raises unexpectedly is
        logged (the first time) and the next look comes as usual, never the end of the
        watch (the tree would be left unbounded, silently)."""
        try:
            return self.check()
        except Exception:
            if not self._failed:
                self._failed = True
                logger.exception("the memory watch of process {} failed to look; it goes on looking", self.pid)
            return False

    def start(self) -> RssSampler:
        """Sample in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._run, name=f"rss-sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (waits for the thread, at most one interval plus a sample)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@dataclass(frozen=True)
class Ending:
    """How a worker ended: the error ``kind`` for its call and a message that says why."""

    kind: ErrorKind
    message: str


def classify_ending(
    returncode: int | None,
    *,
    killed_for: ErrorKind | None = None,
    memory_bound_hit: bool = False,
    memory_error: bool = False,
    memory_bound: str = "its memory bound",
) -> Ending:
    """Classify a worker's end. ``returncode``: ``Popen``/``Process`` style (``-N`` for
    signal N, ``None`` if unknown); ``killed_for``: the kind the pool killed it for
    (``TIMEOUT`` at the deadline, ``CANCELLED`` at stop), else None; ``memory_bound_hit``:
    the cgroup recorded an OOM kill or the :class:`RssSampler` killed it;
    ``memory_error``: the tool raised ``MemoryError``. Memory wins (the pool's kill may
    be its consequence), then the pool's reason; any other signal is ``crashed`` naming
    it, as sent from outside the pool; an exit status is ``exited``."""
    if memory_bound_hit or memory_error:
        how = "raised MemoryError" if memory_error and not memory_bound_hit else "was killed"
        return Ending(ErrorKind.MEMORY, f"the tool's process tree reached {memory_bound} and {how}")
    if killed_for is not None:
        return Ending(killed_for, f"the pool killed the worker ({killed_for})")
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return Ending(ErrorKind.CRASHED, f"the worker was killed by signal {name} from outside the pool")
    status = "an unknown status" if returncode is None else f"status {returncode}"
    return Ending(ErrorKind.EXITED, f"the worker exited with {status} during the call")
