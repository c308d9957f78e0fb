"""A call's cancellation signal (DESIGN §2: ``ctx["cancel"]``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from loguru import logger

__all__ = ["CancelToken"]

_LOCK = threading.Lock()  # every token's: held only for a few attribute reads and writes
_NONE: tuple[()] = ()  # a token's callbacks until one is added: no list made per call


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

    __slots__ = ("_abandoned", "_callbacks", "_event", "_inline", "_running", "reason")

    def __init__(self) -> None:
        # No lock or event of its own (one token per call): the module's one lock guards a
        # few attribute reads and writes, and the event is made only when someone waits.
        self._event: threading.Event | None = None
        # most tokens never get a callback: each list is made by the first add
        self._callbacks: list[Callable[[], object]] | tuple[()] = _NONE  # add_callback's: run on a thread of their own
        self._inline: list[Callable[[], object]] | tuple[()] = _NONE  # add_inline_callback's: run by the canceller
        # the call's thread running: emptied by one atomic pop, by whichever comes first, its finish (returned)
        # or an abandon (given up on), so they agree on which it was without a lock round at the finish
        self._running: list[None] = [None]
        self._abandoned: tuple[object, str] | None = None  # who gave up on the call's running thread, and why
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
        """Set the signal (the first reason wins: ``"timeout"``, ``"stopping"``...), run
        the runtime's callbacks in this thread and start the others
        (:meth:`add_callback`) on a thread of their own. Returns whether this call set
        it while the call was still running. Never raises, and never waits for a
        callback given to :meth:`add_callback`. :attr:`reason` is a plain ``str``: a
        ``str`` subclass's own characters, another value's ``str()`` (made before any
        lock is taken: a slow one holds up only this caller), ``"cancelled"`` if that
        raises."""
        return self._set(reason)

    def abandon(self, reason: str, owner: object) -> bool:
        """The runtime gives up on the call's running thread: :meth:`cancel` with
        ``reason`` (unless set already), and, when the call is still running, marks it
        abandoned by ``owner`` (the isolation counting abandoned threads) for
        :meth:`finish`. Returns whether it was abandoned by this call (a tool that
        cancelled its own token is still abandoned here; one that abandons it with
        another ``owner`` counts for nobody's :meth:`finish`)."""
        return self._set(reason, owner)

    def _set(self, reason: str, owner: object = None) -> bool:
        abandon = owner is not None
        text = reason if type(reason) is str else _text(reason)  # no code of the caller's under the lock
        with _LOCK:
            running = bool(self._running)
            abandoned = False
            if abandon and running and self._abandoned is None:
                self._abandoned = (owner, text)  # first: a finish that finds the thread's end claimed reads it
                try:
                    self._running.pop()  # claimed: the thread's finish tells ``owner`` it returned
                    abandoned = True
                except IndexError:  # it returned just now (its finish takes no lock): not abandoned after all
                    self._abandoned = None
                    running = False
            if self.reason is not None:
                return abandoned
            self.reason = text
            event = self._event
            inline, self._inline = self._inline, _NONE
            callbacks, self._callbacks = self._callbacks, _NONE
        if event is not None:
            event.set()
        for callback in inline:
            _run_callback(callback)
        if callbacks:
            _run_apart(callbacks)
        return abandoned or (running and not abandon)

    def finish(self, owner: object = None) -> str | None:
        """Mark the call's thread as returned. Returns why ``owner`` had abandoned it
        (its :meth:`abandon`'s reason), or ``None`` (not abandoned, or by another)."""
        try:  # no lock round: the pop an abandon makes too (under the lock) decides which came first
            self._running.pop()
        except IndexError:  # abandoned first (which wrote ``_abandoned`` before its pop), or finished again
            abandoned = self._abandoned
            return abandoned[1] if abandoned is not None and owner is not None and abandoned[0] is owner else None
        return None  # returned first: nobody abandoned it

    def add_callback(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once cancelled (at once if already cancelled), on a thread
        of its own: a callback that blocks or raises holds up neither the deadline nor
        the loop that cancels (what it raises is logged)."""
        with _LOCK:
            if self.reason is None:
                if self._callbacks is _NONE:
                    self._callbacks = [callback]
                else:
                    self._callbacks.append(callback)  # type: ignore[union-attr]
                return
        _run_apart([callback])

    def add_inline_callback(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` in the cancelling thread as the token is set (at once, in
        this thread, if already cancelled): for the runtime's own callbacks, which are
        quick and never block (a tool's go through :meth:`add_callback`). What it raises
        is logged."""
        with _LOCK:
            if self.reason is None:
                if self._inline is _NONE:
                    self._inline = [callback]
                else:
                    self._inline.append(callback)  # type: ignore[union-attr]
                return
        _run_callback(callback)

    def remove_callback(self, callback: Callable[[], object]) -> bool:
        """Forget ``callback`` (the very object given to :meth:`add_callback` or
        :meth:`add_inline_callback`; its latest registration) before it runs: what a
        user of a token that outlives it does when done (a host's token reused for many
        turns keeps no callback per turn). Returns whether it was still waiting (not
        when the token was set: it runs, or ran, then)."""
        with _LOCK:
            for kept in (self._inline, self._callbacks):
                for index in range(len(kept) - 1, -1, -1):
                    if kept[index] is callback:
                        del kept[index]  # type: ignore[union-attr]
                        return True
        return False


def _text(reason: object) -> str:
    """``reason`` as a plain ``str``: a ``str`` subclass's own characters (its methods
    are not called), anything else's ``str()`` (its own characters when that is a ``str``
    subclass), or ``"cancelled"`` when that raises."""
    if issubclass(type(reason), str):  # its type, not isinstance(): that asks its __class__, which may lie or raise
        return str.__str__(reason)
    try:
        text = str(reason)  # what __str__ gave: a str subclass, maybe
        return text if type(text) is str else str.__str__(text)
    except BaseException:  # a cancel never raises
        return "cancelled"


def _run_callback(callback: Callable[[], object]) -> None:
    try:
        callback()
    except BaseException:  # a callback's failure is its own: the cancelling thread goes on
        logger.exception("cancel callback raised")


def _run_apart(callbacks: Sequence[Callable[[], object]]) -> None:
    """Run ``callbacks`` in order on a new daemon thread."""

    def run() -> None:
        for callback in callbacks:
            _run_callback(callback)

    try:
        threading.Thread(target=run, name="rho_actors-cancel-callbacks", daemon=True).start()
    except RuntimeError as exc:  # no thread to be had: the callbacks are lost, the cancel is not
        logger.error("{} cancel callbacks were not run: no thread for them ({})", len(callbacks), exc)
