"""What keeps :meth:`rho_actors.ActorSystem.stop`'s promises when its tree does not stop
in time, or when several threads stop the system at once (internal).

- :class:`StopOnce`: one stop runs at a time; a stop called while another runs waits
  for that one to end (it returned early before, with the tree still stopping and the
  worker processes alive), and a stop once one ended is a no-op. A stop that was
  interrupted (``KeyboardInterrupt``) did not end: the next one runs again. A stop called
  again in the thread running one (a host's signal handler calling ``stop()``, run by the
  main thread inside its own ``stop()``) runs at once, as it always did: it never waits
  for itself. A stop that finds the tree stopping already (after a stop that was
  interrupted) waits for its end as the first one did (:attr:`StopOnce.root_ended`): it
  returned at once, the tree's threads still running.
- :func:`end_workers`: the system's stop whose root did not stop within its
  ``timeout_s`` (its ``workers`` actor not yet stopped: a source or a session slow to
  stop before it, or ``timeout_s`` tiny or ``0``) shuts the isolations that own worker
  processes down itself, so that no worker process, cgroup or private folder outlives
  the stop (the ``workers`` actor, stopping later, finds them shut down); and it kills
  the processes the system's actors own (a stateful server's, an MCP server's:
  :mod:`rho_actors.otp.owned`), whose actors stop behind it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from loguru import logger

from rho_actors.isolation.base import Isolation
from rho_actors.otp.owned import OwnedProcesses
from rho_actors.sandbox import KILLED_REAP_S

__all__ = ["StopOnce", "end_workers"]


class StopOnce:
    """Runs a system's stop once, one caller at a time (the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # (re-entered by the thread that runs the stop: runs at once)
        self._ended = False
        self.root_ended = threading.Event()
        """Set when the system's root supervisor has ended (its ``on_stop`` done): a stop
        that finds the root stopping already (one interrupted before) waits for it."""

    def run(self, stop: Callable[[], None]) -> None:
        """``stop()`` unless a run of it ended; a caller arriving while it runs in another
        thread waits for it to end: as long as that run takes, which its own ``timeout_s``
        bounds (the waiting caller's ``timeout_s`` does not shorten it)."""
        with self._lock:
            if self._ended:
                return
            stop()
            self._ended = True


def end_workers(isolations: Iterable[Isolation], timeout_s: float, owned: OwnedProcesses) -> None:
    """Kill every process the system's actors own (``owned``: their reaping waited for
    :data:`~rho_actors.sandbox.exit_stop.KILLED_REAP_S` at most) and shut down, in this
    thread, every isolation but ``thread`` (which runs calls in this process: nothing of
    it outlives it), each within ``timeout_s`` seconds (a process pool's kill and reap
    take ``KILLED_REAP_S`` at least). Never raises an ``Exception`` (each failure is
    logged)."""
    owned.end_all(max(timeout_s, KILLED_REAP_S))
    for isolation in isolations:
        if isolation.name == "thread":
            continue
        try:
            isolation.shutdown(timeout_s)
        except Exception:
            logger.exception("stopping the system: shutting down isolation {!r} failed", isolation.name)
