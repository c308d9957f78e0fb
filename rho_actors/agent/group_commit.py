"""Group commit: transcripts' records synced together, within a bounded delay.

A writer that does not wait for its record's ``fdatasync`` (``synchronous_commit`` off,
PostgreSQL's term: :func:`rho_actors.mcp.serve`'s option) writes the record to the OS
(``os.write``: a crash of the process loses nothing) and hands its transcript to a
:class:`GroupCommit`, whose one thread syncs every transcript written since its last
sync at most ``delay_s`` after the first of those writes (PostgreSQL's WAL writer,
which flushes every ``wal_writer_delay``: 200 ms by default, :data:`DEFAULT_WAL_WRITER_DELAY_MS`):
records written close together share one ``fdatasync``. A power loss may lose the
records of the last ``delay_s`` plus one sync's time, whole records from the end only
(a torn last line is cut away when the transcript is read:
:mod:`rho_actors.agent.transcript`), never the transcript itself.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from loguru import logger

from rho_actors.encoding import describe_exception

__all__ = ["DEFAULT_SYNC_WAIT_S", "DEFAULT_WAL_WRITER_DELAY_MS", "WAL_WRITER_DELAY_RANGE_MS", "GroupCommit",
           "wal_writer_delay_s"]

DEFAULT_WAL_WRITER_DELAY_MS = 200
"""How long a record written with ``synchronous_commit`` off may wait for its sync, in
milliseconds: PostgreSQL's ``wal_writer_delay`` and its default."""
WAL_WRITER_DELAY_RANGE_MS = (1, 10_000)
"""The ``wal_writer_delay`` taken, in milliseconds (PostgreSQL's range)."""

DEFAULT_SYNC_WAIT_S = 5.0
"""How long :meth:`GroupCommit.flush` and :meth:`GroupCommit.close` wait for the syncs they
ask for (seconds): a disk that stopped answering holds a session's close and the server's
stop no longer (its records are written to the OS: a crash of rho loses nothing)."""


def wal_writer_delay_s(delay_ms: float) -> float:
    """``delay_ms``, a ``wal_writer_delay`` in milliseconds, in seconds. Raises
    ``ValueError`` naming it when it is not a number from 1 to 10000
    (:data:`WAL_WRITER_DELAY_RANGE_MS`)."""
    low, high = WAL_WRITER_DELAY_RANGE_MS
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, (int, float)) or not low <= delay_ms <= high:
        raise ValueError(f"wal_writer_delay_ms must be a number of milliseconds from {low} to {high}, "
                         f"got {delay_ms!r}")
    return delay_ms / 1000


class GroupCommit:
    """Syncs the transcripts handed to :meth:`written`, each at most ``delay_s`` seconds
    after its first unsynced record, in one daemon thread started on first use.
    :meth:`flush` has one synced now; :meth:`close` has all synced and stops the thread;
    both wait at most ``wait_s`` seconds for it (a sync not ended then is logged and
    left to the thread, which makes it once the disk answers). A sync that fails is
    logged: the records stay written, as a process killed would leave them. Raises
    ``ValueError`` for a negative ``delay_s`` or ``wait_s``."""

    def __init__(self, delay_s: float = DEFAULT_WAL_WRITER_DELAY_MS / 1000,
                 wait_s: float = DEFAULT_SYNC_WAIT_S) -> None:
        if not delay_s >= 0:
            raise ValueError(f"delay_s must be a number of seconds >= 0, got {delay_s!r}")
        if not wait_s >= 0:
            raise ValueError(f"wait_s must be a number of seconds >= 0, got {wait_s!r}")
        self.delay_s = delay_s
        self.wait_s = wait_s
        self.syncs = 0  # fdatasync calls made, for the curious (and the tests)
        self._dirty: dict[Any, float] = {}  # transcript -> when its first unsynced record was written
        self._syncing: set[Any] = set()  # the transcripts the thread is syncing now
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def written(self, transcript: Any) -> None:
        """``transcript`` (a :class:`~rho_actors.agent.transcript.Transcript`) has a record
        written and not synced: sync it within the delay. After :meth:`close`, or when
        the thread cannot be started (the host at its thread limit), synced now."""
        with self._wake:
            now = self._closed
            if not now and transcript not in self._dirty:
                if self._thread is None:
                    thread = threading.Thread(target=self._run, name="rho-group-commit", daemon=True)
                    try:
                        thread.start()
                    except RuntimeError:  # no thread: its writer syncs it; a later record tries again
                        now = True
                    else:
                        self._thread = thread
                if not now:
                    self._dirty[transcript] = time.monotonic()
                    self._wake.notify()
        if now:
            self._sync(transcript)

    def flush(self, transcript: Any) -> None:
        """Have ``transcript``'s records not synced yet synced now (before it is closed),
        by the thread, and wait for that sync, and for one of it the thread has begun, at
        most :attr:`wait_s` seconds (then logged: the caller may close it, the thread
        syncs it by its path once the disk answers)."""
        with self._wake:
            if transcript in self._dirty:
                self._dirty[transcript] = -math.inf  # due now
                self._wake.notify_all()
            elif transcript not in self._syncing:
                return
            if self._wake.wait_for(lambda: transcript not in self._dirty and transcript not in self._syncing,
                                   self.wait_s):
                return
        logger.warning("transcript {} not synced within {} s (the disk is slow or stalled): the session goes on "
                       "closing, its records written to the OS and synced once the disk answers",
                       transcript.path, self.wait_s)

    def close(self) -> None:
        """Have every transcript with records not synced yet synced now and stop the
        thread, waiting at most :attr:`wait_s` seconds for it (then logged, the thread
        left to end on its own once the disk answers; idempotent)."""
        with self._wake:
            self._closed = True
            thread = self._thread
            self._wake.notify_all()
        if thread is None:
            return
        thread.join(self.wait_s)
        if thread.is_alive():
            with self._wake:
                left = len(self._dirty) + len(self._syncing)
            logger.warning("{} transcript(s) not synced within {} s (the disk is slow or stalled): the group commit "
                           "stops waiting, its thread syncs them once the disk answers", left, self.wait_s)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._dirty and not self._closed:
                    self._wake.wait()
                if not self._dirty:  # closed, every transcript synced
                    return
                due = min(self._dirty.values()) + self.delay_s
                now = time.monotonic()
                if now < due and not self._closed:  # gather what else is written meanwhile
                    self._wake.wait(due - now)
                    continue
                dirty, self._dirty = list(self._dirty), {}
                self._syncing.update(dirty)
            for transcript in dirty:
                try:
                    self._sync(transcript)
                finally:
                    with self._wake:
                        self._syncing.discard(transcript)
                        self._wake.notify_all()

    def _sync(self, transcript: Any) -> None:
        try:
            transcript.sync()
        except Exception as exc:  # logged; the thread goes on syncing the server's other sessions
            logger.warning("transcript {} not synced: {}", transcript.path, describe_exception(exc))
        else:
            with self._wake:
                self.syncs += 1
