"""A session's lease: one host serves a session's folder at a time (DESIGN §4 "Approvals").

A host (an :class:`~rho_actors.ActorSystem`) that serves a session holds the lease of its
folder, ``data_dir/sessions/<id>``, from the moment it opens it (``start_loop`` of a
session whose folder exists, or the session's first use of a folder it makes) until the
session's loop stops (:meth:`~rho_actors.Loop.stop`, the system's stop). A second host,
in another process or another ``ActorSystem`` of this one, is refused there with a
:class:`SessionLeaseError` naming the session, its folder and the pid holding it: two
hosts serving one folder at once would take its held calls back both and keep each
other's views of them wrong.

The lease is an exclusive ``flock`` of the folder itself (a descriptor of the
directory, close-on-exec), as a prompt's lock was before
(:mod:`~rho_actors.agent.transcript_lock`, whose prompts now take it from the lease this
process holds): a tool clearing its session's folder (``ctx["data_dir"]``) removes no
lock file a second host could lock anew (one that removes or renames the folder itself
leaves the lock on the old one: code the host trusts is trusted with its session). The
kernel releases it with the holder's last descriptor of it, so a host killed (``kill -9``
too) leaves it free at once for the next, which takes the session back. An ``flock`` is
shared by the children forked from its holder while they keep the descriptor: a child forked without an exec (a tool's
``os.fork``, ``multiprocessing``'s ``fork``) closes its copies as it starts
(:func:`os.register_at_fork`), so it never keeps a dead host's session; a child started
by exec (a subprocess, rho's fork servers and their workers) holds them only until its
exec, which a refused host waits for (:data:`FORKED_WAIT_S`).

A host writes into a session's folder (its task records) only while it holds the lease
(:func:`writing`: an in-memory look, no syscall): a call still running when its loop
stopped (:meth:`~rho_actors.Loop.stop` is a stop: the lease goes at once, the call is
not waited for) ends in memory only, its late record dropped with a warning, so the
next host's view of the folder is never overwritten by a host that no longer serves it.

Deciding a held call from another process (``rho-actors approve``,
:func:`~rho_actors.loop.decisions.decide`) takes no lease: it is no host, it appends a
decision under the transcript's own lock, and the serving host acts on it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from loguru import logger

from rho_actors.errors import RhoError

__all__ = ["FORKED_WAIT_S", "SessionLease", "SessionLeaseError", "flock_within", "lease_held_here", "release_all",
           "served", "writing"]

FORKED_WAIT_S: Final = 2.0
"""How long (seconds) a host waits for a session's lease held by another process before
it is refused: a child its holder forked holds a copy of it until its exec."""

_BUSY: Final = (errno.EAGAIN, errno.EWOULDBLOCK)
_LEASES: dict[tuple[int, int], SessionLease] = {}  # the leases this process holds, by their folder's (dev, ino)
_OPENING: set[int] = set()  # descriptors of folders being leased (before their flock is taken or refused)
_HELD_AT: dict[str, SessionLease] = {}  # the same leases, by their folder's path (as the host names it)
_WRITERS: dict[str, int] = {}  # writes under way into a leased folder, by its path (see writing)
_LET_GO: dict[str, Callable[[], object]] = {}  # by folder path: the host that let its lease go last (a weak ref)
_MAX_LET_GO: Final = 4096  # past it, the entries of hosts gone are pruned
_LOCK = threading.Lock()
_WRITTEN = threading.Condition(_LOCK)  # notified when a folder's last write under way ends


class SessionLeaseError(RhoError, OSError):
    """A session served by another host: its folder's lease is held by another process
    (``pid``: the one that took it, as ``/proc/locks`` says; ``None`` when not known) or
    by another ``ActorSystem`` of this process. ``str(err)`` names the session, its
    folder and the holder. Also an ``OSError``, as the folder's other failures are."""

    def __init__(self, message: str, *, session_id: str, folder: Path, pid: int | None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.folder = folder
        self.pid = pid


class SessionLease:
    """The lease of the session ``session_id`` whose folder is ``folder``, for the host
    ``owner`` (an ``ActorSystem``): :meth:`hold` takes it, :meth:`release` lets it go.
    Shared by the session's loop, its restarts and its handle; once released (the loop
    stopped) or taken over, it is never held again: a later loop of the session has a
    lease of its own."""

    __slots__ = ("_ended", "_fd", "_holding", "_key", "folder", "owner", "session_id")

    def __init__(self, session_id: str, folder: Path, owner: object) -> None:
        self.session_id, self.folder, self.owner = session_id, folder, owner
        self._fd: int | None = None
        self._key: tuple[int, int] | None = None
        self._ended = False
        self._holding = threading.Lock()  # one hold at a time (the handle's and the loop's, say)

    @property
    def held(self) -> bool:
        """Whether this lease is held now."""
        return self._fd is not None

    def hold(self) -> None:
        """Take the lease of the existing folder (idempotent): refused at once when another
        ``ActorSystem`` of this process holds it, after at most :data:`FORKED_WAIT_S`
        when another process does. One this host held for an earlier loop of the session
        (given up by its supervisor, then started again) is taken over; a lease released
        or taken over is not taken again (nothing done). Raises
        :class:`SessionLeaseError`, and ``OSError`` (``FileNotFoundError`` when the
        folder is missing)."""
        if self._fd is not None or self._ended:
            return
        with self._holding:
            self._hold()

    def _hold(self) -> None:
        if self._fd is not None or self._ended:  # held (or let go) meanwhile
            return
        with _LOCK:  # entered at once: a child forked while the flock is waited for closes it too
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            _OPENING.add(fd)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            with _LOCK:
                other = _LEASES.get(key)
                if other is not None and other.owner is self.owner:  # this host's, of an earlier loop
                    self._fd, self._key, other._fd, other._key, other._ended = other._fd, key, None, None, True
                    _LEASES[key] = self
                    _HELD_AT.pop(str(other.folder), None)
                    _HELD_AT[str(self.folder)] = self
            if self._fd is not None:
                _close_opening(fd)
                return
            if other is not None:
                raise self._refused(os.getpid(), "another ActorSystem of this process")
            if not flock_within(fd, FORKED_WAIT_S):
                pid = _holder(st)
                raise self._refused(pid, "another host" if pid != os.getpid() else "this process")
            with _LOCK:
                self._fd, self._key = fd, key
                _LEASES[key] = self
                _HELD_AT[str(self.folder)] = self
                _LET_GO.pop(str(self.folder), None)
                _OPENING.discard(fd)  # a lease's now
        except BaseException:
            if self._fd != fd:
                _close_opening(fd)
            raise

    def release(self) -> None:
        """Let the lease go (idempotent): the next host may take the session. A write of
        this host into the folder under way (:func:`writing`) ends first; none starts after."""
        path = str(self.folder)
        with _LOCK:
            fd, key, self._fd, self._key, self._ended = self._fd, self._key, None, None, True
            if key is not None and _LEASES.get(key) is self:
                del _LEASES[key]
            if _HELD_AT.get(path) is self:
                del _HELD_AT[path]
            if fd is not None:
                _let_go(path, self.owner)
            while fd is not None and _WRITERS.get(path):  # a file write (bounded): the next host never sees it torn
                _WRITTEN.wait()
        if fd is not None:
            os.close(fd)  # the flock goes with its last descriptor

    def _refused(self, pid: int | None, holder: str) -> SessionLeaseError:
        who = f"process {pid}" if pid is not None else "a process /proc/locks does not name"
        return SessionLeaseError(
            f"session {self.session_id!r} is served by {holder}: the lease of its folder {self.folder} is held by "
            f"{who}; one host serves a session at a time (stop that one, or serve the session there)",
            session_id=self.session_id, folder=self.folder, pid=pid)


def release_all(owner: object) -> None:
    """Let go every lease ``owner`` (a stopping ``ActorSystem``) holds."""
    with _LOCK:
        held = [lease for lease in _LEASES.values() if lease.owner is owner]
    for lease in held:
        lease.release()


@contextlib.contextmanager
def writing(owner: object | None, folder: Path, what: str) -> Iterator[bool]:
    """Whether the host ``owner`` (an ``ActorSystem``; ``None``: none, no lease looked
    at) holds the lease of the session folder ``folder`` now (its path as the host
    names it: a look in memory, no syscall): when it does, the lease is not let go until
    the block ends, so a write made in it lands while the host serves the session; when
    it does not (its loop stopped, the session maybe another host's now), the caller
    drops its write, ``what`` (named in a warning with the session). A folder no host of
    this process holds is written unless ``owner`` let its lease go (a new session's
    folder is leased from its first started call on: a call held before writes)."""
    path = str(folder)
    with _LOCK:
        lease = _HELD_AT.get(path)
        if owner is None:
            held = True
        elif lease is not None:  # held in this process: by this host, or by another now
            held = lease.owner is owner
        else:  # held by none here: this host writes unless it let it go (a session's folder not yet leased: yes)
            gone = _LET_GO.get(path)
            held = gone is None or gone() is not owner
        if held and lease is not None:
            _WRITERS[path] = _WRITERS.get(path, 0) + 1
    if lease is None or not held:
        if not held:
            logger.warning("session {}: {} not written: this host no longer holds the session's lease (its loop "
                           "stopped; the folder {} may be another host's now)", folder.name, what, folder)
        yield held
        return
    try:
        yield True
    finally:
        with _LOCK:
            left = _WRITERS.pop(path) - 1
            if left:
                _WRITERS[path] = left
            else:
                _WRITTEN.notify_all()


def _let_go(path: str, owner: object) -> None:
    """Remember (under ``_LOCK``) that ``owner`` let the lease of ``path`` go last."""
    try:
        _LET_GO[path] = weakref.ref(owner)
    except TypeError:  # an owner with no weak references (a bare object)
        _LET_GO[path] = lambda: owner
    if len(_LET_GO) > _MAX_LET_GO:
        for gone in [p for p, ref in _LET_GO.items() if ref() is None]:
            del _LET_GO[gone]


def lease_held_here(folder: Path) -> bool:
    """Whether this process holds the lease of ``folder`` (a session's)."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    with _LOCK:
        return (st.st_dev, st.st_ino) in _LEASES


def served(folder: Path) -> bool:
    """Whether a host (this process's or another's) holds the lease of ``folder`` now: a
    look that takes and lets go of its ``flock`` at once, holding nothing. Raises
    ``OSError`` when the folder cannot be opened."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                return True
            raise
        return False  # (closing the descriptor lets the flock go)
    finally:
        os.close(fd)


def flock_within(fd: int, wait_s: float) -> bool:
    """Take an exclusive ``flock`` of ``fd``, waiting up to ``wait_s`` seconds for another
    holder: whether it was taken. Raises ``OSError`` (not a busy one)."""
    until, delay = time.monotonic() + wait_s, 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in _BUSY:
                raise
            if time.monotonic() >= until:
                return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _holder(st: os.stat_result) -> int | None:
    """The pid holding the ``flock`` of the file of ``st``, as ``/proc/locks`` (Linux) lists
    it (the process that took it); ``None`` when it lists none."""
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                if "->" not in fields and len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode:
                    return int(fields[4]) if fields[4].isdigit() else None
    except OSError:
        pass
    return None


def _close_opening(fd: int) -> None:
    """Close ``fd``, a folder's being leased that was not taken (out of :data:`_OPENING`
    first: its number may be given again as soon as it is closed)."""
    with _LOCK:
        _OPENING.discard(fd)
    os.close(fd)


def _forked() -> None:
    """In a child forked without an exec: close its copies of this process's leases, so
    that it never keeps a session after its parent, the host, is gone (no lock taken: a
    thread of the parent may have held it as it forked)."""
    for lease in list(_LEASES.values()):
        fd, lease._fd, lease._key = lease._fd, None, None
        if fd is not None:
            try:
                os.close(fd)  # this copy only: the parent's flock stays (LOCK_UN would release it)
            except OSError:
                pass
    _LEASES.clear()
    _HELD_AT.clear()
    _WRITERS.clear()
    _LET_GO.clear()
    for fd in _OPENING:  # a lease being taken as it forked: its flock would be this child's too
        try:
            os.close(fd)
        except OSError:
            pass
    _OPENING.clear()


os.register_at_fork(after_in_child=_forked)
