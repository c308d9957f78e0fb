"""Worker pools stopped as the host's interpreter exits (internal): a host that exits
without :meth:`~rho_actors.sandbox.pool.WorkerPool.stop` (or while a stop's owners were
still closing workers) left each worker's cgroup and private folder behind until some
later start on the machine swept them; a pool's finalizer kills its process groups only.
:func:`stopped_at_exit` enrols a pool (and takes it out once stopped); an ``atexit``
handler stops every pool still enrolled, within :data:`KILLED_REAP_S` each, in the
process that made it only (a forked child's copy holds its parent's workers: a child
starts with none enrolled, and with a lock of its own, the one it copied maybe held for
ever by a thread of its parent enrolling a pool at the fork)."""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any, Final

__all__ = ["KILLED_REAP_S", "stopped_at_exit"]

KILLED_REAP_S: Final = 2.0
"""How long :meth:`WorkerPool.stop <rho_actors.sandbox.pool.WorkerPool.stop>` waits at
least for its killed workers' ends and closes (a worker not closed leaves its cgroup and
private folder to the next start's sweep)."""

_running: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # pool -> the pid that made it
_lock = threading.Lock()


def stopped_at_exit(pool: Any, enrol: bool = True) -> None:
    """Enrol ``pool`` (anything with ``stop(timeout_s)``, held weakly) to be stopped at exit, or
    (``enrol=False``) take it out: it was stopped."""
    with _lock:
        if enrol:
            _running[pool] = os.getpid()
        else:
            _running.pop(pool, None)


def _forked() -> None:
    _lock._at_fork_reinit()  # type: ignore[attr-defined]  # the parent's copy may be held by a thread not here
    _running.clear()  # its parent's pools: never the child's to stop


os.register_at_fork(after_in_child=_forked)


@atexit.register
def _stop_running() -> None:
    with _lock:
        pools = [pool for pool, pid in list(_running.items()) if pid == os.getpid()]
        _running.clear()
    for pool in pools:
        pool.stop(KILLED_REAP_S)
