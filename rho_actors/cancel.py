"""A call's cancellation signal (DESIGN §2: ``ctx["cancel"]``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from loguru import logger

__all__ = ["CancelToken"]

_LOCK = threading.Lock()  # every token's: held only for a few attribute reads and writes


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

    __slots__ = ("_callbacks", "_event", "_finished", "reason")

    def __init__(self) -> None:
        # No lock or event of its own (one token per call): the module's one lock guards a
        # few attribute reads and writes, and the event is made only when someone waits.
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._finished = False
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """Whether the call was cancelled (its deadline passed, or its loop stopped)."""
        return self.reason is not None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until cancelled or ``timeout_s`` seconds pass; returns :attr:`cancelled`."""
        if self.reason is not None:
            return True
        with _LOCK:
            if self.reason is not None:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(timeout_s)

    def cancel(self, reason: str = "cancelled") -> bool:
        """Set the signal (the first reason wins: ``"timeout"``, ``"stopping"``...) and
        run the callbacks in this thread. Returns whether the call was still running,
        i.e. whether its thread is now abandoned."""
        with _LOCK:
            if self.reason is not None:
                return False
            self.reason = str(reason)
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
        with _LOCK:
            self._finished = True
            return self.reason is not None

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` on cancellation (at once if already cancelled)."""
        with _LOCK:
            if self.reason is None:
                self._callbacks.append(callback)
                return
        callback()
