"""The OS processes a system's actors own (internal): a stateful server's process, a stdio
MCP server's, an untrusted gateway's confined server. Erlang kills a port with the
process that owns it; here an actor ends its own processes as it stops, but a system's
stop that cannot wait for its tree (``ActorSystem.stop(0)``, a tree past ``timeout_s``)
returns while those actors still stop behind it, so each such process is also entered
in its system's :class:`OwnedProcesses`, which the stop ends at once
(:meth:`OwnedProcesses.end_all`): no child process outlives the stop. Each is held by
a pidfd its owner opened as it started it (:mod:`rho_actors.otp.pidfds`): the stop
kills through it and waits until it is reaped (not until its pid left ``/proc``, which
a process given the pid since never does), and an owner discards its entry only once it
reaped the process itself, so a stop that found it entered waits for that reap.

How an actor finds its system's ledger: a system makes its root supervisor, and
``HostActors.start_child`` its subtrees, inside :meth:`OwnedProcesses.starting`; a
supervisor made there keeps the ledger (:func:`owner_now`, read as it is made) and starts
each child inside it again, so every actor made under it, restarts included, reads it in
its ``__init__`` (pykka makes an actor in the starting thread). An actor's own thread
that starts processes runs inside it too (:func:`owning`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable

from loguru import logger

from rho_actors.otp.pidfds import PidFd, wait_all_reaped

__all__ = ["OwnedProcesses", "owner_now", "owning"]

_here = threading.local()


class OwnedProcesses:
    """The processes one system's actors own now, each held by a pidfd
    (:class:`~rho_actors.otp.pidfds.PidFd`: never another process given its pid since)
    with how to kill it at once (SIGKILL to its tree or group: never blocking, never
    reaping). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kills: dict[int, tuple[str, PidFd, Callable[[], None]]] = {}  # token -> (what, its pidfd, kill)
        self._tokens = itertools.count()
        self._ended = False

    def starting(self) -> contextlib.AbstractContextManager[None]:
        """In this thread meanwhile, :func:`owner_now` is this ledger."""
        return owning(self)

    def add(self, process: PidFd, kill: Callable[[], None], what: str = "process") -> int:
        """Enter ``process`` (its owner's pidfd of it, opened as it started it; the ledger
        keeps a copy of its own), killed by ``kill()``, named ``what`` in a log line; the
        token to :meth:`discard` it with once its owner reaped it. Once :meth:`end_all`
        ran (the system stopped), it is killed here at once (an actor still starting
        behind the stop started it)."""
        held = process.dup()
        with self._lock:
            if not self._ended:
                token = next(self._tokens)
                self._kills[token] = (what, held, kill)
                return token
        _kill(held.pid, kill)
        held.close()
        return -1

    def discard(self, token: int) -> None:
        """Its owner ended the process of ``token`` and reaped it (or gave up on it): forget it."""
        with self._lock:
            entry = self._kills.pop(token, None)
        if entry is not None:
            entry[1].close()

    def end_all(self, wait_s: float) -> list[int]:
        """Kill every process entered and not discarded, and from now on each entered
        (:meth:`add`); wait, at most ``wait_s`` seconds, until each is reaped (by its
        parent: this process's child watcher, or the fork server that started it), by
        its pidfd: a process reaped before (its pid another's now) is neither killed nor
        waited for. The pids not reaped by then, named in one warning and returned.
        Never raises."""
        with self._lock:
            self._ended = True
            kills, self._kills = list(self._kills.values()), {}
        try:
            for _, process, kill in kills:
                _kill(process.pid, kill)
            left = wait_all_reaped([(what, process) for what, process, _ in kills], wait_s, "stopping the system")
        finally:
            for _, process, _ in kills:
                process.close()
        return [pid for _, pid in left]


def _kill(pid: int, kill: Callable[[], None]) -> None:
    try:
        kill()
    except Exception:
        logger.exception("stopping the system: killing process {} failed", pid)


def owner_now() -> OwnedProcesses | None:
    """The ledger of the system whose actor is being made in this thread (or whose
    actor's thread this is), else None."""
    owner: OwnedProcesses | None = getattr(_here, "owner", None)
    return owner


def owning(owner: OwnedProcesses | None) -> contextlib.AbstractContextManager[None]:
    """In this thread meanwhile, :func:`owner_now` is ``owner`` (None: unchanged)."""
    return _Owning(owner)


class _Owning:
    """:func:`owning`'s context: a class, not a generator's (``contextlib.contextmanager``:
    ~10k instructions a use against ~3k, once in every session's start)."""

    __slots__ = ("_before", "_owner")

    def __init__(self, owner: OwnedProcesses | None) -> None:
        self._owner = owner
        self._before: OwnedProcesses | None = None

    def __enter__(self) -> None:
        if self._owner is not None:
            self._before = getattr(_here, "owner", None)
            _here.owner = self._owner

    def __exit__(self, *exc_info: object) -> None:
        if self._owner is not None:
            _here.owner = self._before
