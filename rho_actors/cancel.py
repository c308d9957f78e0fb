"""A call's cancellation signal (DESIGN §2: ``ctx["cancel"]``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from loguru import logger

__all__ = ["CancelToken"]


class CancelToken:
    """A call's cancellation signal, in ``ctx["cancel"]``: poll :attr:`cancelled`,
    block on :meth:`wait`, or register a callback. Set once, never cleared.

    Example (a cooperative tool)::

        def run(args, ctx):
            for chunk in work():
                if ctx["cancel"].cancelled:
                    return Error("cancelled")
                ...
    """

    __slots__ = ("_callbacks", "_event", "_finished", "_lock", "_set", "reason")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None  # made by the first wait: most tokens are never waited on
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._finished = False
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """Whether the call was cancelled (its deadline passed, or its loop stopped)."""
        return self._set

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until cancelled or ``timeout_s`` seconds pass; returns :attr:`cancelled`."""
        with self._lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout_s)

    def cancel(self, reason: str = "cancelled") -> bool:
        """Set the signal (the first reason wins: ``"timeout"``, ``"stopping"``...) and
        run the callbacks in this thread. Returns whether the call was still running,
        i.e. whether its thread is now abandoned."""
        with self._lock:
            if self._set:
                return False
            self.reason = reason
            self._set = True
            event = self._event
            callbacks, self._callbacks = self._callbacks, []
            running = not self._finished
        if event is not None:
            event.set()
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("cancel callback raised")
        return running

    def finish(self) -> bool:
        """Mark the call's thread as returned. Returns whether it had been abandoned."""
        with self._lock:
            self._finished = True
            return self._set

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` on cancellation (at once if already cancelled)."""
        with self._lock:
            if not self._set:
                self._callbacks.append(callback)
                return
        callback()
