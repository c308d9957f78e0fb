"""A background loop's failures that repeat round after round (internal): a worker
pool's keeper whose starts fail (the host at its thread or process limit, a cgroup that
cannot be made), the Ray node watcher whose rounds raise, the MCP server's reaper of
absent sessions and its announcer of tool-list changes, an MCP server's stderr reader.

Such a loop logs and goes on (it must not end: DESIGN §5), but a failure that comes back
every round logged every round floods the log (a keeper at the host's thread limit
wrote a 2.5 KB traceback twice a second, for ever) and, where each round costs
something (a worker process started and killed), spins. A :class:`FailureRun` counts a
run of failures in a row: the loop logs the failures whose number in the run is a power of
two (the 1st with its traceback, then the 2nd, 4th, 8th...: ``log2(n) + 1`` records for
``n`` failures, each saying how many so far), waits a growing pause before it tries
again when it has to (``first_s`` doubled each failure, at most ``max_s``), and logs
once when a round passes again, which ends the run.
"""

from __future__ import annotations

import threading

from loguru import logger

__all__ = ["FailureRun"]


class FailureRun:
    """The failures in a row of one background loop (the module doc). Thread-safe."""

    def __init__(self, what: str, first_s: float = 0.5, max_s: float = 30.0) -> None:
        self.what = what
        self.first_s = first_s
        self.max_s = max_s
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        """The failures in the run now (0: the last round passed)."""
        with self._lock:
            return self._count

    def failed(self) -> tuple[int, float]:
        """One more failure: its number in the run and the pause before the next try
        (``first_s`` doubled per failure before it, at most ``max_s``)."""
        with self._lock:
            self._count += 1
            count = self._count
        return count, min(self.max_s, self.first_s * 2.0 ** min(count - 1, 64))

    def next_logged(self) -> bool:
        """Whether the next failure (:meth:`failed`) is one to log: its number a power of two."""
        with self._lock:
            return self.logged(self._count + 1)

    @staticmethod
    def logged(count: int) -> bool:
        """Whether failure number ``count`` of a run is logged: 1, 2, 4, 8..."""
        return count > 0 and count & (count - 1) == 0

    @staticmethod
    def so_far(count: int) -> str:
        """What a logged failure adds to its message: nothing for the first, else how many
        failed in a row (the next logged at twice as many)."""
        return "" if count <= 1 else f" ({count} failures in a row; the next logged at {2 * count})"

    def log_failed(self, message: str, *args: object) -> float:
        """One more failure, raised in the ``except`` block calling this: logged with its
        traceback when its number in the run is a power of two (``message`` formatted
        with ``args``, as loguru does, plus :meth:`so_far`); the pause before the next try."""
        count, pause = self.failed()
        if self.logged(count):
            logger.opt(depth=1).exception(message + "{}", *args, self.so_far(count))
        return pause

    def passed(self) -> int:
        """A round passed: the run ends (logged when it had more than one failure); how
        many failures it had."""
        with self._lock:
            count, self._count = self._count, 0
        if count > 1:
            logger.info("{}: a round passed again after {} failures in a row", self.what, count)
        return count
