"""The replies of a worker pool's calls, read by one thread for all of them (DESIGN §5
"A call's path"; internal).

A call written to a worker is an :class:`OpenCall` until its *outcome*: its reply, its
deadline, its worker's end, or a protocol violation. :class:`Replies` waits for every
open call of its pool at once, each worker's pipe and its process sentinel in one
``epoll`` set with the nearest deadline as the timeout, on one thread, the *reader*: no
thread waits per call, so the thread that wrote the call goes on at once and a reply
wakes only the reader. The reader answers what a worker asks on its own (a ``READY``; a
``NEED_TOOL``, whose frame with the tool it writes as the pipe takes it, as it writes
the rest of a call's frame the pipe did not take at once), and kills a worker at its
call's deadline itself, at once. Each outcome then goes to the pool's ``finish``
(decode the result, release or lose the worker, the call's ``done``), which may block (a
dead worker is reaped with a grace; ``done`` runs the host's code, which may run a turn
of its own): while other calls are open the reader first makes another thread the reader
(leader/followers), so no deadline waits behind a finish; alone, it finishes and reads
on, unless a call opened meanwhile made another thread the reader. Outcomes taken at
once (deadlines at the same instant) are finished at once: one by the reader, each
other by a thread of its own (by the reader too when none can be started). A thread
that has nothing else to do until one call's outcome (a blocking ``run_call``, a call
thread that waited for its worker, ``run_turn``'s caller holding a :class:`Waiter`)
reads that call's pipe itself instead (:meth:`Replies.serve_here`), and no reader wakes.

The reply protocol: while a call runs, a worker may send one empty ``READY`` (it was
started for this call), one empty ``NEED_TOOL`` (it lacks the tool's bytes), then one
``RESULT`` or ``RESULT_RETIRE``; any other frame, or one over
:data:`~rho_actors.sandbox.wire.MAX_REPLY_BYTES`, is a protocol violation (``malformed``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Literal

from loguru import logger

from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception
from rho_actors.otp.timers import Timer, Timers
from rho_actors.sandbox import wire
from rho_actors.sandbox.channel import Malformed
from rho_actors.sandbox.worker_handle import WorkerHandle

__all__ = ["OpenCall", "Outcome", "Replies", "Waiter"]

Outcome = Literal["reply", "deadline", "ended", "malformed", "reader_failed"]
"""What ended an open call: its ``reply`` (payload: ``(tag, body)``), its ``deadline``
(its worker killed already), its worker's end (``ended``), a ``malformed`` frame
(payload: the problem), or the reader's own failure (``reader_failed``: the problem)."""

_IN: Final = select.EPOLLIN
_IN_OUT: Final = select.EPOLLIN | select.EPOLLOUT
_MAX_S: Final = threading.TIMEOUT_MAX  # the longest a lock's acquire waits


class OpenCall:
    """One call written (or being written) to ``worker``, until its outcome: the
    ``request`` and ``tool_bytes`` (what a ``NEED_TOOL`` gets), the ``deadline`` sent
    with it (a ``time.monotonic()`` instant), ``state`` (the pool's, for ``finish``),
    ``out`` (what is left to write of its frames), ``sent`` (its ``CALL`` frame was
    written whole: a call whose worker ended before is not in it). ``guard`` is held by
    the thread writing to the worker and by ``finish`` while it takes the worker over:
    setting ``cancel`` kills the worker unless one holds it or :meth:`seal` was called."""

    __slots__ = ("_hook", "_token", "asked", "deadline", "ending", "fd", "fresh", "greeted", "guard", "mask", "out",
                 "request", "sealed", "sent", "sentinel", "state", "tool_bytes", "worker")

    def __init__(self, worker: WorkerHandle, request: wire.CallRequest, tool_bytes: bytes, deadline: float,
                 state: Any) -> None:
        self.worker = worker
        self.fresh = not worker.ran_code  # no tool's code ran in its worker before this call (may_have_begun)
        worker.ran_code = True
        self.request = request
        self.tool_bytes = tool_bytes
        self.deadline = deadline
        self.state = state
        self.fd = worker.channel.fd
        self.sentinel = worker.channel.sentinel
        self.out: memoryview | None = None
        self.mask = _IN  # what its pipe is polled for
        self.sent = False
        self.asked = self.greeted = False
        self.ending = False  # its outcome is taken (set under the reader's lock, or by the thread that serves it)
        self.sealed = False
        self.guard = threading.Lock()
        self._token: CancelToken | None = None
        self._hook: Callable[[], None] | None = None

    def watch(self, cancel: CancelToken | None) -> None:
        """Kill the worker when ``cancel`` is set (at once if it is), until :meth:`seal`,
        which takes the callback off ``cancel`` again (a token may outlive thousands of
        calls: it keeps none of those that ended)."""
        if cancel is None:
            return
        self._token, self._hook = cancel, self._cancelled
        cancel.add_inline_callback(self._hook)
        with self.guard:  # sealed meanwhile (its outcome was finished first): its seal found no callback yet
            sealed = self.sealed
        if sealed:
            cancel.remove_callback(self._hook)

    def _cancelled(self) -> None:
        if self.guard.acquire(blocking=False):  # held: being written (the writer looks again) or finished
            try:
                if not self.sealed:
                    self.worker.kill()
            finally:
                self.guard.release()

    def may_have_begun(self) -> bool:
        """Whether its worker, ended, may have begun the call: its ``CALL`` frame was
        written whole and the worker read all of it (its end's unread bytes, kept by the
        channel's copy of that end: :meth:`~rho_actors.sandbox.channel.Channel.unread_by_child`,
        none or unknown), or it asked for the tool (``NEED_TOOL``: a running tool can
        forge one, and the frame sent again is then what lies unread). Bytes left unread
        prove it never began only in a worker no tool's code ran in before it (``fresh``):
        code that ran there (an earlier call's, a tool loaded ahead) can read a frame with
        ``MSG_PEEK``, run the call and die with the frame still unread (hostile round 16).
        A call its worker never had whole is sent to another worker; one it may have begun
        never is (a tool need not be idempotent)."""
        return self.sent and (self.asked or not self.fresh or not self.worker.channel.unread_by_child())

    def seal(self) -> None:
        """The outcome is being finished: no kill by ``cancel`` from now on (waits out a
        write or a kill under way; the worker may be reaped next and its pid reused)."""
        with self.guard:
            self.sealed = True
        if self._token is not None and self._hook is not None:
            self._token.remove_callback(self._hook)


class Waiter:
    r"""The thread that made it, which will wait for the one call it is about to start and
    has nothing else to do meanwhile (the host's thread in ``run_turn`` of a turn whose
    only call runs in a worker; DESIGN §5 "A call's path"): the pool writing that call
    from this same thread hands the call to it (:meth:`hold`) instead of to its reader,
    and the thread reads the reply itself (:meth:`serve`), so a warm call wakes the
    worker and then this thread, and no reader between them. A call is held only from
    the thread that made the waiter, before :meth:`close`, once; a call written from
    any other thread, or after, goes to the reader as usual. A held call must be
    :meth:`serve`\ d (or :meth:`hand_over`\ ed): no other thread reads it meanwhile.

    Its thread may also keep the deadline of that call (:meth:`keep`: a call thread's,
    in ``run_turn`` of a one-call turn): it waits (:meth:`wait`) until the deadline's
    instant at most and only then schedules it on its timers (which fire it at once), so
    no timer is scheduled for a call answered before its deadline. A kept deadline must
    be waited for (or :meth:`hand_over`\ ed: it goes to its timers)."""

    __slots__ = ("_call", "_deadline", "_replies", "_thread")

    def __init__(self) -> None:
        self._thread: int | None = threading.get_ident()
        self._call: OpenCall | None = None
        self._replies: Replies | None = None
        self._deadline: tuple[Timer, Timers] | None = None

    def hold(self, replies: Replies, call: OpenCall) -> bool:
        """Keep ``call`` (of ``replies``' pool, not yet written) for this waiter's thread;
        whether it was kept (else the reader is to be given it)."""
        if self._thread != threading.get_ident() or self._call is not None:
            return False
        self._call, self._replies = call, replies
        return True

    def close(self) -> None:
        """No call is held from now on (the one held, if any, stays)."""
        self._thread = None

    def serve(self, until: float) -> bool:
        """Wait for the held call's outcome in this thread until ``until`` (a
        ``time.monotonic()`` instant; its deadline kills its worker here) and finish it
        (the call's ``done`` runs here); whether it was finished. ``False``: no call was
        held, or ``until`` came first and the pool's reader took the call over (it gets
        its one result from there). Closes the waiter."""
        call, replies = self._call, self._replies
        self._thread = self._call = self._replies = None
        if call is None or replies is None:
            return False
        return replies.serve_here(call, until)

    def drop(self, call: OpenCall) -> None:
        """``call``, if held, is not (its writer was interrupted before it wrote it)."""
        if self._call is call:
            self._call = self._replies = None

    def hand_over(self) -> None:
        """The thread will not wait (it raised): the held call, if any, goes to the pool's
        reader, the kept deadline to its timers. Closes the waiter."""
        call, replies, deadline = self._call, self._replies, self._deadline
        self._thread = self._call = self._replies = self._deadline = None
        if deadline is not None:
            _schedule(*deadline)
        if call is not None and replies is not None:
            replies.hand_over(call, "its caller stopped waiting")

    def keep(self, timer: Timer, timers: Timers) -> bool:
        """Keep ``timer``, the deadline of the call about to start (not scheduled yet),
        for this thread: its ``timers`` get it only if no result has disarmed it by the
        end of the wait for it (:meth:`wait`), or if the thread does not wait after all
        (:meth:`hand_over`).
        Only from the thread that made the waiter, before :meth:`close`, once: whether it
        was kept (else it is to be scheduled as usual). (``ThreadIsolation.start`` does this inline.)"""
        if self._thread != threading.get_ident() or self._deadline is not None:
            return False
        self._deadline = (timer, timers)
        return True

    def wait(self, lock: threading.Lock, until: float) -> bool:
        """Acquire ``lock`` (released once the call is answered) by ``until`` (a
        ``time.monotonic()`` instant); whether it was. A kept deadline not disarmed by
        the time the wait for it ends (its instant came first, ``until`` did, or an
        interrupt) goes to its timers, which fire it (at once when it is due): it is
        never fired in this thread, which a signal's handler may interrupt between any
        two bytecodes (a timeout claimed and never delivered, its call never answered);
        the wait goes on to ``until``. Costs nothing more when the call is answered first
        (its result disarms the deadline: no timer is scheduled). What interrupts the
        wait is raised on, its caller then to :meth:`hand_over` (which schedules the
        deadline if the interrupt came before this did)."""
        deadline = self._deadline
        if deadline is not None:
            timer = deadline[0]
            try:  # _seconds_to(min(timer.when, until)), inline, without the builtins' calls
                when = timer.when
                left = (when if when < until else until) - time.monotonic()
                if lock.acquire(True, left if 0.0 < left <= _MAX_S else _MAX_S if left > _MAX_S else 0.0):
                    return True
            finally:  # interrupted too: a deadline no result disarmed goes to the timers
                if not timer.cancelled:
                    _schedule(*deadline)
                self._deadline = None  # after: a wait interrupted before is handed over (hand_over) with it
        return lock.acquire(True, _seconds_to(until))  # (positional: no keyword parsed)


def _seconds_to(instant: float) -> float:
    """The seconds from now to ``instant`` (``time.monotonic()``), as a lock's timeout
    (0 for a past or NaN one)."""
    left = instant - time.monotonic()
    return left if 0.0 < left <= _MAX_S else _MAX_S if left > _MAX_S else 0.0


def _schedule(timer: Timer, timers: Timers) -> None:
    """Schedule a deadline no thread keeps any more, unless it is already (a wait
    interrupted just after it scheduled it, then handed over) or disarmed; stopped timers
    (the system stopping, which answers its calls itself) drop it, as they drop the
    deadlines they hold."""
    if timer.timers is not None or timer.cancelled:
        return
    try:
        timers.schedule(timer)
    except RuntimeError:
        logger.debug("a kept deadline was dropped: the timers are stopped")


def _kill(call: OpenCall) -> None:
    """Kill ``call``'s worker; a kill that fails (a confined worker's cgroup gone under it:
    ``OSError``) is logged, never raised: the call's finish kills it again or loses it."""
    try:
        call.worker.kill()
    except Exception:
        logger.exception("killing the worker of call {} failed", call.request.call_id)


class Replies:
    """The reader of one pool's open calls (see the module doc). ``finish(call, outcome,
    payload)`` ends each call once (it must give the call its result whatever happens);
    ``start_thread(job)`` runs ``job()`` on another thread (raises ``RuntimeError`` when
    none can be started)."""

    def __init__(self, finish: Callable[[OpenCall, Outcome, Any], None],
                 start_thread: Callable[[Callable[[], None]], None]) -> None:
        self._finish = finish
        self._start_thread = start_thread
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_r, _IN)
        self._lock = threading.Lock()
        self._by_fd: dict[int, OpenCall] = {}
        self._open: set[OpenCall] = set()
        self._leader: object | None = None  # the reading thread's token (None: none reads)
        self._alone = False  # the leader finishes an outcome: a call opened now needs another reader
        self._planned = math.inf  # when the leader wakes at the latest (a passed deadline's look)
        self._stopped = False
        self._closed = False

    def add(self, call: OpenCall) -> None:
        """Wait for ``call``'s outcome from now on (its frame may be written after: the
        writer holds ``call.guard`` meanwhile). Raises ``RuntimeError`` when stopped, or
        when no reader is running and none could be started; then nothing changed."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("the worker pool is stopped")
            self._by_fd[call.fd] = call
            if call.sentinel is not None:
                self._by_fd[call.sentinel] = call
            self._open.add(call)
            try:
                self._epoll.register(call.fd, call.mask)
                if call.sentinel is not None:
                    self._epoll.register(call.sentinel, _IN)
            except OSError as exc:
                self._remove_locked(call)
                raise RuntimeError(f"its pipe could not be waited on: {exc}") from None
            earlier = call.deadline < self._planned
            if earlier:
                self._planned = call.deadline
            if self._leader is None or self._alone:
                try:
                    self._promote_locked()
                except BaseException:
                    self._remove_locked(call)
                    raise
            elif earlier:  # the reader sleeps past it: it looks again now
                self._wake_locked()

    def withdraw(self, call: OpenCall) -> bool:
        """Wait no more for ``call`` (added, or not, and not written: its writer was
        interrupted); whether that was so, ``False`` when its outcome was taken already
        (its worker ended meanwhile): the call is then finished as usual."""
        with self._lock:
            if call.ending:
                return False
            self._remove_locked(call)
            return True

    def serve_here(self, call: OpenCall, until: float = math.inf) -> bool:
        """Wait for ``call``'s outcome in this thread, then finish it: for a thread that
        has nothing else to do until then (a blocking :meth:`WorkerPool.run_call
        <rho_actors.sandbox.pool.WorkerPool.run_call>`, a call thread that waited for its
        worker, a :class:`Waiter`), so that no reader is woken for it; whether it was
        finished here. At ``until`` (a ``time.monotonic()`` instant before the call's
        deadline) the thread stops waiting and the reader takes the call over
        (``False``). A fault of the wait ends the call as the reader's does
        (``reader_failed``); what interrupts it (a ``KeyboardInterrupt``) hands the call
        to the reader first, then is raised (interrupting a read or a write of a frame, it
        ends the call ``reader_failed``, its worker killed, instead)."""
        reading = False  # in _serve: what the pipe gave may be taken out of it and not yet looked at
        try:  # from its first line: an interrupt anywhere in the wait hands the call over
            poller = select.poll()
            call.mask = _IN_OUT if call.out else _IN
            poller.register(call.fd, call.mask)
            if call.sentinel is not None:
                poller.register(call.sentinel, _IN)
            while True:
                now = time.monotonic()
                remaining = call.deadline - now
                if remaining <= 0:
                    _kill(call)  # at the deadline itself, before the finish
                    outcome: tuple[Outcome, Any] = ("deadline", None)
                    break
                if until <= now:  # this thread stops waiting: the reader reads on
                    self.hand_over(call, "its waiter stopped waiting")
                    return False
                served = None
                for fd, mask in poller.poll(math.ceil(min(remaining, until - now) * 1000)):
                    reading = True
                    served = self._serve(call, fd, mask)
                    reading = False
                    if served is not None:
                        break
                if served is not None:
                    outcome = served
                    break
                if call.mask != (_IN_OUT if call.out else _IN):
                    call.mask = _IN_OUT if call.out else _IN
                    poller.modify(call.fd, call.mask)
        except Exception as exc:  # a fault of this wait (as the reader's, _failed): the call ends
            logger.opt(exception=exc).error("the wait for a worker's reply failed: its call ends")
            _kill(call)
            outcome = ("reader_failed", describe_exception(exc))
        except BaseException as exc:  # this thread is interrupted: the reader takes the call over...
            if not reading:
                self.hand_over(call, "its wait was interrupted")
                raise
            _kill(call)  # ...unless a frame may be half read or half written: the call ends here
            call.ending = True
            self._finish(call, "reader_failed", f"its read was interrupted ({describe_exception(exc)})")
            raise
        call.ending = True
        self._finish(call, *outcome)
        return True

    def hand_over(self, call: OpenCall, why: str) -> None:
        """The thread that was to wait for ``call`` (not yet ended) will not: the reader
        waits for it from now on; if none can (stopped, no thread), its worker is killed
        and the call ends ``reader_failed`` here."""
        try:
            self.add(call)
        except RuntimeError as exc:
            _kill(call)
            call.ending = True
            self._finish(call, "reader_failed", f"{why} and no reader took it ({exc})")

    def write_rest(self, call: OpenCall, rest: memoryview) -> None:
        """The pipe took only part of ``call``'s frame: the reader writes ``rest`` as it
        takes more (unless the call has ended meanwhile: it was not sent)."""
        with self._lock:
            if not call.ending and not self._closed:
                call.out, call.mask = rest, _IN_OUT
                self._epoll.modify(call.fd, _IN_OUT)

    def stop(self) -> None:
        """No call is added from now on; the reader ends once every open call has its
        outcome (the pool's stop kills their workers)."""
        with self._lock:
            self._stopped = True
            if self._leader is None and not self._open:
                self._close_locked()
            else:
                self._wake_locked()

    # --- the reader ----------------------------------------------------------------------

    def _promote_locked(self) -> None:
        """Make a new thread the reader (the current one, if any, ends after its finish)."""
        token = object()
        before = self._leader, self._alone
        self._leader, self._alone = token, False
        try:
            self._start_thread(functools.partial(self._lead, token))
        except BaseException:
            self._leader, self._alone = before
            raise

    def _wake_locked(self) -> None:
        if not self._closed:
            with contextlib.suppress(BlockingIOError):  # full: it is woken anyway
                os.write(self._wake_w, b"\0")

    def _remove_locked(self, call: OpenCall) -> None:
        self._open.discard(call)
        for fd in (call.fd, call.sentinel):
            if fd is not None and self._by_fd.get(fd) is call:
                del self._by_fd[fd]
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    def _close_locked(self) -> None:
        if not self._closed:
            self._closed = True
            self._epoll.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _lead(self, token: object) -> None:
        try:
            while self._round(token):
                pass
        except BaseException as exc:
            self._failed(token, exc)

    def _round(self, token: object) -> bool:
        """One wait of the reader and what it brought; whether this thread reads on."""
        with self._lock:
            if self._leader is not token:
                return False
            if self._stopped and not self._open:
                self._leader = None
                self._close_locked()
                return False
            planned = self._planned
        timeout = -1.0 if planned == math.inf else max(0.0, planned - time.monotonic())
        taken = self._outcomes(self._epoll.poll(timeout))
        now = time.monotonic()
        with self._lock:
            for call in self._open:
                if not call.ending and call.deadline <= now:
                    call.ending = True
                    taken.append((call, "deadline", None))
            for call, _, _ in taken:
                self._remove_locked(call)
            nearest = min((c.deadline for c in self._open), default=math.inf)
            self._planned = min(nearest, planned if planned > now else math.inf)
            reads_on = True
            if taken and self._open:  # others wait for their outcome: another thread reads on
                try:
                    self._promote_locked()
                    reads_on = False
                except Exception:  # RuntimeError: the host at its thread limit
                    logger.warning("no thread could be started to read replies: the reader finishes first")
            elif taken:
                self._alone = True
        # from here on the outcomes taken are off the open set: nothing may keep them from their finish
        for call, outcome, _ in taken:
            if outcome == "deadline":
                _kill(call)  # at the deadline itself, before any finish
        here = taken[:1]  # outcomes taken at once: this thread finishes one, a thread each the others
        for item in taken[1:]:
            try:
                self._start_thread(functools.partial(self._finish_one, *item))
            except Exception:  # none could be started: this thread finishes it too
                here.append(item)
        for item in here:
            self._finish_one(*item)
        if not reads_on:
            return False
        with self._lock:
            if self._leader is not token:
                return False
            self._alone = False
        return True

    def _finish_one(self, call: OpenCall, outcome: Outcome, payload: Any) -> None:
        try:
            self._finish(call, outcome, payload)
        except BaseException:
            logger.exception("finishing call {} failed", call.request.call_id)

    def _outcomes(self, events: list[tuple[int, int]]) -> list[tuple[OpenCall, Outcome, Any]]:
        """What ``events`` brought: the outcomes taken (frames written and read meanwhile)."""
        taken: list[tuple[OpenCall, Outcome, Any]] = []
        for fd, mask in events:
            if fd == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                continue
            call = self._by_fd.get(fd)
            if call is None or call.ending:
                continue
            served = self._serve(call, fd, mask)
            with self._lock:  # as withdraw() looks: the call is the reader's or its writer's, never both
                if call not in self._open:  # taken back meanwhile (its writer was interrupted): not ours
                    continue
                if served is not None:
                    call.ending = True
                    taken.append((call, *served))
                elif call.mask != (_IN_OUT if call.out else _IN):  # a frame to write now, or no more
                    call.mask = _IN_OUT if call.out else _IN
                    self._epoll.modify(call.fd, call.mask)
        return taken

    def _serve(self, call: OpenCall, fd: int, mask: int) -> tuple[Outcome, Any] | None:
        """What ``fd`` (the call's pipe or its worker's sentinel) has: the outcome, if any."""
        channel = call.worker.channel
        try:
            if fd == call.fd and mask & select.EPOLLOUT and call.out:
                call.out = channel.write_some(call.out)
                if not call.out:
                    call.out, call.sent = None, True
            if fd == call.fd and not mask & ~select.EPOLLOUT:
                return None  # only writable
            frame = channel.read_some(wire.MAX_REPLY_BYTES)
            while frame is not None:
                outcome = self._on_frame(call, *frame)
                if outcome is not None:
                    return outcome
                frame = channel.buffered(wire.MAX_REPLY_BYTES)
        except EOFError:
            return "ended", None
        except Malformed as exc:
            return "malformed", str(exc)
        if fd == call.sentinel:  # the worker ended, and nothing whole is left to read
            return "ended", None
        return None

    def _on_frame(self, call: OpenCall, tag: bytes, body: bytes) -> tuple[Outcome, Any] | None:
        if tag == wire.READY and not call.greeted and not body:  # a worker started for this call
            call.greeted = True
            return None
        if tag == wire.NEED_TOOL and not call.asked and not body:  # once per call, and empty
            call.asked = True
            try:
                body = wire.encode_call(call.request, deadline=call.deadline, tool_bytes=call.tool_bytes)
            except wire.WireError as exc:
                return "malformed", f"its tool could not be sent as it asked: {exc}"
            call.out = call.worker.channel.write_some(call.worker.channel.frame(wire.CALL, body)) or None
            return None
        if tag not in (wire.RESULT, wire.RESULT_RETIRE):
            return "malformed", f"an unexpected {tag!r} frame of {len(body):,} bytes in reply to a call"
        return "reply", (tag, body)

    def _failed(self, token: object, exc: BaseException) -> None:
        """The reader raised: every open call ends (``reader_failed``, its worker killed);
        the next call added starts a new reader."""
        logger.opt(exception=exc).error("the reader of a worker pool's replies failed: its open calls end")
        with self._lock:
            if self._leader is not token:
                return
            calls = list(self._open)  # the outcomes taken but not yet finished too
            for call in calls:
                call.ending = True
                self._remove_locked(call)
            self._leader, self._alone = None, False
            if self._stopped and not self._open:
                self._close_locked()
        problem = describe_exception(exc)
        for call in calls:
            try:
                self._finish(call, "reader_failed", problem)
            except BaseException:
                logger.exception("finishing call {} failed", call.request.call_id)
