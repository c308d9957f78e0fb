"""Tools loaded ahead into a worker pool's idle workers (DESIGN §5 "Starting a worker";
internal): :class:`ToolsAhead`, the half of :class:`~rho_actors.sandbox.warm_workers.WarmWorkers`
that sends a trusted pool's registered tools to its workers before their calls
(:meth:`ToolsAhead.preload`), one worker trying a tool first, then every other.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any, Final, Literal

from loguru import logger

from rho_actors.sandbox import wire
from rho_actors.sandbox.channel import DeadlineReached, Malformed
from rho_actors.sandbox.shipping import ShippedTools, Unshippable
from rho_actors.sandbox.slots import WorkerSlots
from rho_actors.sandbox.worker import TOOL_CACHE_SIZE
from rho_actors.sandbox.worker_handle import WorkerHandle

__all__ = ["ToolsAhead"]

_LOAD_TIMEOUT_S: Final = 30.0
"""How long sending a tool ahead to a worker may take (seconds): as long as a worker's
start (``warm_workers._READY_TIMEOUT_S``), since a tool's load is an import too (a heavy
one, torch or a large app, takes seconds on a busy machine, and a tool over its bound is
loaded ahead no more)."""


class ToolsAhead:
    """Tools loaded ahead (see the module doc); :class:`~rho_actors.sandbox.pool.WorkerPool`
    sets every attribute below in its ``__init__``."""

    _scoped: bool
    _slots: WorkerSlots | None
    _lock: threading.Lock
    _warmed: threading.Condition
    _all: set[WorkerHandle]
    _idle: list[WorkerHandle]
    _stopped: bool
    _counts: dict[str, int]
    _shipped: ShippedTools
    _preloads: OrderedDict[bytes, bytes]
    _preload_keys: dict[Hashable, bytes]
    _proven: set[bytes]
    _trying: set[bytes]

    def _retire(self, worker: WorkerHandle) -> None:
        raise NotImplementedError

    def _idle_locked(self, worker: WorkerHandle, *, since: float | None = None) -> None:
        """Put ``worker`` among the idle ones (holding the lock; ``since``: a new
        ``idle_since``, a ``time.monotonic()`` instant, else its own kept) and wake who
        waits for one: :meth:`wait_warm`'s callers and a call waiting for its place."""
        if since is not None:
            worker.idle_since = since
        worker.pace(busy=False)
        self._idle.append(worker)
        self._warmed.notify_all()
        if self._slots is not None:
            self._slots.poke()  # a call waiting for a worker may take it now

    def _lose(self, worker: WorkerHandle, how: Literal["killed", "died"]) -> None:
        raise NotImplementedError

    def preload(self, tool: Any, version: object = None, key: Hashable = None) -> bool:
        """Load ``tool`` ahead of its calls (a trusted pool's registered tool; ``key``
        names it for :meth:`unload`): pickled now as a call ships it (once per
        ``version``), then sent (a ``LOAD`` frame, answered ``LOADED``) first to one idle
        worker alone, and once that worker has loaded it, to every other idle worker and
        to every new worker before it goes idle, so its first call finds it held. A tool
        loaded by no worker yet is tried by one worker at a time (one whose load hangs
        holds that worker only, never another tool's loads). The latest
        :data:`~rho_actors.sandbox.worker.TOOL_CACHE_SIZE` tools are kept. Whether it was
        loaded (``False``: a scoped pool, whose spares serve any scope, never holds a
        tool ahead; a tool that cannot be pickled, whose calls then say why)."""
        if self._scoped:
            return False
        try:
            digest, tool_bytes = self._shipped.ship(tool, version)
        except Unshippable:
            return False
        with self._lock:
            if self._stopped:
                return False
            if key is not None:
                self._preload_keys[key] = digest
            self._preloads[digest] = tool_bytes
            self._preloads.move_to_end(digest)
            while len(self._preloads) > TOOL_CACHE_SIZE:
                self._drop_preload_locked(next(iter(self._preloads)))
        self._spread()
        return True

    def unload(self, keys: Iterable[Hashable]) -> None:
        """Load the tools :meth:`preload` was given under ``keys`` (unregistered) ahead no
        more: no new worker loads them (workers holding one keep it until it is the
        least recently used of their :data:`~rho_actors.sandbox.worker.TOOL_CACHE_SIZE`)."""
        with self._lock:
            for key in keys:
                digest = self._preload_keys.pop(key, None)
                if digest is not None and digest not in self._preload_keys.values():
                    self._drop_preload_locked(digest)

    def _drop_preload_locked(self, digest: bytes) -> None:
        self._preloads.pop(digest, None)
        self._proven.discard(digest)
        for key in [k for k, d in self._preload_keys.items() if d == digest]:
            del self._preload_keys[key]

    def _next_load_locked(self, worker: WorkerHandle, tries: bool, peek: bool = False) -> tuple[bytes, bytes] | None:
        """The next tool loaded ahead that ``worker`` lacks: one some worker has loaded
        (oldest first), else (``tries``) one no worker has loaded and none is trying now,
        which it then tries (not when ``peek``); ``None``: none."""
        first: tuple[bytes, bytes] | None = None
        for digest, tool_bytes in self._preloads.items():
            if digest in worker.tools:
                continue
            if digest in self._proven:
                return digest, tool_bytes
            if first is None and tries and digest not in self._trying:
                first = digest, tool_bytes
        if first is not None and not peek:
            self._trying.add(first[0])
        return first

    def _spread(self) -> None:
        """Send the tools loaded ahead to the idle workers lacking one (see
        :meth:`preload`), one worker at a time, each back to idle once it holds them
        (lost if a load failed)."""
        while True:
            with self._lock:
                if self._stopped:
                    return
                worker = next((w for w in self._idle if self._next_load_locked(w, True, peek=True) is not None),
                              None)
                if worker is None:
                    return
                self._idle.remove(worker)
            try:
                while True:
                    self._load_into(worker, tries=True)
                    with self._lock:
                        if self._next_load_locked(worker, True, peek=True) is not None:
                            continue
                        if worker in self._all and not self._stopped:
                            self._idle_locked(worker)  # back from its loads: idle since as before
                            break
                    self._retire(worker)
                    break
            except (DeadlineReached, EOFError, Malformed):
                self._lose(worker, "died")
            except BaseException:  # interrupted (preload runs in its caller's thread): its LOAD may be half sent
                self._lose(worker, "killed")
                raise

    def _load_into(self, worker: WorkerHandle, tries: bool) -> bool:
        """Send ``worker`` (not idle: no call may write to it meanwhile) the tools loaded
        ahead that it lacks (:meth:`_next_load_locked`), each answered ``LOADED`` within
        :data:`_LOAD_TIMEOUT_S`; whether it loaded one no worker had loaded before. A
        tool whose load killed the worker or outlasted that is no longer loaded ahead
        (its own calls ship it and say what it does: no other tool's call meets it).
        Raises ``DeadlineReached``, ``EOFError`` or ``Malformed`` (the worker is lost)."""
        proved = False
        while True:
            with self._lock:
                found = self._next_load_locked(worker, tries)
                first = found is not None and found[0] not in self._proven
            if found is None:
                return proved
            digest, tool_bytes = found
            deadline = time.monotonic() + _LOAD_TIMEOUT_S
            worker.ran_code = True  # its code may run there now (unpickled): OpenCall.may_have_begun
            try:
                worker.channel.send(wire.LOAD, pickle.dumps((digest, tool_bytes)), deadline)
                if worker.channel.recv(deadline, wire.MAX_REPLY_BYTES) != (wire.LOADED, b""):
                    raise Malformed("a worker answered a LOAD frame with something else")
            except (DeadlineReached, EOFError, Malformed):
                with self._lock:
                    self._trying.discard(digest)
                    self._drop_preload_locked(digest)
                logger.warning("a process tool loaded ahead killed its worker or took over {} s to load: it is "
                               "no longer loaded ahead of its calls", _LOAD_TIMEOUT_S)
                raise
            worker.tools[digest] = None
            worker.tools.move_to_end(digest)
            while len(worker.tools) > TOOL_CACHE_SIZE:
                worker.tools.popitem(last=False)
            with self._lock:
                self._counts["loaded"] += 1
                if first:
                    self._trying.discard(digest)
                    if digest in self._preloads:
                        self._proven.add(digest)
                        proved = True
