"""A process named by a pidfd (internal): killed, and waited for until it is reaped,
without ever reaching another process that was given its pid since.

A pid names a process only until its parent reaps it; then the kernel may give it (and
the process group it led) to any new process. A kill or a wait by pid after that reaches
the wrong process: a stop that SIGKILLed a reaped server's pid killed whatever process
had it now, and a wait by ``/proc/<pid>`` waited its whole bound for a stranger, then
warned that the stranger was "not reaped". A :class:`PidFd` is opened while the
process is known to run (its owner opens it as it started it: the process is not reaped
before its starter has its pid, save a start that ended within that instant) and names
that one process for good:

- :meth:`PidFd.kill` sends ``SIGKILL`` through the pidfd (``pidfd_send_signal``) to the
  process, and first, when asked, to the process group it leads
  (``PIDFD_SIGNAL_PROCESS_GROUP``, Linux 6.9: the group of that very process while it is
  not reaped; on an older kernel ``killpg`` then, its pid being still the group's); a
  reaped leader's group members left are signalled by ``killpg`` while no process has the
  leader's pid (the kernel gives no process a pid a live group still has as its id:
  :meth:`PidFd._kill_orphaned_group`). The process itself is always signalled: one that
  leads no group yet (stopped before its ``setsid``) is in no group the kill reaches;
- :meth:`PidFd.wait_reaped` waits until it is reaped (no zombie left): the pidfd reports
  ``POLLHUP`` then, and the wait sleeps on it (``epoll``), never polling ``/proc``; a
  kernel that wakes no pidfd waiter at the reap is looked at again with a growing pause,
  by ``pidfd_send_signal(0)`` (``ESRCH`` once reaped).

Without a pidfd (no ``os.pidfd_open``, or none to be had: ``EMFILE``) a :class:`PidFd`
falls back to the pid: what was done before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import threading
import time
from collections.abc import Iterable
from typing import Final

from loguru import logger

__all__ = ["PidFd", "wait_all_reaped"]

_PROCESS_GROUP: Final = 1 << 2
"""``PIDFD_SIGNAL_PROCESS_GROUP`` (Linux 6.9): signal the process group the pidfd's process leads."""
_group_flag = [True]  # False once the kernel refused the flag (EINVAL): killpg while the leader is unreaped
_LOOK_AGAIN_S: Final = (0.005, 0.25)
"""The first and the longest pause between two looks at a process not yet reaped, for a
kernel that does not wake a pidfd's waiters at the reap (seconds)."""


class PidFd:
    """One process, held by a pidfd from :meth:`open` on (see the module doc).
    Thread-safe; :meth:`close` releases the descriptor (a kill after it does nothing, a
    wait after it finds the process let go of: reaped)."""

    __slots__ = ("_fd", "_lock", "_no_pidfd", "pid")

    def __init__(self, pid: int, fd: int, no_pidfd: bool = False) -> None:
        self.pid = pid
        self._fd = fd  # -1: gone when opened, or closed (or no pidfds here: _no_pidfd)
        self._no_pidfd = no_pidfd
        self._lock = threading.Lock()

    @classmethod
    def open(cls, pid: int) -> PidFd:
        """The process ``pid``, which its caller knows to run now (it started it, and
        nothing reaped it yet). A pid with no process (it ended and was reaped already) is
        held as reaped: never killed nor waited for."""
        try:
            return cls(pid, os.pidfd_open(pid))
        except ProcessLookupError:
            return cls(pid, -1)
        except (AttributeError, OSError):  # no pidfds here (ENOSYS), or none to be had now (EMFILE): by pid
            return cls(pid, -1, no_pidfd=True)

    def dup(self) -> PidFd:
        """Another :class:`PidFd` of the same process, with a descriptor of its own (closed
        by its holder, whatever this one's holder does)."""
        with self._lock:
            if self._no_pidfd or self._fd < 0:
                return PidFd(self.pid, -1, self._no_pidfd)
            return PidFd(self.pid, os.dup(self._fd))

    @property
    def fd(self) -> int:
        """The pidfd (readable once the process ended), ``-1`` once closed or without one."""
        return self._fd

    def kill(self, group: bool = False) -> None:
        """``SIGKILL`` the process (``group``: every process of the group it leads) unless
        it was reaped: never another process given its pid since. Never raises for a
        process gone."""
        self.signal(signal.SIGKILL, group)

    def signal(self, signum: int, group: bool = False) -> None:
        """Send ``signum`` as :meth:`kill` sends ``SIGKILL``: with ``group``, to the group
        the process leads, then to the process itself, which leads no group before it made
        one (a worker stopped, or not yet run, before its ``setsid``: a group kill alone
        reached no one, and the stopped worker kept its fork server, and the stop waiting
        for it, alive)."""
        with self._lock:
            if self._no_pidfd:
                if group:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.pid, signum)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.pid, signum)
                return
            if self._fd < 0:
                return
            if group:
                self._signal_group_locked(signum)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(self._fd, signum)

    def _signal_group_locked(self, signum: int) -> None:
        """``signum`` to every process of the group the process leads (none while it leads
        no group), or, its leader reaped, to what is left of that group."""
        if _group_flag[0]:
            try:
                signal.pidfd_send_signal(self._fd, signum, None, _PROCESS_GROUP)
            except ProcessLookupError:  # its leader reaped (no group through it), or it leads none
                pass
            except PermissionError:
                pass  # a member of another uid: killpg below signals those it may
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                _group_flag[0] = False  # a kernel before 6.9
            else:
                if not self._unreaped_locked():  # a reaped leader's: some kernels send it to no one
                    self._kill_orphaned_group(signum)
                return
        if self._unreaped_locked():  # its pid is no other process's: a group of that id is the one it leads
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)
        else:
            self._kill_orphaned_group(signum)

    def _kill_orphaned_group(self, signum: int) -> None:
        """Signal what is left of the group the reaped leader led: the kernel gives no
        process a pid that a live group still has as its id, so while no process has the
        leader's pid, a group of that id is the old one (a new group of that id needs its
        pid given anew once the old group emptied, to a process that made itself a group
        leader: a process at ``/proc/<pid>`` is taken for that one and left alone)."""
        if not os.path.exists(f"/proc/{self.pid}"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)

    def reaped(self) -> bool:
        """Whether the process was reaped (it ended and its parent released it), or was
        let go of (:meth:`close`)."""
        with self._lock:
            if self._no_pidfd:
                return not os.path.exists(f"/proc/{self.pid}")
            return self._fd < 0 or not self._unreaped_locked()

    def _unreaped_locked(self) -> bool:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP)
        for _, events in poller.poll(0):
            if events & (select.POLLHUP | select.POLLNVAL):
                return False
        try:
            signal.pidfd_send_signal(self._fd, 0)
        except ProcessLookupError:
            return False
        except (PermissionError, OSError):
            return True  # there (another uid's), or unknown: not said reaped
        return True

    def wait_reaped(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until the process is reaped; whether it is."""
        until = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            fd = -1 if self._no_pidfd or self._fd < 0 else os.dup(self._fd)  # its own: a close meanwhile is safe
        if fd < 0:
            return self._look_until(until)
        try:
            with select.epoll(1) as waits:
                waits.register(fd, select.EPOLLIN | select.EPOLLHUP | select.EPOLLET)  # woken at the end and the reap
                pause = _LOOK_AGAIN_S[0]
                while True:
                    if self.reaped():
                        return True
                    left = until - time.monotonic()
                    if left <= 0:
                        return False
                    for _, events in waits.poll(min(left, pause)):
                        if events & select.EPOLLHUP:
                            return True
                    pause = min(pause * 2, _LOOK_AGAIN_S[1])
        finally:
            os.close(fd)

    def _look_until(self, until: float) -> bool:
        """:meth:`wait_reaped` without a pidfd: looked at with a growing pause."""
        pause = _LOOK_AGAIN_S[0]
        while not self.reaped():
            left = until - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, pause))
            pause = min(pause * 2, _LOOK_AGAIN_S[1])
        return True

    def close(self) -> None:
        """Release the pidfd (idempotent)."""
        with self._lock:
            fd, self._fd = self._fd, -1
            self._no_pidfd = False
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        return f"PidFd({self.pid})"


def wait_all_reaped(processes: Iterable[tuple[str, PidFd]], timeout_s: float, what: str) -> list[tuple[str, int]]:
    """Wait, ``timeout_s`` seconds in all, until each of ``processes`` (each named, as
    ``"worker"``) is reaped; the ones that are not by then, named and logged at warning
    level in one line that says what ``what`` (``"stopping the system"``) left."""
    until = time.monotonic() + max(0.0, timeout_s)
    left = [(name, process.pid) for name, process in processes
            if not process.wait_reaped(until - time.monotonic())]
    if left:
        named = ", ".join(f"{name} (pid {pid})" for name, pid in left)
        logger.warning("{}: {} killed but not reaped within {:g} s: each stays a process (a zombie at least) until "
                       "its parent reaps it", what, named, timeout_s)
    return left
