"""The warm worker processes of ``process`` isolation (DESIGN §5; internal,
re-exported by :mod:`rho_actors.sandbox`).

:class:`WorkerPool` keeps warm worker processes and runs ``tool.run(args, ctx)`` in one
of them: at the call's deadline the worker's whole process group is killed
(``SIGKILL``) and replaced in the background, so a deadline holds even against C code
that holds the GIL; a crash, an exit or running out of memory is an error result and
never touches the caller or a sibling call. The worker's side is
:mod:`rho_actors.sandbox.worker`.

Replies: a worker's result comes back in its result codec (a property of the pool,
see :mod:`rho_actors.sandbox.wire`): ``"plain"`` by default, msgpack of plain data
checked field by field, so nothing a worker sends can run code in the host; ``"pickle"``
(any picklable ``details``) for trusted tools only. Any frame that breaks the protocol
(an unknown tag, a control frame with a body, a second ``READY`` or ``NEED_TOOL``, a
frame over :data:`~rho_actors.sandbox.wire.MAX_REPLY_BYTES`, a result its codec
refuses) gets the worker killed and replaced, and the call a ``crashed`` result naming
the violation; a worker that sends anything more after its reply is killed before it
serves again.

Example::

    pool = WorkerPool(warm=2)
    result = pool.run(MyTool, {"x": 1}, {"session_id": "s1", "call_id": "c1"},
                      deadline=time.monotonic() + 5.0, max_output_chars=100_000)
    pool.stop()
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final, Literal

from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.results import KILLED, failure
from rho_actors.sandbox import wire
from rho_actors.sandbox.channel import Channel, DeadlineReached, Malformed
from rho_actors.sandbox.child import ChildSetup
from rho_actors.sandbox.processes import close, context, kill_group, kill_groups, reap, signal_name, spawn
from rho_actors.sandbox.reads import DEFAULT_HEAP_BYTES
from rho_actors.sandbox.shipping import Unshippable, pickled_deps, ship, short_name
from rho_actors.sandbox.worker import TOOL_CACHE_SIZE, WorkerConfig, worker_child
from rho_actors.tool import ToolResult

__all__ = ["WorkerPool"]

_EXIT_GRACE_S: Final = 1.0
"""How long a worker that closed its pipe gets to finish exiting before it is killed."""
_REAP_TIMEOUT_S: Final = 5.0
_READY_TIMEOUT_S: Final = 30.0
_DELIVERY_ATTEMPTS: Final = 3
"""Workers tried for one call when each turns out dead before the call reaches it."""


class _Stopped(Exception):
    """The pool is stopped."""


class _Worker:
    """The parent's record of one worker process."""

    __slots__ = ("_reap_lock", "channel", "exitcode", "killed", "pid", "proc", "reaped", "tools")

    def __init__(self, proc: Any, channel: Channel) -> None:
        self.proc = proc
        self.pid: int = proc.pid
        self.channel = channel
        self.tools: OrderedDict[bytes, None] = OrderedDict()
        self.killed = False
        self.reaped = False
        self.exitcode: int | None = None
        self._reap_lock = threading.Lock()

    def healthy(self) -> bool:
        """Whether an idle worker is still running and has sent nothing unasked."""
        return not self.reaped and self.channel.quiet()

    def kill(self) -> None:
        self.killed = True
        kill_group(self.pid)

    def reap(self, timeout_s: float = _REAP_TIMEOUT_S) -> int | None:
        """Wait for the process to end and release it; its exit code (None: still running)."""
        with self._reap_lock:
            if self.reaped:
                return self.exitcode
            code = reap(self.proc, timeout_s)
            if code is None:
                return None
            self.exitcode, self.reaped = code, True
            return code

    def close(self) -> None:
        """Release the pipe and the process handle; only by the thread that owns the
        worker (a thread polling them must never see their descriptors reused)."""
        self.channel.close()
        if self.reaped:
            close(self.proc)


class WorkerPool:
    """Warm worker processes for ``process`` isolation (DESIGN §5). Thread-safe: call
    :meth:`run` from any number of threads at once.

    ``warm`` idle workers are started ahead of need, each leading its own process group
    under ``RLIMIT_AS`` = ``heap_bytes`` (bytes; 0 for no bound), with ``start_method``
    ``"forkserver"`` (or ``"spawn"``). A call takes an idle worker or, when none is
    idle, starts one of its own (calls never queue behind each other); afterwards the
    worker goes back to the idle set, or is stopped when ``warm`` are idle already. A
    worker killed at a deadline or found dead is replaced in the background. ``codec``
    is how results come back: ``"plain"`` (plain data only; required for untrusted
    code) or ``"pickle"`` (trusted tools only: decoding a pickle runs code).

    Raises ``ValueError`` for a negative ``warm``, a bad ``start_method`` or ``codec``.
    """

    def __init__(
        self, warm: int = 2, *, heap_bytes: int = DEFAULT_HEAP_BYTES, start_method: str = "forkserver",
        codec: str = "plain",
    ) -> None:
        if warm < 0:
            raise ValueError(f"warm must be >= 0, not {warm}")
        if codec not in wire.CODECS:
            raise ValueError(f"codec must be one of {', '.join(wire.CODECS)}, not {codec!r}")
        self._codec = wire.CODECS[codec]
        self._config = WorkerConfig(codec, heap_bytes)
        self._ctx = context(start_method)
        self._warm = warm
        self._heap_bytes = heap_bytes
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # the keeper waits here: a worker lost, or stop
        self._warmed = threading.Condition(self._lock)  # wait_warm waits here: a worker became idle
        self._all: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._stopped = False
        self._counts = {"started": 0, "killed": 0, "died": 0, "retired": 0}
        self._pids: set[int] = set()
        self._finalizer = weakref.finalize(self, kill_groups, self._pids)
        self._keeper = threading.Thread(target=self._keep_warm, name="rho-worker-pool", daemon=True)
        self._keeper.start()

    # --- public ---------------------------------------------------------------------------

    def run(
        self,
        tool: Any,
        args: Mapping[str, Any],
        ctx: Mapping[str, Any],
        deadline: float,
        max_output_chars: int,
        *,
        name: str | None = None,
        started: float | None = None,
    ) -> ToolResult:
        """Run ``tool.run(args, ctx)`` in a worker process and return its result. Blocks.

        ``deadline`` and ``started`` are ``time.monotonic()`` instants (seconds);
        ``started`` (default: now) is where the result's ``duration_ms`` counts from.
        ``max_output_chars`` caps the result's text (it is encoded and capped in the
        worker). ``name`` is the tool's checked name, used in the result (default: the
        tool's ``__name__`` or type name; the tool's own ``name()`` is not called here).

        In the worker, ``ctx`` holds ``session_id``, ``call_id``, ``data_dir``,
        ``withheld`` and ``deadline`` from the given ``ctx``, ``deps`` only when it can be
        pickled (else it is left out), and ``cancel``, a :class:`CancelToken` never set:
        at the deadline the worker is killed instead. An ``async def run`` runs under
        ``asyncio.run`` with a ``wait_for`` to the deadline.

        The tool travels with cloudpickle. A module, class or function tool is pickled
        once per object and kept by each worker (by digest of its bytes); an instance is
        pickled on every call, so its current state travels. What ``run`` does to the
        tool's state in the worker stays there (the worker may serve the next call).

        Never raises for anything the tool does: the result is an error with kind
        ``timeout`` (the deadline passed: the worker's process group was killed),
        ``crashed`` (the worker died of a signal, named), ``exited`` (the worker exited,
        code named, 0 included; or the tool raised ``SystemExit``/``KeyboardInterrupt``:
        the worker survives), ``memory`` (past ``heap_bytes``), ``raised`` (the tool
        raised or returned ``Error``, or could not be pickled here, or its result could
        not be pickled there) or ``cancelled`` (the pool was stopped).
        """
        start = time.monotonic() if started is None else started
        call_id = str(ctx.get("call_id", ""))
        label = name if name is not None else short_name(tool)
        timeout_ms = round((deadline - start) * 1000)

        def failed(key: str, **fields: Any) -> ToolResult:
            return failure(key, call_id, label, (time.monotonic() - start) * 1000, **fields)

        if self._stopped:
            return failed("pool_stopped")
        if time.monotonic() >= deadline:
            return failed("timeout", timeout_ms=timeout_ms, consequence="it did not start")
        try:
            digest, tool_bytes = ship(tool)
        except Unshippable as exc:
            return failed("unshippable", problem=str(exc))
        fields = {
            "session_id": ctx.get("session_id"),
            "call_id": ctx.get("call_id"),
            "data_dir": ctx.get("data_dir"),
            "withheld": tuple(ctx.get("withheld", ())),
        }
        request = wire.CallRequest(
            digest, None, label, call_id, dict(args), fields, pickled_deps(ctx), deadline, timeout_ms, max_output_chars
        )
        try:
            bare = wire.encode_call(request)
        except wire.WireError as exc:
            return failed("unsendable", problem=str(exc))
        for attempt in range(_DELIVERY_ATTEMPTS):
            try:
                worker = self._take()
            except _Stopped:
                return failed("pool_stopped")
            except Exception as exc:
                return failed("no_worker", problem=describe_exception(exc))
            try:
                body = bare if digest in worker.tools else wire.encode_call(replace(request, tool_bytes=tool_bytes))
                worker.channel.send(wire.CALL, body, deadline)
                break
            except EOFError:  # it died while idle, before the call reached it: try another
                self._lose(worker, "died")
                if attempt == _DELIVERY_ATTEMPTS - 1:
                    return failed("workers_dying")
            except DeadlineReached:
                self._lose(worker, "killed")
                return failed("timeout", timeout_ms=timeout_ms, consequence=KILLED + " while the call was sent to it")
            except BaseException:
                self._lose(worker, "killed")
                raise
        try:
            result, retire = self._exchange(worker, request, tool_bytes, deadline)
        except DeadlineReached:
            self._lose(worker, "killed")
            return failed("timeout", timeout_ms=timeout_ms, consequence=KILLED)
        except EOFError:
            return self._died(worker, failed)
        except Malformed as exc:
            self._lose(worker, "killed")
            return failed("malformed_reply", problem=str(exc))
        except BaseException:
            self._lose(worker, "killed")
            raise
        self._release(worker, retire)
        return replace(result, call_id=call_id, name=label, duration_ms=(time.monotonic() - start) * 1000)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Kill every worker's process group and reap the workers, waiting up to
        ``timeout_s`` seconds in all. Calls still running get a ``cancelled`` result;
        later calls too. Idempotent."""
        until = time.monotonic() + timeout_s
        with self._lock:
            self._stopped = True
            workers = list(self._all)
            idle, self._idle = self._idle, []
            self._changed.notify_all()
            self._warmed.notify_all()
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.reap(max(0.0, until - time.monotonic()))
        for worker in idle:  # busy and starting workers are closed by the threads that own them
            worker.close()
        with self._lock:
            for worker in workers:
                self._forget_locked(worker)
        if self._keeper is not threading.current_thread():
            self._keeper.join(max(0.0, until - time.monotonic()))

    def stats(self) -> dict[str, int]:
        """Counts: ``alive`` (worker processes now), ``idle``, ``busy``, ``starting``
        (being started in the background); since the pool started: ``started``,
        ``killed`` (at a deadline, or for a bad reply), ``died`` (crashed, exited or
        out of memory on their own) and ``retired`` (stopped when surplus, or after
        running out of memory); workers stopped by :meth:`stop` are not counted."""
        with self._lock:
            return {
                "alive": len(self._all),
                "idle": len(self._idle),
                "busy": len(self._busy),
                "starting": self._starting,
                **self._counts,
            }

    def pids(self) -> list[int]:
        """The process ids of the worker processes alive now (each is also the id of the
        process group it leads)."""
        with self._lock:
            return sorted(w.pid for w in self._all)

    def wait_warm(self, timeout_s: float) -> bool:
        """Block until ``warm`` workers are idle (or the pool is stopped), at most
        ``timeout_s`` seconds; returns whether they are."""
        with self._lock:
            return self._warmed.wait_for(lambda: self._stopped or len(self._idle) >= self._warm, timeout_s) and (
                not self._stopped
            )

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- workers --------------------------------------------------------------------------

    def _spawn(self, busy: bool) -> _Worker:
        """Start a worker process (not waiting for it to be ready) and register it."""
        child = spawn(self._ctx, worker_child, self._config, ChildSetup(self._heap_bytes), name="rho-worker")
        worker = _Worker(child.proc, child.channel)
        with self._lock:
            if not self._stopped:
                self._all.add(worker)
                self._pids.add(worker.pid)
                self._counts["started"] += 1
                if busy:
                    self._busy.add(worker)
                return worker
        worker.kill()
        worker.reap()
        worker.close()
        raise _Stopped

    def _take(self) -> _Worker:
        dead: list[_Worker] = []
        try:
            with self._lock:
                if self._stopped:
                    raise _Stopped
                while self._idle:
                    worker = self._idle.pop()
                    if worker.healthy():
                        self._busy.add(worker)
                        return worker
                    dead.append(worker)
        finally:
            for worker in dead:
                self._lose(worker, "died")
        return self._spawn(busy=True)

    def _release(self, worker: _Worker, retire: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            if not (retire or self._stopped or len(self._idle) >= self._warm):
                self._idle.append(worker)
                self._warmed.notify_all()
                return
            if not self._stopped:
                self._counts["retired"] += 1
        worker.kill()
        worker.reap()
        worker.close()
        self._forget(worker)

    def _lose(self, worker: _Worker, how: Literal["killed", "died"]) -> None:
        """A worker killed at a deadline (or for a bad reply), or found dead: kill its
        group, let the keeper start a replacement at once, then reap it."""
        if how == "killed":
            worker.kill()
        else:
            kill_group(worker.pid, leader=not worker.reaped)
        with self._lock:
            if worker in self._all and not self._stopped:
                self._counts[how] += 1
            self._forget_locked(worker)
            self._changed.notify_all()
        if worker.reap() is None:
            worker.kill()
            worker.reap()
        worker.close()

    def _forget(self, worker: _Worker) -> None:
        with self._lock:
            self._forget_locked(worker)
            self._changed.notify_all()

    def _forget_locked(self, worker: _Worker) -> None:
        self._all.discard(worker)
        self._busy.discard(worker)
        self._pids.discard(worker.pid)
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)

    def _died(self, worker: _Worker, failed: Callable[..., ToolResult]) -> ToolResult:
        """The worker's pipe closed mid-call: find out how it ended."""
        code = worker.reap(_EXIT_GRACE_S)
        stopped = self._stopped
        self._lose(worker, "died")
        if stopped or worker.killed:
            return failed("pool_stopped_mid_call")
        if code is None:
            return failed("pipe_closed")
        if code == -signal.SIGKILL:
            return failed("oom_killed")
        if code < 0:
            return failed("worker_crashed", signal=signal_name(-code))
        return failed("worker_exited", code=code)

    def _exchange(
        self, worker: _Worker, request: wire.CallRequest, tool_bytes: bytes, deadline: float
    ) -> tuple[ToolResult, bool]:
        """Wait for the reply to the call just sent, until ``deadline``: ``(result,
        retire)``. Raises ``DeadlineReached``, ``EOFError`` or ``Malformed`` (a protocol
        violation: an unexpected or oversized frame, a result its codec refuses)."""
        digest = request.digest
        asked = greeted = False
        while True:
            tag, body = worker.channel.recv(deadline, wire.MAX_REPLY_BYTES)
            if tag == wire.READY and not greeted and not body:  # a worker started for this call
                greeted = True
                continue
            if tag == wire.NEED_TOOL and not asked and not body:  # once per call, and empty
                asked = True
                worker.channel.send(wire.CALL, wire.encode_call(replace(request, tool_bytes=tool_bytes)), deadline)
                continue
            if tag not in (wire.RESULT, wire.RESULT_RETIRE):
                raise Malformed(f"an unexpected {tag!r} frame of {len(body):,} bytes in reply to a call")
            try:
                result = self._codec.decode(body)
            except wire.WireError as exc:
                raise Malformed(f"a result that is not one: {exc}") from None
            worker.tools[digest] = None
            worker.tools.move_to_end(digest)
            while len(worker.tools) > TOOL_CACHE_SIZE:
                worker.tools.popitem(last=False)
            return result, tag == wire.RESULT_RETIRE

    # --- keeping warm ---------------------------------------------------------------------

    def _deficit(self) -> int:
        return self._warm - len(self._all) - self._starting

    def _keep_warm(self) -> None:
        """The background thread: keep ``warm`` workers alive, replacing lost ones."""
        backoff = 0.0
        while True:
            with self._lock:
                while not self._stopped and (self._deficit() <= 0 or backoff):
                    if backoff:
                        self._changed.wait(backoff)
                        backoff = 0.0
                    else:
                        self._changed.wait()
                if self._stopped:
                    return
                wanted = self._deficit()
                self._starting += wanted
            new: list[_Worker] = []
            failures = 0
            for _ in range(wanted):
                try:
                    new.append(self._spawn(busy=False))
                except _Stopped:
                    failures += 1
                except Exception:
                    failures += 1
                    logger.exception("worker pool: a worker process could not be started")
                finally:
                    with self._lock:
                        self._starting -= 1
            for worker in new:
                if not self._await_ready(worker):
                    failures += 1
            if failures:
                backoff = 0.5

    def _await_ready(self, worker: _Worker) -> bool:
        """Wait for a new worker's hello and make it idle (or stop it when calls started
        enough workers of their own meanwhile); whether it became ready."""
        try:
            ok = worker.channel.recv(time.monotonic() + _READY_TIMEOUT_S, wire.MAX_REPLY_BYTES) == (wire.READY, b"")
        except (DeadlineReached, EOFError, Malformed):
            ok = False
        surplus = False
        with self._lock:
            if ok and worker in self._all and not self._stopped:
                if len(self._idle) < self._warm:
                    self._idle.append(worker)
                    self._warmed.notify_all()
                    return True
                self._counts["retired"] += 1
                surplus = True
        if surplus:
            worker.kill()
            worker.reap()
            worker.close()
            self._forget(worker)
            return True
        if ok or self._stopped:  # stopped meanwhile: stop() kills it, its owner (here) closes it
            self._lose(worker, "killed")
            return True
        logger.warning("worker pool: worker {} did not become ready (exit code {})", worker.pid, worker.proc.exitcode)
        self._lose(worker, "died")
        return False
