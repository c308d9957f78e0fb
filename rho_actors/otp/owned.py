"""The OS processes a system's actors own (internal): a stateful server's process, a stdio
MCP server's, an untrusted gateway's confined server. Erlang kills a port with the
process that owns it; here an actor ends its own processes as it stops, but a system's
stop that cannot wait for its tree (``ActorSystem.stop(0)``, a tree past ``timeout_s``)
returns while those actors still stop behind it, so each such process is also entered
in its system's :class:`OwnedProcesses`, which the stop ends at once
(:meth:`OwnedProcesses.end_all`): no child process outlives the stop.

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
import os
import threading
import time
from collections.abc import Callable

from loguru import logger

__all__ = ["OwnedProcesses", "owner_now", "owning"]

_here = threading.local()


class OwnedProcesses:
    """The processes one system's actors own now, each with how to kill it at once
    (SIGKILL to its tree or group: never blocking, never reaping). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kills: dict[int, tuple[int, Callable[[], None]]] = {}  # token -> (pid, kill)
        self._tokens = itertools.count()
        self._ended = False

    def starting(self) -> contextlib.AbstractContextManager[None]:
        """In this thread meanwhile, :func:`owner_now` is this ledger."""
        return owning(self)

    def add(self, pid: int, kill: Callable[[], None]) -> int:
        """Enter process ``pid``, killed by ``kill()``; the token to :meth:`discard` it
        with once its owner ended it. Once :meth:`end_all` ran (the system stopped), it is
        killed here at once (an actor still starting behind the stop started it)."""
        with self._lock:
            if not self._ended:
                token = next(self._tokens)
                self._kills[token] = (pid, kill)
                return token
        _kill(pid, kill)
        return -1

    def discard(self, token: int) -> None:
        """Its owner ended the process of ``token`` (or is about to): forget it."""
        with self._lock:
            self._kills.pop(token, None)

    def end_all(self, wait_s: float) -> list[int]:
        """Kill every process entered and not discarded, and from now on each entered
        (:meth:`add`); wait, at most ``wait_s`` seconds, until no process has their pids
        (killed, then reaped by their parents: this process's child watcher, or the fork
        server that started them). The pids still there by then, logged. Never raises."""
        with self._lock:
            self._ended = True
            kills, self._kills = list(self._kills.values()), {}
        for pid, kill in kills:
            _kill(pid, kill)
        until = time.monotonic() + wait_s
        left = [pid for pid, _ in kills]
        while left:
            left = [pid for pid in left if os.path.exists(f"/proc/{pid}")]
            if not left or time.monotonic() >= until:
                break
            time.sleep(0.005)
        if left:
            logger.warning("stopping the system: processes {} were killed but not reaped within {} s", left, wait_s)
        return left


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
