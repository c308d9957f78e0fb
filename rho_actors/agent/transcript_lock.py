"""The locks of a session's transcript (DESIGN §4 "Approvals").

A prompt (or an MCP session) first takes the lock of the session's folder, the
transcript's directory (:func:`prompt_lock_of`): refused at once when another prompt
of this process holds it; within a host that holds the session's lease
(:mod:`~rho_actors.agent.session_lease`, the same ``flock`` of the folder, held while
the host serves the session) that is all, else the folder's ``flock`` is taken for the
prompt, refused after at most :data:`FORKED_WAIT_S` when another process holds it
(another prompt, or a host serving the session); then the transcript's own
lock (:func:`file_lock_of`); a brief writer (a decision, an approved call's result) takes only
the transcript's own, for a record or two, and a prompt waits for it at most
:data:`RECORD_WAIT_S`. Both are ``flock`` locks, released with their descriptor, by a
``kill -9`` too (the descriptors are close-on-exec, and rho's fork servers are started
by exec, never forked from a host).

An ``flock`` belongs to the open file, which every child forked from this process
shares until its exec: a host starting a process while a prompt runs (a subprocess, a
fork server) leaves the lock held by that child for the milliseconds until its exec, so
the prompt lock is waited for that long (:data:`FORKED_WAIT_S`) before a prompt is
refused as "in use by another prompt", and the transcript's own lock as a record being
written. Closing another descriptor of the file (a tool reading its session's folder)
releases neither, as it would a POSIX record lock. This process's prompt locks are also
kept in a set, so that a second prompt of this process is refused at once.

The prompt lock is the folder's, not a file's in it: the session's tools are given that
folder (``ctx["data_dir"]``), and a tool that removed or replaced a lock file there (one
clearing its folder) would let another process lock a new file of the same name and run
a second prompt beside the first; clearing a folder neither removes nor replaces it.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import Final

from rho_actors.agent.lines import TranscriptError
from rho_actors.agent.session_lease import FORKED_WAIT_S, flock_within, lease_held_here
from rho_actors.files import UnsafePathError, open_regular

__all__ = [
    "FORKED_WAIT_S",
    "KeptFile",
    "RECORD_WAIT_S",
    "PromptLock",
    "TranscriptBusyError",
    "file_lock_of",
    "prompt_held_here",
    "prompt_lock_of",
    "relock",
    "unlock",
]

RECORD_WAIT_S: Final = 30.0
"""How long (seconds) a prompt waits for a brief writer of the transcript."""

_HELD: set[str] = set()  # the real paths of the session folders whose prompt locks this process holds
_HELD_LOCK = threading.Lock()


class TranscriptBusyError(TranscriptError):
    """Another prompt (in this process or another) holds the session's transcript, or a
    decision or a result being recorded held it past ``RECORD_WAIT_S`` (30 s)."""


class PromptLock:
    """A prompt lock this process holds (:func:`prompt_lock_of`); :meth:`release` it once."""

    __slots__ = ("_fd", "_key")

    def __init__(self, fd: int | None, key: str) -> None:
        self._fd = fd  # None: the folder's flock is the lease this process holds
        self._key: str | None = key

    def release(self) -> None:
        """Release the lock and close its file, if it has one (idempotent)."""
        fd, key, self._fd, self._key = self._fd, self._key, None, None
        if fd is not None:
            os.close(fd)  # releases the flock (a forked child's copy: at its exec)
        if key is not None:
            _forget(key)


def _lock_prompt(folder: Path) -> PromptLock | None:
    """The session's prompt lock: its ``folder`` opened (a directory) under an exclusive
    ``flock``, or ``None`` when a prompt holds it: of this process (answered at once), or
    of another, still holding it after :data:`FORKED_WAIT_S` (a child this process forked
    holds it only until its exec: see the module doc). Raises ``OSError`` (``ENOTDIR``
    for a folder that is no directory)."""
    key = os.path.realpath(folder)
    with _HELD_LOCK:  # a prompt of this process: refused at once, the folder never opened
        if key in _HELD:
            return None
        _HELD.add(key)
    try:
        if lease_held_here(folder):  # the host serving the session: its lease is the folder's flock
            return PromptLock(None, key)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if not flock_within(fd, FORKED_WAIT_S):  # another process's prompt (or host) holds it
            os.close(fd)
            _forget(key)
            return None
    except BaseException:
        _forget(key)
        raise
    return PromptLock(fd, key)


def _forget(key: str) -> None:
    with _HELD_LOCK:
        _HELD.discard(key)


def prompt_held_here(transcript: Path) -> bool:
    """Whether a prompt of this process holds the session whose transcript is at
    ``transcript`` (the lock of its folder)."""
    with _HELD_LOCK:
        return os.path.realpath(transcript.parent) in _HELD


def _lock(path: Path, wait_s: float, flags: int = 0) -> int | None:
    """The regular file at ``path`` opened read-write (created, mode 0600; ``flags``
    added: ``os.O_APPEND``) under an exclusive ``flock``, waiting up to ``wait_s``
    seconds for another holder; ``None`` when it still holds it. Raises
    :class:`~rho_actors.files.UnsafePathError` for a symlink or a file that is not
    regular, and ``OSError``."""
    fd = open_regular(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
    try:
        if flock_within(fd, wait_s):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def prompt_lock_of(transcript: Path) -> PromptLock:
    """The prompt lock of the session whose transcript is at ``transcript`` (the lock of
    its folder). Raises :class:`TranscriptBusyError` when a prompt holds it,
    :class:`TranscriptError` when the folder is no directory, and ``OSError``."""
    try:
        held = _lock_prompt(transcript.parent)
    except NotADirectoryError as exc:
        raise TranscriptError(f"transcript {transcript} cannot be used: {exc}") from None
    if held is None:
        raise TranscriptBusyError(f"transcript {transcript} is in use by another prompt of this session "
                                  "(or another host serves the session)")
    return held


def file_lock_of(transcript: Path, wait_s: float, flags: int = 0) -> int:
    """The transcript at ``transcript`` opened under its own ``flock``, waiting
    up to ``wait_s`` seconds: its descriptor. Raises :class:`TranscriptBusyError` when it
    is still held (0 s: by another prompt; else by a brief writer), :class:`TranscriptError`
    when it cannot be used, and ``OSError``."""
    try:
        fd = _lock(transcript, wait_s, flags)
    except UnsafePathError as exc:
        raise TranscriptError(f"transcript {transcript} cannot be used: {exc}") from None
    if fd is None:
        raise _busy(transcript, wait_s)
    return fd


def relock(fd: int, transcript: Path, wait_s: float) -> None:
    """Take the ``flock`` of the transcript at ``transcript`` again on ``fd``, a
    descriptor :func:`file_lock_of` gave and :func:`unlock` let go (a writer that keeps
    its file open between records), waiting up to ``wait_s`` seconds. Raises
    :class:`TranscriptBusyError` as :func:`file_lock_of` does, and ``OSError``."""
    if not flock_within(fd, wait_s):
        raise _busy(transcript, wait_s)


class KeptFile:
    """A transcript's file kept open between records, its lock let go (a writer opened
    ``per_record``): a record or a sync :meth:`borrow`-s it and gives it back;
    :meth:`close` never waits for a borrower, the last of which closes it."""

    __slots__ = ("_closed", "_fd", "_lock", "_users")

    def __init__(self, fd: int) -> None:
        self._fd, self._users, self._closed, self._lock = fd, 0, False, threading.Lock()

    def borrow(self) -> int | None:
        """The file's descriptor, in use until :meth:`give_back`; None once closed."""
        with self._lock:
            if self._closed:
                return None
            self._users += 1
            return self._fd

    def give_back(self) -> None:
        """What :meth:`borrow` gave is no longer used: closed if this was its last user after :meth:`close`."""
        with self._lock:
            self._users -= 1
            last = self._closed and not self._users
        if last:
            os.close(self._fd)

    def close(self) -> None:
        """Close the file now, or once its borrowers gave it back (idempotent)."""
        with self._lock:
            now = not self._closed and not self._users
            self._closed = True
        if now:
            os.close(self._fd)


def unlock(fd: int) -> None:
    """Let go of the ``flock`` held on ``fd``, its file kept open (:func:`relock`)."""
    fcntl.flock(fd, fcntl.LOCK_UN)


def _busy(transcript: Path, wait_s: float) -> TranscriptBusyError:
    return TranscriptBusyError(
        f"transcript {transcript} is in use by another prompt of this session" if not wait_s else
        f"transcript {transcript} is held by a decision or a result being recorded (by this host or another "
        f"process) for more than {wait_s:g} s; try again once it is written")
