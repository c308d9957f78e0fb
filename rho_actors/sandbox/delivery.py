"""A call of a :class:`~rho_actors.sandbox.pool.WorkerPool` delivered to its worker and
answered (DESIGN §5 "A call's path"; internal).

:class:`CallDelivery` is the pool's part between a call's place under the cap and its
one result: it takes the call a worker (:meth:`CallDelivery._deliver`, by
:mod:`rho_actors.sandbox.taking`), writes its ``CALL`` frame (:meth:`CallDelivery._open_on`,
handing the call to the pool's reader or to the thread that waits for it), takes the
outcome the reader gives it (:meth:`CallDelivery._finish`: the reply, the deadline, its
worker's end, a broken frame; a call whose worker ended before it had the call goes to
another worker) into the call's one result, releases or loses the worker
(:meth:`CallDelivery._release`) and gives the call's place back
(:meth:`CallDelivery._leave`). A thread interrupted on the way (a signal handler's
``KeyboardInterrupt``) still leaves the call answered once and its worker given back or
killed (:meth:`CallDelivery._abandon`, :meth:`CallDelivery._interrupted`). The call's
entry points (``run``, ``try_start``, ``start``) are :mod:`rho_actors.sandbox.pool`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from typing import Any, Final

from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.results import capped, failure
from rho_actors.sandbox import wire
from rho_actors.sandbox.replies import OpenCall, Outcome, Replies, Waiter
from rho_actors.sandbox.sending import Sending, start_ms
from rho_actors.sandbox.slots import Grant
from rho_actors.sandbox.taking import DELIVERY_ATTEMPTS, NotStarted, QueuedPastDeadline, StartFailed, WorkerTaking
from rho_actors.sandbox.warm_workers import CALL_SCOPE, PoolStopped
from rho_actors.sandbox.wire import WorkerCall
from rho_actors.sandbox.worker import TOOL_CACHE_SIZE
from rho_actors.sandbox.worker_handle import WorkerHandle, at_deadline, died
from rho_actors.tool import ToolResult

__all__ = ["CallDelivery"]

_NOTICE_ROOM: Final = 200
"""Characters past a call's output cap that the worker's own truncation notice may take."""


class CallDelivery(WorkerTaking):
    """A pool's worker processes, how a call takes one, and the call's delivery and
    answer (see the module doc); :class:`~rho_actors.sandbox.pool.WorkerPool` sets every
    attribute below in its ``__init__``."""

    _codec: wire.ResultCodec
    _setting: str
    _replies: Replies

    def _start_failed(self, call: WorkerCall, problem: str) -> ToolResult:
        """The one answer of a call that got no worker because starting one failed on its
        own (its process not started, no thread for its start, dead or failing before
        ``READY``, or dead before the call reached it, each tried again as
        :data:`DELIVERY_ATTEMPTS` allows): ``unavailable`` naming ``problem``; the tool's
        code never ran (DESIGN §5 "Starting a worker")."""
        return self._failure(call, "no_worker", problem=problem)

    def _failure(self, call: WorkerCall, key: str, **fields: Any) -> ToolResult:
        """The failure ``key`` of ``call``, its duration counted from ``call.started``."""
        if key == "memory_tree":
            fields["setting"] = self._setting
        return failure(key, call.call_id, call.name, (time.monotonic() - call.started) * 1000, **fields)

    def _leave(self, grant: Grant) -> None:
        """The call's end for the cap (once): its grant goes back, or is kept for the
        session's next call (see :meth:`WorkerSlots.leave`)."""
        if self._slots is not None and not grant.left:
            grant.left = True
            self._slots.leave(grant.session, time.monotonic() - grant.at, keep=self._scoped)

    def _deliver(self, sending: Sending) -> None:
        """Take a worker for ``sending`` (waiting as :meth:`_take` does) and write the call
        to it; a call that gets none is given its result here, and its place back."""
        call, timeout_ms = sending.call, sending.call.timeout_ms
        result: ToolResult | None
        try:
            worker = self._take(sending.scope, sending.env_key,
                                call.deadline if call.start_by is None else call.start_by, call.start_by is not None,
                                sending.held)
        except QueuedPastDeadline:
            cap = self._slots.limit if self._slots is not None else 0
            result = self._failure(call, "no_worker_in_time", start_ms=start_ms(call),
                                   timeout_ms=timeout_ms, why=f"the system's {cap} worker(s) stayed busy") \
                if call.start_by is not None else self._failure(call, "queued_past_deadline", timeout_ms=timeout_ms,
                                                                 cap=cap)
        except NotStarted as exc:
            why = str(exc) or "no worker was free, and the one started for it was not ready in time"
            result = self._failure(call, "no_worker_in_time", start_ms=start_ms(call), timeout_ms=timeout_ms, why=why)
        except StartFailed as exc:
            result = self._start_failed(call, str(exc))
        except PoolStopped:
            result = self._failure(call, "pool_stopped")
        except Exception as exc:
            result = self._start_failed(call, describe_exception(exc))
        except BaseException as exc:  # this thread interrupted (a signal handler's KeyboardInterrupt)
            self._abandon(sending, exc)
            raise
        else:
            try:
                result = self._open_on(sending, worker)
            except BaseException as exc:  # interrupted: answered here unless its reader has it
                self._abandon(sending, exc)
                raise
        if result is not None:
            self._answer(sending, result)

    def _answer(self, sending: Sending, result: ToolResult) -> None:
        """Give the call its one result (once), and its place under the cap back."""
        if not sending.answered:
            sending.answered = True
            self._leave(sending.grant)
            sending.done(result)

    def _abandon(self, sending: Sending, exc: BaseException) -> None:
        """The thread taking a worker for ``sending`` or writing it was interrupted
        (``exc``) while no reader had the call: the worker taken for it, if any, is given
        back (nothing of the call reached it) and the call answered ``start_interrupted``.
        A call a reader has is left to it."""
        if sending.opened:
            return
        for worker in list(sending.held):
            self._release(worker, False, held=sending.held)
        self._answer(sending, self._failure(sending.call, "start_interrupted", problem=describe_exception(exc)))

    def _open_on(self, sending: Sending, worker: WorkerHandle) -> ToolResult | None:
        """Write the call to ``worker`` (busy, this thread's): its tool's bytes only if it
        lacks them, its deadline ``timeout_ms`` from now if it has a start bound (never past
        its own), what the pipe does not take at once by the reader, whose call it is
        from now on (``None``; or the thread that waits for it: ``here``, or the call's
        ``waiter`` when it holds it); or the failure that kept it from the worker, which
        is released."""
        call = sending.call
        # the worker is sent a call id of this call alone (its tool's ctx keeps the caller's),
        # which its reply must name: a reply it sends for an earlier call is never this one's
        r = sending.request  # copied field by field: dataclasses.replace costs twice as much a call
        request = wire.CallRequest(r.digest, r.tool_bytes, r.name, f"{call.call_id}#{os.urandom(8).hex()}", r.args,
                                   r.fields, r.deps_bytes, r.deadline, r.timeout_ms, r.max_chars)
        deadline = request.deadline
        if call.start_by is not None:  # its tool's time starts now, not when it was dispatched
            deadline = min(deadline, time.monotonic() + request.timeout_ms / 1000)
        has_tool = request.digest in worker.tools
        try:
            body = wire.encode_call(request, deadline=deadline, tool_bytes=None if has_tool else sending.tool_bytes)
        except wire.WireError as exc:  # not sent: the worker is as it was
            self._release(worker, False, held=sending.held)
            return self._failure(call, "unsendable", problem=str(exc))
        sending.grant.at = time.monotonic()  # how long the call itself holds it (not the wait for a worker)
        if self._scoped and sending.scope != CALL_SCOPE:
            worker.session = sending.grant.session
        opened = OpenCall(worker, request, sending.tool_bytes, deadline, sending)
        waiter, sending.waiter = sending.waiter, None  # held once: a call sent again goes to the reader
        with opened.guard:  # a finish (its worker's end seen meanwhile) waits for the write
            writing = False
            try:
                held = sending.here or (waiter is not None and waiter.hold(self._replies, opened))
                try:
                    if not held:
                        self._replies.add(opened)
                except RuntimeError as exc:
                    self._release(worker, False, held=sending.held)
                    return (self._failure(call, "pool_stopped") if self._stopped else
                            self._failure(call, "no_reply_reader", problem=str(exc)))
                sending.opened = True
                sending.held.clear()  # the reader's now: it releases or loses the worker
                if not has_tool:
                    with self._lock:
                        self._counts["shipped"] += 1
                writing = True
                try:
                    rest: memoryview | None = worker.channel.write_some(worker.channel.frame(wire.CALL, body))
                except EOFError:  # it died idle: the reader sees its end, and the call goes to another worker
                    rest = None
            except BaseException:
                self._interrupted(sending, opened, waiter, writing)
                raise
            if rest and held:
                opened.out = rest
            elif rest:
                self._replies.write_rest(opened, rest)
            elif rest is not None:
                opened.sent = True
        opened.watch(call.cancel)
        if sending.here:
            self._replies.serve_here(opened)
        return None

    def _interrupted(self, sending: Sending, opened: OpenCall, waiter: Waiter | None, writing: bool) -> None:
        """The thread writing ``opened`` was interrupted (a signal handler raising) once its
        reader (the pool's, or ``waiter``) had it: ``writing``, its frame maybe half
        written, its worker is killed and its reader answers it; else it is taken back
        (:meth:`try_start` answers it, its worker given back), unless its outcome was
        taken already (its worker ended meanwhile)."""
        if writing:
            with contextlib.suppress(OSError):
                opened.worker.kill()
            return
        if waiter is not None:
            waiter.drop(opened)
        if self._replies.withdraw(opened):  # back to its caller, which gives the worker back
            if opened.worker not in sending.held:  # (still there when interrupted before the reader had it)
                sending.held.append(opened.worker)
            sending.opened = False

    def _finish(self, opened: OpenCall, outcome: Outcome, payload: Any) -> None:
        """An open call's outcome, from the reader (or the thread it handed it to): the
        call's one result to its ``done`` whatever happens, its worker released or lost,
        its place back; a call whose worker ended before it had the whole call goes to
        another worker (:data:`DELIVERY_ATTEMPTS` in all)."""
        opened.seal()
        sending: Sending = opened.state
        call, worker, busy_since, tries = sending.call, opened.worker, opened.worker.idle_since, sending.tries
        failed = functools.partial(self._failure, call)
        try:
            if outcome == "reply":
                result = self._replied(sending, opened, *payload)
            elif outcome == "deadline":
                result = at_deadline(worker, failed, call.timeout_ms, self._heap_bytes, self._lose)
            elif outcome == "ended" and not worker.killed and not opened.may_have_begun():
                self._lose(worker, "died")  # before the call reached it: another worker
                if sending.tries + 1 < DELIVERY_ATTEMPTS and not self._stopped:
                    sending.opened = False  # no reader has it while it is sent again: _deliver answers an interrupt
                    sending.tries += 1
                    self._deliver(sending)
                    return
                sending.tries += 1
                result = self._start_failed(call, f"{sending.tries} worker processes in a row ended before the "
                                                  "call reached them")
            elif outcome == "ended":
                result = died(worker, failed, call.cancel, self._heap_bytes, lambda: self._stopped, self._lose)
            else:  # malformed, reader_failed
                self._lose(worker, "killed")
                result = failed("malformed_reply" if outcome == "malformed" else "reader_failed", problem=payload)
        except Exception as exc:  # a bug here must still answer the call
            logger.exception("the outcome of call {} could not be taken", call.call_id)
            result = failed("reader_failed", problem=describe_exception(exc))
        except BaseException as exc:  # its thread interrupted (a caller's KeyboardInterrupt): answered, then raised
            if sending.tries == tries:
                if worker in self._busy and worker.idle_since == busy_since:  # not yet released (idle_since anew)
                    self._lose(worker, "killed")
                self._answer(sending, failed("reader_failed",
                                             problem=f"its finish was interrupted ({describe_exception(exc)})"))
            else:  # while it was sent again: answered by _deliver, or its new reader has it
                self._abandon(sending, exc)
            raise
        self._answer(sending, result)

    def _replied(self, sending: Sending, opened: OpenCall, tag: bytes, body: bytes) -> ToolResult:
        """The result the worker sent (``tag``, ``body``), the worker released."""
        call, worker, request = sending.call, opened.worker, opened.request
        try:
            result = self._codec.decode(body)
        except wire.WireError as exc:
            self._lose(worker, "killed")
            return self._failure(call, "malformed_reply", problem=f"a result that is not one: {exc}")
        if result.call_id not in (request.call_id, ""):  # a forged reply went first ("": its CALL undecodable)
            self._lose(worker, "killed")
            return self._failure(call, "malformed_reply", problem="a reply to another call, sent after it was answered")
        worker.tools[request.digest] = None
        worker.tools.move_to_end(request.digest)
        while len(worker.tools) > TOOL_CACHE_SIZE:
            worker.tools.popitem(last=False)
        self._release(worker, tag == wire.RESULT_RETIRE or sending.scope == CALL_SCOPE, sending.grant)
        # the reply was decoded into a new result just now, which no one else holds: its
        # call id, name and duration are the host's, set in place (no copy of its text)
        for key, value in (("call_id", call.call_id), ("name", request.name),
                           ("duration_ms", (time.monotonic() - call.started) * 1000)):
            object.__setattr__(result, key, value)
        if request.call_id in result.content:  # a text the worker made names the call (Deferred's): the caller's id
            object.__setattr__(result, "content", result.content.replace(request.call_id, call.call_id))
        if len(result.content) > request.max_chars + _NOTICE_ROOM:  # a forged reply skipped the worker's cap
            result = capped(result, request.max_chars)
        return result

    def _release(self, worker: WorkerHandle, retire: bool, grant: Grant | None = None,
                 held: list[WorkerHandle] | None = None) -> None:
        """A call ended on ``worker``: keep it idle while its scope has fewer idle workers
        than ``warm`` (at least 1 for a scoped worker) or than the scope's recent peak of
        busy ones, else retire it (``retire``: always). The call's ``grant`` goes back
        first, so that a grant kept for its session spares the worker from the moment
        it is idle. ``held``: the list the worker was taken into (``_take_idle``); it
        leaves it under the same lock (given back once, whatever interrupts)."""
        with self._lock:
            if held is not None:
                if worker not in held:
                    return
                held.remove(worker)
            if grant is not None:
                self._leave(grant)
            self._busy.discard(worker)
            same = sum(1 for w in self._idle if w.scope == worker.scope)
            keep = max(1 if worker.scope is not None else 0, self._warm,
                       self._recent_peak_locked(worker.scope, time.monotonic()))
            if not (retire or worker.doomed or self._stopped or same >= keep):
                self._idle_locked(worker, since=time.monotonic())
                return
            if not self._stopped:
                self._counts["retired"] += 1
        self._retire(worker)

