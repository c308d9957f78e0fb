"""The host's handle on one worker process of a :class:`~rho_actors.sandbox.pool.WorkerPool`
(DESIGN §5; internal): :class:`WorkerHandle`, and how a call ended whose worker was killed
at its deadline (:func:`at_deadline`) or ended mid-call (:func:`died`, :func:`ended`).
The reply protocol is :mod:`rho_actors.sandbox.replies`'s.
"""

from __future__ import annotations

import select
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Final, Literal

from loguru import logger

from rho_actors.cancel import CancelToken
from rho_actors.otp.pidfds import PidFd
from rho_actors.results import KILLED
from rho_actors.sandbox.channel import Channel
from rho_actors.sandbox.confine.enclosure import Enclosure
from rho_actors.sandbox.processes import ServerWatch, close, mib, reap, signal_name
from rho_actors.sandbox.slots import WorkerSlots
from rho_actors.tool import ToolResult

__all__ = ["WorkerHandle", "at_deadline", "died", "ended"]

_REAP_TIMEOUT_S: Final = 5.0
_EXIT_GRACE_S: Final = 1.0
"""How long a worker that closed its pipe gets to finish exiting before it is killed."""


class WorkerHandle:
    """The host's record of one worker process: its process, pipe, :class:`Enclosure`
    (confined or tree-contained workers), slot, scope, the tools it holds (by digest),
    and whether it was killed, reaped or closed. Made and owned by a
    :class:`~rho_actors.sandbox.pool.WorkerPool`."""

    __slots__ = (
        "_closing", "_looks", "_reap_lock", "_scope", "began", "channel", "closed", "doomed", "enclosure", "env_key",
        "exitcode", "held", "idle_since", "killed", "pid", "proc", "ran_code", "reaped", "server", "session", "slots",
        "tools",
    )

    def __init__(
        self, proc: Any, channel: Channel, enclosure: Enclosure | None, slots: WorkerSlots | None,
        env_key: Hashable = None, server: ServerWatch | None = None, held: PidFd | None = None,
    ) -> None:
        self.began = time.monotonic()  # (made as its process is spawned) how long its start takes counts from here
        self.proc = proc
        self.server = server  # the fork server it came from: its death takes the worker with it
        self.pid: int = proc.pid
        self.held = held if held is not None else PidFd.open(self.pid)  # kills its group, never one given its pid since
        self.channel = channel
        self.enclosure = enclosure
        self.slots = slots
        self.env_key = env_key
        self._scope: Hashable = None
        self.session: Hashable = None  # the session whose call it runs now (busy), for the cap's shares
        self.doomed = False  # its scope is gone (its tool unregistered or registered again): retire when free
        self.idle_since = 0.0
        self.tools: OrderedDict[bytes, None] = OrderedDict()
        # a tool's code may have run in it (a CALL or LOAD frame was written to it): what is left
        # unread in its pipe then proves nothing (that code can peek at frames it leaves unread)
        self.ran_code = False
        self.killed = False
        self.reaped = False
        self.closed = False
        self.exitcode: int | None = None
        self._reap_lock = threading.Lock()
        self._closing = threading.Event()  # set once closed (its cgroup and private folder removed)
        # what healthy() looks at in one poll: its pipe, its end as its fork server reports it
        # (once reaped there), its end as the kernel has it (its pidfd: readable from its exit
        # on, before that report), its fork server's end
        self._looks = select.poll()
        for fd in (channel.fd, channel.sentinel, self.held.fd, server.fd if server is not None else None):
            if fd is not None and fd >= 0:
                self._looks.register(fd, select.POLLIN)

    @property
    def scope(self) -> Hashable:
        """The scope this worker serves (``None``: a fresh spare). Setting a
        ``(tool, session)`` scope names the worker so in its logged output."""
        return self._scope

    @scope.setter
    def scope(self, scope: Hashable) -> None:
        if scope == self._scope:  # named so already (set again at each of its calls)
            return
        self._scope = scope
        output = getattr(self.proc, "output", None)
        if output is not None and scope is not None:
            if isinstance(scope, tuple) and len(scope) >= 2:  # (tool, [registration,] session)
                output.label = f"tool {scope[0]} session {scope[-1]} (pid {self.pid})"
            else:
                output.label = f"worker of {scope} (pid {self.pid})"

    def healthy(self) -> bool:
        """Whether an idle worker is still running, has sent nothing unasked, and the
        fork server it came from still runs (its end kills the worker: a parent-death
        signal, or the fork server's kill of its tree): one ``poll`` of its pipe, its
        sentinel, its pidfd and its fork server's. The pidfd is what knows of a worker
        killed while idle as soon as it exited: its sentinel only once the fork server
        reaped it and reported so, and a call written to it meanwhile (its pipe's end
        is kept open by the pool's copy) would end ``killed_outside`` when a tool's code
        ran in it before (:meth:`~rho_actors.sandbox.replies.OpenCall.may_have_begun`)."""
        if self.reaped or self.channel.has_unread() or self._looks.poll(0):
            return False
        server = self.server  # without a pidfd, its end is known only as it was found
        return server is None or server.fd is not None or not server.gone()

    def server_gone(self) -> bool:
        """Whether the fork server this worker came from has ended."""
        return self.server is not None and self.server.gone()

    def pace(self, busy: bool) -> None:
        """It runs a call (``busy``) or is idle: how often its enclosure watches its cgroup
        (:meth:`~rho_actors.sandbox.confine.enclosure.Enclosure.pace`)."""
        if self.enclosure is not None:
            self.enclosure.pace(busy)

    def kill(self) -> None:
        self.killed = True
        self.kill_tree()

    def kill_tree(self) -> None:
        """SIGKILL the worker and everything it started (its group through its pidfd
        without an enclosure: the group it led, never a group given its pid since)."""
        if self.enclosure is not None:
            self.enclosure.kill()
        else:
            self.held.kill(group=True)

    def reap(self, timeout_s: float = _REAP_TIMEOUT_S) -> int | None:
        """Wait up to ``timeout_s`` seconds for the process to end and be reaped (by the
        fork server that started it: its report of the exit says so); its exit code
        (None: not reaped by then). Another thread reaping it meanwhile is waited for
        within the same bound."""
        until = time.monotonic() + max(0.0, timeout_s)
        if not self._reap_lock.acquire(timeout=max(0.0, timeout_s)):
            return self.exitcode if self.reaped else None
        try:
            if self.reaped:
                return self.exitcode
            code = reap(self.proc, max(0.0, until - time.monotonic()))
            if code is None:
                return None
            self.exitcode, self.reaped = code, True
            return code
        finally:
            self._reap_lock.release()

    def close(self) -> None:
        """Release the pipe and the process handle, remove the enclosure (its cgroup and
        private folder) and give the worker's slot back; only by the thread that owns the
        worker (a thread polling them must never see their descriptors reused). Each step
        runs whatever an earlier one raised: an error is logged, not raised, so no caller
        (the pool's keeper, its stop) is cut short by one worker; an interrupt (a signal
        handler's ``KeyboardInterrupt``) is raised once every step has run."""
        if self.closed:
            return
        self.closed = True
        interrupts: list[BaseException] = []
        try:
            self._step("closing its pipe", self.channel.close, interrupts)
            if self.reaped:
                self._step("releasing its process handle", lambda: close(self.proc), interrupts)
            if self.enclosure is not None:
                self._step("removing its cgroup and private folder", self.enclosure.remove, interrupts)
            if self.slots is not None:
                self._step("giving its slot back", self.slots.release, interrupts)
            self._step("closing its pidfd", self.held.close, interrupts)
        finally:
            self._closing.set()
        if interrupts:
            raise interrupts[0]

    def _step(self, what: str, step: Callable[[], object], interrupts: list[BaseException]) -> None:
        """One step of :meth:`close`: an error it raises is logged, an interrupt kept in
        ``interrupts``."""
        try:
            step()
        except Exception:
            logger.exception("worker {}: {} failed; its close goes on", self.pid, what)
        except BaseException as exc:
            interrupts.append(exc)

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for :meth:`close` (by the thread that owns
        the worker) to have finished; whether it has."""
        return self._closing.wait(max(0.0, timeout_s))


def at_deadline(
    worker: WorkerHandle, failed: Callable[..., ToolResult], timeout_ms: int, heap_bytes: int,
    lose: Callable[[WorkerHandle, Literal["killed", "died"]], None],
) -> ToolResult:
    """The call's deadline passed: kill the worker's tree (``lose``: the pool's way);
    ``memory`` if its bound was hit, else ``timeout``."""
    enclosure = worker.enclosure
    memory_hit = enclosure is not None and enclosure.memory_bound_hit()
    lose(worker, "killed")
    if enclosure is not None and memory_hit:
        return failed("memory_tree", heap=mib(heap_bytes), bound=enclosure.memory_bound_words)
    return failed("timeout", timeout_ms=timeout_ms, consequence=KILLED)


def died(
    worker: WorkerHandle, failed: Callable[..., ToolResult], cancel: CancelToken | None, heap_bytes: int,
    stopped: Callable[[], bool], lose: Callable[[WorkerHandle, Literal["killed", "died"]], None],
) -> ToolResult:
    """The worker's pipe closed mid-call: find out how it ended (killed by ``cancel``,
    among others; ``stopped()``: whether its pool was stopped; its fork server ended,
    taking it along: ``worker_server_gone``, ``unavailable``, never the tool's fault) and
    let it go (``lose``)."""
    if cancel is not None and cancel.cancelled and worker.killed:
        lose(worker, "killed")
        return failed("cancelled_killed", reason=cancel.reason)
    code = worker.reap(_EXIT_GRACE_S)
    was_stopped = stopped()
    enclosure = worker.enclosure
    memory_hit = enclosure is not None and enclosure.memory_bound_hit()
    lose(worker, "died")
    if not (was_stopped or worker.killed or memory_hit) and worker.server is not None and worker.server.gone():
        return failed("worker_server_gone", server=worker.server.pid)  # not the tool's doing
    return ended(worker, code, failed, heap_bytes, stopped=was_stopped, memory_hit=memory_hit)


def ended(
    worker: WorkerHandle, code: int | None, failed: Callable[..., ToolResult], heap_bytes: int, *,
    stopped: bool, memory_hit: bool,
) -> ToolResult:
    """The result of a call whose worker closed its pipe mid-call and ended with exit
    ``code`` (``None``: still running when given up on): ``pool_stopped_mid_call`` (the
    pool was stopped, or it killed the worker), ``memory_tree`` (its tree hit its memory
    bound, ``heap_bytes``), ``pipe_closed``, ``killed_outside`` (a ``SIGKILL`` the pool
    did not send), ``worker_crashed`` (another signal) or ``worker_exited``."""
    enclosure = worker.enclosure
    if stopped or worker.killed:
        return failed("pool_stopped_mid_call")
    if enclosure is not None and memory_hit:
        return failed("memory_tree", heap=mib(heap_bytes), bound=enclosure.memory_bound_words)
    if code is None:
        return failed("pipe_closed")
    if code == -signal.SIGKILL:
        return failed("killed_outside", signal=signal_name(signal.SIGKILL))
    if code < 0:
        return failed("worker_crashed", signal=signal_name(-code))
    return failed("worker_exited", code=code)
