"""Group commit: transcripts' records synced together, within a bounded delay.

A writer that does not wait for its record's ``fdatasync`` (``synchronous_commit`` off,
PostgreSQL's term: :func:`rho_actors.mcp.serve`'s option) writes the record to the OS
(``os.write``: a crash of the process loses nothing) and hands its transcript to a
:class:`GroupCommit`, whose one thread syncs every transcript written since its last
sync at most ``delay_s`` after the first of those writes (PostgreSQL's ``commit_delay``
for a group of commits): records written close together share one ``fdatasync``. A
power loss may lose the records of the last ``delay_s`` plus one sync's time, whole
records from the end only (a torn last line is cut away when the transcript is read:
:mod:`rho_actors.agent.transcript`), never the transcript itself.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from loguru import logger

from rho_actors.encoding import describe_exception

__all__ = ["DEFAULT_COMMIT_DELAY_S", "GroupCommit"]

DEFAULT_COMMIT_DELAY_S = 0.02
"""How long a record written with ``synchronous_commit`` off may wait for its sync: 20 ms."""


class GroupCommit:
    """Syncs the transcripts handed to :meth:`written`, each at most ``delay_s`` seconds
    after its first unsynced record, in one daemon thread started on first use.
    :meth:`flush` syncs one now; :meth:`close` syncs all and stops the thread. A sync
    that fails (``OSError``) is logged: the records stay written, as a process killed
    would leave them."""

    def __init__(self, delay_s: float = DEFAULT_COMMIT_DELAY_S) -> None:
        if not delay_s >= 0:
            raise ValueError(f"delay_s must be a number of seconds >= 0, got {delay_s!r}")
        self.delay_s = delay_s
        self.syncs = 0  # fdatasync calls made, for the curious (and the tests)
        self._dirty: dict[Any, float] = {}  # transcript -> when its first unsynced record was written
        self._syncing: set[Any] = set()  # the transcripts the thread is syncing now
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def written(self, transcript: Any) -> None:
        """``transcript`` (a :class:`~rho_actors.agent.transcript.Transcript`) has a record
        written and not synced: sync it within the delay. After :meth:`close`, synced now."""
        with self._wake:
            if self._closed:
                closed = True
            else:
                closed = False
                if transcript not in self._dirty:
                    self._dirty[transcript] = time.monotonic()
                    if self._thread is None:
                        self._thread = threading.Thread(target=self._run, name="rho-group-commit", daemon=True)
                        self._thread.start()
                    self._wake.notify()
        if closed:
            self._sync(transcript)

    def flush(self, transcript: Any) -> None:
        """Sync ``transcript`` now if it has records not synced yet (before it is closed);
        a sync of it the thread has begun is waited for (the caller may close it next)."""
        with self._wake:
            pending = self._dirty.pop(transcript, None) is not None
            self._wake.wait_for(lambda: transcript not in self._syncing)
        if pending:
            self._sync(transcript)

    def close(self) -> None:
        """Sync every transcript with records not synced yet and stop the thread (idempotent)."""
        with self._wake:
            self._closed = True
            dirty, self._dirty = list(self._dirty), {}
            thread, self._thread = self._thread, None
            self._wake.notify()
        for transcript in dirty:
            self._sync(transcript)
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._dirty and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                due = min(self._dirty.values()) + self.delay_s
                now = time.monotonic()
                if now < due:  # gather what else is written meanwhile
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
