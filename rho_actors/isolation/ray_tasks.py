"""``ray`` isolation: tool calls as Ray tasks, stateful tool servers as Ray actors, both
under rho's deadlines and supervision (DESIGN §5). Needs the ``ray`` extra.

A call runs as one Ray task (``max_retries=0``) with its tool's resources
(:class:`RayResources`), on the sandbox's kernel: the tool is pickled as for a worker
process (:mod:`rho_actors.sandbox.shipping`, once per version) and put in Ray's object
store once per digest; the call goes as a worker's ``CALL`` frame
(:func:`rho_actors.sandbox.call_request`), and the task runs it with the worker's own
code (:func:`rho_actors.sandbox.worker.serve_request`: the tool kept by digest, the same
ctx, the same result builders; a worker that lacks the tool says so, and the call is sent
again with a reference to the bytes). The reply is checked by the plain codec
(:class:`rho_actors.sandbox.wire.PlainCodec`) and capped by the host; every text is a
:data:`rho_actors.results.TEXTS` key. Ray has no per-task
timeout, so the host keeps the deadline: at the deadline the result is ``timeout`` and the
task is force-cancelled (``ray.cancel(ref, force=True)`` kills its worker process).

Untrusted tools never run on Ray: Ray unpickles whatever a worker returns (and a tool
could take over its worker), so a compromised worker could forge objects in the host.
``ActorSystem.register`` refuses them (``RayIsolation.untrusted_refused``).

Stateful tool servers on Ray are in :mod:`rho_actors.integrations.ray.servers`.

Example::

    runtime = RayRuntime({"address": "ray://head:10001"})    # or RayRuntime() for a local Ray
    result = run_on_ray(runtime, tool, {"q": 1}, {"call_id": "c1"}, time.monotonic() + 5,
                        CancelToken(), 20_000, RayResources(num_cpus=2))
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import itertools
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.exceptions
from loguru import logger

from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception
from rho_actors.isolation.ray_connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
    Connection,
    RayUnreachable,
    loopback_only,
)
from rho_actors.isolation.ray_nodes import NodeTable
from rho_actors.isolation.ray_resources import RayResources
from rho_actors.otp.failure_runs import FailureRun
from rho_actors.otp.timers import Timers
from rho_actors.results import RAY_CANCELLED, capped, failure
from rho_actors.sandbox import (
    CODECS,
    NEED_TOOL,
    RESULT,
    RESULT_RETIRE,
    ShippedTools,
    Unshippable,
    WireError,
    WorkerCall,
    WorkerConfig,
    call_request,
    decode_call,
    encode_call,
    serve_request,
)
from rho_actors.tool import ToolResult, is_untrusted

__all__ = [
    "RayResources",
    "release_default",
    "RayUnreachable",
    "RayRuntime",
    "default_runtime",
    "run_call",
    "run_on_ray",
]


# --- the runtime ----------------------------------------------------------------------------


@dataclass(slots=True)
class _InFlight:
    call_id: str
    tool: str
    task_id: str
    started: float
    deadline: float
    ref: Any = None
    demand: dict[str, float] = field(default_factory=dict)
    node_id: str = ""  # the node it runs on, once its task has begun
    pid: int = 0
    verdict: tuple[str, dict[str, Any]] | None = None  # set by the node watcher: the call's result key


_loopback_only = loopback_only  # the name tests and benchmarks use
_WATCH_S = 1.0  # how often the node watcher looks while calls or servers are on Ray
_NODE_ID = re.compile(r"node ID: ([0-9a-f]{56})")
_CONFIG_KEYS = ("address", "namespace", "runtime_env", "num_cpus", "num_gpus", "resources", "connect_timeout_s")


class RayRuntime:
    """One connection to Ray for a host (Ray's client state is per process).

    ``config`` is ``ActorSystem(ray={...})``: ``address`` (``"auto"``, ``"ray://host:10001"``
    or ``"host:6379"``) connects to a running cluster; without it a local Ray of its own
    is started (or a running one in this process is attached) on this host, never another
    cluster of this machine that a plain ``ray.init()`` would join (``RAY_ADDRESS``, when
    set, is followed), with no dashboard,
    bound to loopback only (see :func:`~rho_actors.isolation.ray_connection.loopback_only`),
    with ``num_cpus``, ``num_gpus`` and ``resources`` (custom resources by name) from the
    config when given. ``namespace`` and ``runtime_env`` go to ``ray.init``;
    ``connect_timeout_s`` (default 30, or 120 to start a local Ray) bounds connecting, which runs in a thread of its own
    (:class:`~rho_actors.isolation.ray_connection.Connection`): a caller waits for it
    within its own bound and gets
    :class:`~rho_actors.isolation.ray_connection.RayUnreachable` past it. ``timers``
    serve the servers' liveness pings (default: a timer thread of its own).

    Once connected, a node watcher thread keeps :attr:`nodes` (the live nodes, see
    :class:`~rho_actors.isolation.ray_nodes.NodeTable`) while calls or servers are on
    Ray: a call running on a node found lost is ended ``crashed`` naming the node, a call
    still queued that no live node can hold is ended ``unavailable``, and a server whose
    Ray actor was on it is told (it goes down and its supervisor restarts it elsewhere).

    Raises ``ValueError`` naming unknown settings.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, *, timers: Timers | None = None) -> None:
        self.config = dict(config or {})
        unknown = set(self.config) - set(_CONFIG_KEYS)
        if unknown:
            raise ValueError(f"unknown ray settings {sorted(unknown)}: expected {', '.join(_CONFIG_KEYS)}")
        timeout = self.config.get("connect_timeout_s",
                                  DEFAULT_CONNECT_TIMEOUT_S if self.config.get("address") else DEFAULT_START_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"ray setting connect_timeout_s must be seconds > 0, got {timeout!r}")
        self._lock = threading.Lock()
        self.connection = Connection({k: v for k, v in self.config.items() if k != "connect_timeout_s"},
                                     float(timeout), on_connected=self._on_connected)
        self.nodes = NodeTable(probe=not str(self.config.get("address", "")).startswith("ray://"))
        self._own_timers = timers is None
        self._timers = timers
        self._shipped = ShippedTools()
        self._by_digest: OrderedDict[bytes, Any] = OrderedDict()
        self._remotes: dict[str, tuple[Any, Any]] = {}
        self._in_flight: dict[int, _InFlight] = {}
        self._keys = itertools.count()
        self._servers: dict[str, Any] = {}  # rho_actors.integrations.ray.servers.RayServer by actor urn
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._failed_rounds = FailureRun("the Ray node watcher")  # its rounds that raised in a row (logged sparsely)
        self._closed = threading.Event()
        self._round = threading.Lock()  # held by the watcher during a round
        self._watcher: threading.Thread | None = None
        self.tasks_total = 0
        self.nodes_lost = 0

    @property
    def owns_ray(self) -> bool:
        """Whether this runtime called ``ray.init`` (and so disconnects at :meth:`shutdown`)."""
        return self.connection.owns_ray

    @property
    def closing(self) -> bool:
        """Whether :meth:`shutdown` has begun (no new task is submitted)."""
        return self._closing.is_set()

    @property
    def timers(self) -> Timers:
        """The timer service of the servers' liveness pings."""
        with self._lock:
            if self._timers is None:
                self._timers = Timers("rho_actors-ray-timers")
            return self._timers

    def start_connecting(self) -> None:
        """Begin connecting in the background (see :class:`Connection`); never blocks."""
        self.connection.start()

    def connect(self, wait_s: float | None = None) -> None:
        """Connect to (or start) Ray, waiting at most ``wait_s`` seconds (default: the
        ``connect_timeout_s``); at once when connected. Raises
        :class:`~rho_actors.isolation.ray_connection.RayUnreachable` naming why not."""
        self.connection.wait(self.connection.connect_timeout_s if wait_s is None else wait_s)

    def _on_connected(self) -> None:
        """In the connecting thread, once connected: it becomes the node watcher and
        lives until :meth:`shutdown` (Ray's local processes die with the thread that
        started them: they are started with ``PR_SET_PDEATHSIG``)."""
        with self._lock:
            if self._watcher is not None or self._closing.is_set():
                return
            self._watcher = threading.current_thread()
        self._watch()

    def shutdown(self, timeout_s: float = 10.0) -> list[int]:
        """Leave Ray as this runtime found it, within about ``timeout_s`` seconds: stop
        the node watcher and the timers it owns, kill the Ray actors of servers still
        registered, and disconnect; a local Ray it started is stopped with all its
        processes (a call still waiting then gets a ``crashed`` or ``cancelled`` result).
        Returns the pids of Ray processes that outlived that (normally none)."""
        self._closing.set()
        self._wake.set()
        until = time.monotonic() + timeout_s
        got_round = self._round.acquire(timeout=timeout_s)  # no watcher round runs into ray.shutdown()
        with self._lock:
            flights = list(self._in_flight.values())
        for flight in flights:  # calls still on Ray: cancelled, and their threads out of Ray's API
            if flight.verdict is None:
                flight.verdict = ("cancelled", {"reason": f"the system is stopping; {RAY_CANCELLED}"})
            _force_cancel(flight.ref)
        while self._in_flight and time.monotonic() < until:
            time.sleep(0.01)
        if self._own_timers and self._timers is not None:
            self._timers.stop()
        with self._lock:
            servers = list(self._servers.values())
        for server in servers:
            handle = getattr(server, "handle", None)
            if handle is not None:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception as exc:
                    logger.debug("ray.kill of a server's actor failed: {}", describe_exception(exc))
        left = self.connection.close(max(1.0, until - time.monotonic()))
        self._closed.set()
        if got_round:
            self._round.release()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout_s)
        with _default_lock:
            if _default and _default[0] is self:
                _default.clear()  # the next default runtime connects anew
                _holders[0] = 0
        return left

    # --- feasibility and lost nodes -----------------------------------------------------

    def infeasible(self, resources: RayResources) -> str | None:
        """Why no live node of the cluster could ever run a call needing ``resources`` (by
        each live node's total resources, refreshed every 2 s; nodes found lost do not
        count), or None."""
        return self.nodes.infeasible(resources.demand())

    def node_lost(self, node_id: str, why: str) -> None:
        """A call found ``node_id`` lost (Ray's ``NodeDiedError``): count it out of
        placement at once and have the watcher end what else was there."""
        if self.nodes.mark_lost(node_id, why):
            with self._lock:
                self.nodes_lost += 1
            logger.warning("Ray {} was lost: {}", self.nodes.describe(node_id), why)
        self._wake.set()

    def _watch(self) -> None:
        while True:
            woken = self._wake.wait(_WATCH_S)
            self._wake.clear()
            with self._round:
                if self._closing.is_set():
                    break
                with self._lock:
                    busy = bool(self._in_flight or self._servers)
                if busy or woken:
                    try:
                        self._watch_round()
                    except Exception:  # this thread holds a local Ray's processes (they die with it): it goes on
                        if FailureRun.logged(count := self._failed_rounds.failed()[0]):  # 1st, 2nd, 4th...
                            logger.exception("a round of the Ray node watcher failed; it watches on{}",
                                             FailureRun.so_far(count))
                    else:
                        self._failed_rounds.passed()
        self._closed.wait()  # this thread may have started a local Ray: it ends after ray.shutdown()

    def _watch_round(self) -> None:
        try:
            newly = self.nodes.refresh()
        except Exception as exc:
            logger.debug("reading Ray's node table failed: {}", describe_exception(exc))
            return
        if newly:
            with self._lock:
                self.nodes_lost += len(newly)
            for node_id in newly:
                logger.warning("Ray {} was lost: {}", self.nodes.describe(node_id), self.nodes.lost()[node_id])
        self._sweep()

    def _sweep(self) -> None:
        """End the calls on lost nodes (``crashed``) and the queued calls no live node can
        hold (``unavailable``), and tell the servers on lost nodes."""
        lost = self.nodes.lost()
        with self._lock:
            flights = [f for f in self._in_flight.values() if f.verdict is None]
            servers = list(self._servers.values())
        for flight in flights:
            if flight.node_id:
                if flight.node_id not in lost:
                    continue
                verdict = ("ray_node_lost", {"node": self.nodes.describe(flight.node_id),
                                             "cause": lost[flight.node_id]})
            else:
                problem = self.nodes.infeasible(flight.demand)
                if problem is None:
                    continue
                verdict = ("ray_infeasible", {"problem": problem})
            flight.verdict = verdict
            _force_cancel(flight.ref)
        for server in servers:
            node_id = getattr(server, "node_id", "")
            if node_id in lost:
                server.node_lost(f"its Ray {self.nodes.describe(node_id)} was lost ({lost[node_id]})")

    # --- shipping -----------------------------------------------------------------------

    def ship(self, tool: Any, version: object = None) -> tuple[bytes, Any]:
        """``(digest, object ref)`` of the tool's pickled bytes in Ray's object store, pickled
        as for worker processes (:class:`~rho_actors.sandbox.shipping.ShippedTools`: once per
        tool version; an instance on every call) and put once per digest. Raises
        :class:`~rho_actors.sandbox.shipping.Unshippable` naming why."""
        digest, data = self._shipped.ship(tool, version)
        with self._lock:
            ref = self._by_digest.get(digest)
            if ref is None:
                ref = ray.put(data)
                self._by_digest[digest] = ref
                while len(self._by_digest) > 256:
                    self._by_digest.popitem(last=False)
            else:
                self._by_digest.move_to_end(digest)
        return digest, ref

    def _remote(self, resources: RayResources) -> tuple[Any, Any]:
        """The task functions (without and with the tool) with ``resources`` as options,
        kept off the nodes found lost (see :meth:`NodeTable.avoid`)."""
        options = resources.options()
        avoid = self.nodes.avoid()
        if avoid:
            options["label_selector"] = avoid
        key = json.dumps(options, sort_keys=True, default=repr)
        remote = self._remotes.get(key)
        if remote is None:
            remote = (_execute.options(max_retries=0, retry_exceptions=False, **options),
                      _execute_shipping.options(max_retries=0, retry_exceptions=False, **options))
            self._remotes[key] = remote
        return remote

    # --- operator view ------------------------------------------------------------------

    def _track(self, call_id: str, tool: str, ref: Any, started: float, deadline: float,
               demand: dict[str, float]) -> int:
        key = next(self._keys)
        inner = getattr(ref, "_generator_ref", ref)
        task_id = inner.task_id().hex() if hasattr(inner, "task_id") else ""
        with self._lock:
            self._in_flight[key] = _InFlight(call_id, tool, task_id, started, deadline, ref, demand)
            self.tasks_total += 1
        return key

    def _began(self, key: int, node_id: str, pid: int) -> _InFlight | None:
        """The task of ``key`` runs on ``node_id`` (its worker: ``pid``); wakes the
        watcher when that node is already known lost."""
        with self._lock:
            flight = self._in_flight.get(key)
            if flight is not None:
                flight.node_id, flight.pid = node_id, pid
        if flight is not None and self.nodes.is_lost(node_id):
            self._wake.set()
        return flight

    def _untrack(self, key: int) -> _InFlight | None:
        with self._lock:
            return self._in_flight.pop(key, None)

    def tasks(self) -> list[dict[str, Any]]:
        """Ray tasks in flight, oldest first: ``call_id``, ``tool``, ``task_id`` (hex),
        ``node_id`` (hex; ``""`` while queued) and ``pid`` of the worker running it,
        ``ms_running`` and ``ms_left`` to the deadline."""
        now = time.monotonic()
        with self._lock:
            running = list(self._in_flight.values())
        return [{"call_id": t.call_id, "tool": t.tool, "task_id": t.task_id, "node_id": t.node_id, "pid": t.pid,
                 "ms_running": round((now - t.started) * 1000), "ms_left": max(0, round((t.deadline - now) * 1000))}
                for t in running]

    def add_server(self, key: str, server: Any) -> None:
        """Count a live server (an object with ``describe() -> dict``) in :meth:`actors`."""
        with self._lock:
            self._servers[key] = server

    def remove_server(self, key: str) -> None:
        """Stop counting the server added as ``key`` (no-op when absent)."""
        with self._lock:
            self._servers.pop(key, None)

    def actors(self) -> list[dict[str, Any]]:
        """Ray actors of the live :class:`rho_actors.integrations.ray.servers.RayServer` s: ``server``
        (its rho actor urn), ``class``, ``actor_id`` (hex), ``node_id`` (hex), ``pid`` and
        ``calls`` served."""
        with self._lock:
            servers = list(self._servers.values())
        return [server.describe() for server in servers]

    def stats(self) -> dict[str, int]:
        """Counters: ``ray_tasks_running``, ``ray_tasks_total``, ``ray_actors`` and
        ``ray_nodes_lost`` (nodes found lost while connected)."""
        with self._lock:
            return {"ray_tasks_running": len(self._in_flight), "ray_tasks_total": self.tasks_total,
                    "ray_actors": len(self._servers), "ray_nodes_lost": self.nodes_lost}


# --- one call ------------------------------------------------------------------------------


_worker_tools: OrderedDict[bytes, Any] = OrderedDict()  # a Ray worker's tools by digest, as a worker process's
_TASK_CONFIG = WorkerConfig(codec="plain", heap_bytes=None)


@ray.remote(max_retries=0, num_returns="streaming")
def _execute(body: bytes, seconds_left: float) -> Iterator[Any]:
    """The Ray task of one call, a stream of two items: ``(node id, pid)`` where it
    began, then the reply frame. ``body`` is the call's ``CALL`` frame (a
    :class:`~rho_actors.sandbox.CallRequest`, its ``deadline`` replaced by
    ``seconds_left`` from the task's start, since clocks differ between hosts). The reply
    is that of :func:`~rho_actors.sandbox.worker.serve_request`: ``NEED_TOOL`` when this
    worker lacks the tool, else the result in the plain codec."""
    yield _here()
    yield _run_task(body, seconds_left, None)


@ray.remote(max_retries=0, num_returns="streaming")
def _execute_shipping(body: bytes, seconds_left: float, holder: list[Any]) -> Iterator[Any]:
    """:func:`_execute` for a worker that lacked the tool: ``holder`` is ``[ref]`` of its
    pickled bytes in the object store (a nested ref: fetched only here)."""
    yield _here()
    yield _run_task(body, seconds_left, holder)


def _here() -> tuple[str, int]:
    return ray.get_runtime_context().get_node_id(), os.getpid()


def _run_task(body: bytes, seconds_left: float, holder: list[Any] | None) -> tuple[bytes, bytes]:
    request = dataclasses.replace(decode_call(body), deadline=time.monotonic() + seconds_left)
    if holder is not None and request.digest not in _worker_tools:
        request = dataclasses.replace(request, tool_bytes=ray.get(holder[0]))
    return serve_request(request, _worker_tools, _TASK_CONFIG, CODECS["plain"])


_LOST = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.LocalRayletDiedError,
         ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError, ray.exceptions.RaySystemError)


class _Late(Exception):
    """The deadline passed before the task's next item."""


def _next_item(stream: Any, deadline: float) -> Any:
    """The next item of a task's stream by ``deadline``; raises :class:`_Late`, or the
    task's error (Ray's)."""
    ready, _ = ray.wait([stream], timeout=max(0.0, deadline - time.monotonic()))
    if not ready:
        raise _Late
    try:
        ref = next(stream)
    except StopIteration:
        raise WireError("the task ended without a reply") from None
    return ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))


def _prepare(runtime: RayRuntime, call: WorkerCall, cancel: CancelToken, resources: RayResources,
             failed: Callable[..., ToolResult]) -> tuple[bytes, Any] | ToolResult:
    """The call's ``CALL`` frame and its tool's object ref, once Ray is reached (within
    the deadline) and the resources found feasible; or the result saying why not."""
    if is_untrusted(call.tool) or call.untrusted:
        return failed("ray_untrusted")
    if cancel.cancelled:
        return failed("cancelled", reason=cancel.reason)
    try:
        runtime.connect(call.deadline - time.monotonic())
        problem = runtime.infeasible(resources)
    except RayUnreachable as exc:
        return failed("ray_unreachable", problem=str(exc))
    except Exception as exc:
        return failed("ray_unreachable", problem=describe_exception(exc))
    if problem is not None:
        return failed("ray_infeasible", problem=problem)
    try:
        digest, tool_ref = runtime.ship(call.tool, call.version)
    except Unshippable as exc:
        return failed("ray_unshippable", problem=str(exc))
    try:
        return encode_call(call_request(digest, call)), tool_ref
    except WireError as exc:
        return failed("ray_unsendable", problem=str(exc))


def run_on_ray(
    runtime: RayRuntime,
    tool: Any,
    args: Mapping[str, Any],
    ctx: Mapping[str, Any],
    deadline: float,
    cancel: CancelToken,
    max_output_chars: int,
    resources: RayResources,
    *,
    name: str | None = None,
    started: float | None = None,
    version: object = None,
    context: contextvars.Context | None = None,
) -> ToolResult:
    """Run ``tool.run(args, ctx)`` as one Ray task: the call made by
    :meth:`WorkerCall.of <rho_actors.sandbox.WorkerCall.of>` from these parts
    (``call_id`` from ``ctx``; ``deadline`` and ``started``, default now, are
    ``time.monotonic()`` instants; ``name`` by default the tool's ``__name__`` or type
    name), then :func:`run_call`. Blocks; never raises for anything the tool or Ray does."""
    call = WorkerCall.of(tool, args, ctx, deadline, max_output_chars, name=name, started=started, cancel=cancel,
                         version=version, context=context)
    return run_call(runtime, call, resources)


def run_call(runtime: RayRuntime, call: WorkerCall, resources: RayResources) -> ToolResult:
    """Run one call (:class:`~rho_actors.sandbox.WorkerCall`) as one Ray task with
    ``resources`` and return its result. Blocks (call it from the call's own thread);
    never raises for anything the tool or Ray does.

    The call goes as a worker process's would (:func:`~rho_actors.sandbox.call_request`:
    the portable part of ``call.ctx``, ``deps`` when picklable, the plain values of
    ``call.context``; the tool shipped once per ``call.version``) and runs in the task
    through the worker's own code (:func:`~rho_actors.sandbox.worker.serve_request`), where
    ``ctx`` also holds ``deadline`` (an instant of the task's host) and ``cancel``, a token
    never set (the task is killed instead). The reply is checked by the plain codec, as an
    untrusted worker's is; ``duration_ms`` counts from ``call.started``.

    The result is the tool's own (``ok``, ``raised``, ``exited``), or an error with kind
    ``timeout`` (the deadline passed: the task was force-cancelled, its worker killed),
    ``cancelled`` (``call.cancel`` was set: the task was force-cancelled too), ``crashed``
    (the worker or its node was lost: the Ray error, or the lost node, is named; or the
    reply was malformed), ``memory`` (Ray's memory monitor killed the worker) or
    ``unavailable`` (an untrusted tool; no live node of the cluster can hold the
    resources, checked again when a node is lost while the call waits in Ray's queue; the
    runtime env could not be set up; Ray is not reachable by the deadline).
    """
    start, deadline, timeout_ms = call.started, call.deadline, call.timeout_ms
    call_id, label, max_output_chars = call.call_id, call.name, call.max_output_chars
    cancel = call.cancel if call.cancel is not None else CancelToken()

    def failed(key: str, **fields: Any) -> ToolResult:
        return failure(key, call_id, label, (time.monotonic() - start) * 1000, **fields)

    prepared = _prepare(runtime, call, cancel, resources, failed)
    if isinstance(prepared, ToolResult):
        return prepared
    body, tool_ref = prepared
    bare, shipping = runtime._remote(resources)
    holder: list[Any] | None = None  # the tool goes along only to a worker that lacks it
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return failed("timeout", timeout_ms=timeout_ms, consequence="it did not start")
        if runtime.closing:
            return failed("ray_not_running")
        try:
            stream = bare.remote(body, left) if holder is None else shipping.remote(body, left, holder)
        except Exception as exc:
            return failed("ray_refused", problem=describe_exception(exc))
        key = runtime._track(call_id, label, stream, start, deadline, resources.demand())
        hook = functools.partial(_force_cancel, stream)
        cancel.add_inline_callback(hook)  # taken off once this attempt is over: a token may outlive many calls
        flight: _InFlight | None = None
        try:
            node_id, pid = _next_item(stream, deadline)
            runtime._began(key, str(node_id), int(pid))
            tag, reply = _next_item(stream, deadline)
        except (_Late, ray.exceptions.GetTimeoutError):
            flight = runtime._untrack(key)
            _force_cancel(stream)
            if flight is not None and flight.verdict is not None:
                return failed(flight.verdict[0], **flight.verdict[1])
            return failed("timeout", timeout_ms=timeout_ms, consequence=RAY_CANCELLED)
        except BaseException as exc:
            flight = runtime._untrack(key)
            if flight is not None and flight.verdict is not None:
                return failed(flight.verdict[0], **flight.verdict[1])
            return _failure(exc, cancel, failed, runtime, flight)
        finally:
            runtime._untrack(key)
            cancel.remove_callback(hook)
        if tag != NEED_TOOL or holder is not None:
            break
        holder = [tool_ref]
    try:
        if tag not in (RESULT, RESULT_RETIRE) or type(reply) is not bytes:
            raise WireError(f"an unexpected reply frame {tag!r}")
        result = CODECS["plain"].decode(reply)
    except (WireError, ValueError) as exc:
        return failed("ray_malformed", problem=str(exc))
    return dataclasses.replace(capped(result, max_output_chars), call_id=call_id, name=label,
                               duration_ms=(time.monotonic() - start) * 1000)


def _force_cancel(ref: Any) -> None:
    if ref is None:
        return
    try:
        ray.cancel(ref, force=True)
    except Exception as exc:  # finished already, or Ray is gone
        logger.debug("ray.cancel of {} failed: {}", ref, describe_exception(exc))


def _failure(exc: BaseException, cancel: CancelToken, failed: Callable[..., ToolResult], runtime: RayRuntime,
             flight: _InFlight | None) -> ToolResult:
    cause = f"{type(exc).__name__}: {_first_line(exc)}"
    if cancel.cancelled and isinstance(exc, (ray.exceptions.TaskCancelledError, *_LOST)):
        return failed("cancelled", reason=f"{cancel.reason}; {RAY_CANCELLED}")
    if isinstance(exc, ray.exceptions.OutOfMemoryError):
        return failed("ray_memory", cause=cause)
    if isinstance(exc, ray.exceptions.RuntimeEnvSetupError):
        return failed("ray_runtime_env", cause=cause)
    if isinstance(exc, ray.exceptions.TaskCancelledError):
        return failed("ray_cancelled_outside", cause=cause)
    if isinstance(exc, ray.exceptions.NodeDiedError):
        named = _NODE_ID.search(str(exc))
        node_id = named.group(1) if named else (flight.node_id if flight is not None else "")
        runtime.node_lost(node_id, "a call on it failed with NodeDiedError")
        return failed("ray_node_lost", node=runtime.nodes.describe(node_id) if node_id else "unknown", cause=cause)
    if isinstance(exc, _LOST):
        return failed("ray_lost", cause=cause)
    if isinstance(exc, ray.exceptions.RayTaskError):
        return failed("ray_raised", cause=cause)
    if isinstance(exc, WireError):
        return failed("ray_malformed", problem=str(exc))
    if not isinstance(exc, Exception):
        raise exc  # KeyboardInterrupt in the host: not the tool's doing
    return failed("ray_failed", cause=cause)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


_default: list[RayRuntime] = []
_holders = [0]
_default_lock = threading.Lock()


def default_runtime(config: Mapping[str, Any] | None = None, *, hold: bool = False) -> RayRuntime:
    """The process's shared :class:`RayRuntime` (Ray's client state is per process),
    made with ``config`` on first use and returned by later calls until it is shut down.
    ``hold`` counts the caller as a holder (an ``ActorSystem``'s ray isolation), to give
    back with :func:`release_default`. Raises ``ValueError`` when a later ``config``
    differs from the first (one process, one Ray connection)."""
    with _default_lock:
        if not _default:
            _default.append(RayRuntime(config))
        elif config is not None and dict(config) != _default[0].config:
            raise ValueError(f"this process is already set up for Ray with {_default[0].config}, not {dict(config)}")
        if hold:
            _holders[0] += 1
        return _default[0]


def release_default(runtime: RayRuntime, timeout_s: float) -> list[int]:
    """Give back a hold of :func:`default_runtime`; the last holder shuts the runtime
    down (see :meth:`RayRuntime.shutdown`, whose leftover pids it returns)."""
    with _default_lock:
        if _default and _default[0] is runtime:
            _holders[0] = max(0, _holders[0] - 1)
            if _holders[0]:
                return []
    return runtime.shutdown(timeout_s)
