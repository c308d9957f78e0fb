"""Each confined child's own uid, leased from a reserved range (DESIGN §5 "Confinement").

The kernel counts much per uid, not per process: queued signals, pipe buffers,
descriptors in flight over Unix sockets, epoll watches, processes (``RLIMIT_NPROC``),
and it lets a process of one uid read and set the scheduling attributes of every other
process of that uid. Children that all dropped to one uid (``nobody``) would share all
of it: one session's tool could exhaust a counter for every other session's, or time
another's use of it. So a root host gives every confined child a uid (and a gid of the
same number) of its own, from a :class:`UidRange` reserved for rho_actors
(:data:`DEFAULT_UID_RANGE` unless ``Confinement(uid_range=...)`` names another).

A uid is leased with :func:`lease` and held until :meth:`UidLease.release`, once the
child's whole tree is gone. Leases are ``flock`` locks on files in
``/run/rho-actors/uids`` (or the temporary folder's ``rho-actors-uids``), so the hosts on
one machine never lease one uid twice, and a host that dies releases its leases with it.
A uid is refused (the next one tried) while a process runs with it (other than this
host's own child holding its lease when the processes were read) or it owns an entry
of a shared writable folder (``/tmp``, ``/var/tmp``, ``/dev/shm``) other than a
rho_actors private folder: it belongs to someone else. Both are read once a minute
(reading them costs milliseconds, too much for every child); a child's own processes need
no such check: its lease is released only once none is left, a zombie not yet reaped
included (:meth:`~rho_actors.sandbox.confine.enclosure.Enclosure.remove`: its cgroup's
process count, or :func:`runs_process`). :func:`unavailable` says why a
host cannot use a range at all (not root; the password or group database names a uid of
it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import grp
import os
import pwd
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_UID_RANGE", "UidLease", "UidRange", "UidRangeExhausted", "lease", "runs_process", "unavailable",
]

_SHARED_FOLDERS: Final = ("/tmp", "/var/tmp", "/dev/shm")
_PRIVATE_PREFIX: Final = "rho-actors-"
_OWNERS_PERIOD_S: Final = 60.0


@dataclass(frozen=True)
class UidRange:
    """``count`` uids from ``first`` on (``first`` .. ``first + count - 1``), reserved for
    confined children. Raises ``ValueError`` for a range that is empty, includes uid 0
    or ``nobody`` (65534), or reaches past 4294967294."""

    first: int
    count: int

    def __post_init__(self) -> None:
        if type(self.first) is not int or type(self.count) is not int or self.first < 1 or self.count < 1:
            raise ValueError(f"UidRange({self.first!r}, {self.count!r}): give a first uid >= 1 and a count >= 1")
        if self.last > 2**32 - 2:
            raise ValueError(f"UidRange({self.first}, {self.count}) reaches past uid 4294967294")
        if self.first <= 65534 <= self.last:
            raise ValueError(f"UidRange({self.first}, {self.count}) includes nobody's uid 65534")

    @property
    def last(self) -> int:
        """The range's last uid."""
        return self.first + self.count - 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


DEFAULT_UID_RANGE: Final = UidRange(0x70000000, 65536)
"""1879048192-1879113727: the start of the band systemd's ``UIDS-GIDS.md`` leaves unused
(1879048192-2147483647), above the container ranges it assigns (524288-1879048191)."""


class UidRangeExhausted(OSError):
    """Every uid of the range is leased (or refused): no child can get one of its own."""


class UidLease:
    """One uid held for one confined child; :meth:`release` once its tree is gone."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd: int | None = fd
        self._lock = threading.Lock()

    def release(self) -> None:
        """Give the uid back (idempotent)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            with _held_lock:
                _held.discard(self.uid)
            os.close(fd)  # closing the only descriptor drops the flock

    def __repr__(self) -> str:
        return f"UidLease({self.uid}{'' if self._fd is not None else ', released'})"


@functools.cache
def unavailable(uids: UidRange) -> str | None:
    """Why this host cannot give children their own uids from ``uids`` (a sentence), or
    None. Checked once per range and process."""
    if os.geteuid() != 0:
        return f"the host runs as uid {os.geteuid()}, not root: its children cannot change uid"
    for entry in pwd.getpwall():
        if entry.pw_uid in uids:
            return f"the uid range {uids} holds uid {entry.pw_uid} of the password database ({entry.pw_name})"
    for group in grp.getgrall():
        if group.gr_gid in uids:
            return f"the uid range {uids} holds gid {group.gr_gid} of the group database ({group.gr_name})"
    try:
        _lease_folder()
    except OSError as exc:
        return f"no folder for uid leases: {exc}"
    return None


@functools.cache
def _lease_folder() -> str:
    for parent in ("/run", tempfile.gettempdir()):
        folder = os.path.join(parent, "rho-actors-uids" if parent != "/run" else "rho-actors/uids")
        with contextlib.suppress(OSError):
            os.makedirs(folder, mode=0o700, exist_ok=True)
            st = os.lstat(folder)
            if st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0 and os.path.isdir(folder):
                return folder
    raise OSError(errno.EACCES, "neither /run/rho-actors/uids nor a temporary folder is usable")


_held: set[int] = set()
"""The uids this host holds a lease on now: its own children run with them."""
_held_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _owners(uids: UidRange, period: int) -> frozenset[int]:
    """The uids of ``uids`` that run a process of someone else (visible here: a uid this
    host holds a lease on when it looks runs this host's own child, whose processes are
    gone before the lease is given back) or own an entry of a shared writable folder
    (not a rho_actors private folder); read once per range and ``period``."""
    owners = set()
    with _held_lock:
        ours = frozenset(_held)
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if (owner := entry.stat(follow_symlinks=False).st_uid) in uids and owner not in ours:
                        owners.add(owner)
    for folder in _SHARED_FOLDERS:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    owner = entry.stat(follow_symlinks=False).st_uid
                    if owner in uids and not entry.name.startswith(_PRIVATE_PREFIX):
                        owners.add(owner)
    return frozenset(owners)


def runs_process(uid: int) -> bool:
    """Whether a process of ``uid`` (real, effective or saved; a zombie too) shows in
    ``/proc`` now: a child without a cgroup is gone only once none does."""
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                with contextlib.suppress(OSError, StopIteration, ValueError), \
                        open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as status:
                    line = next(line for line in status if line.startswith("Uid:"))
                    if uid in {int(field) for field in line.split()[1:4]}:
                        return True
    return False


def lease(uids: UidRange) -> UidLease:
    """Lease a uid of ``uids`` that no other child (of this host or another on this
    machine) holds, that ran no process and owned no shared file when last looked (at
    most a minute ago); tried from the range's first uid on (so the leases stay few and
    dense). Raises :class:`UidRangeExhausted` when none is free, or ``OSError`` when the
    lease folder is unusable (:func:`unavailable` says so first)."""
    folder = _lease_folder()
    owners = _owners(uids, int(time.monotonic() // _OWNERS_PERIOD_S))
    with _held_lock:
        ours = frozenset(_held)  # leased by this host: their files are locked, no need to try them
    for uid in range(uids.first, uids.last + 1):
        if uid in owners or uid in ours:
            continue
        fd = os.open(os.path.join(folder, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        with _held_lock:
            _held.add(uid)
        return UidLease(uid, fd)
    raise UidRangeExhausted(errno.EUSERS, f"every uid of the range {uids} is leased or owned by someone else")
