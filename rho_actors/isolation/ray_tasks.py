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
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.exceptions
from loguru import logger

from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception
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
    "RayRuntime",
    "default_runtime",
    "run_call",
    "run_on_ray",
]

_NODES_TTL_S = 2.0  # how long a view of the cluster's nodes is trusted for feasibility checks


# --- resources ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RayResources:
    """What one call (or one Ray actor) asks Ray for, per Ray's ``.options()``:
    ``num_cpus`` and ``num_gpus`` (logical units, fractions allowed), ``memory`` (bytes,
    reserved for scheduling, not a limit), ``runtime_env`` (Ray's dict: ``pip``,
    ``env_vars``, ``working_dir``...) and ``resources``, custom resources by name.

    Raises ``ValueError`` naming a negative amount or a bad type.
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    runtime_env: Mapping[str, Any] | None = None
    resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        amounts = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, **dict(self.resources)}
        if self.memory is not None:
            amounts["memory"] = self.memory
        for key, value in amounts.items():
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"ray resource {key!r} must be a number >= 0, got {value!r}")
        if self.runtime_env is not None and not isinstance(self.runtime_env, Mapping):
            raise ValueError(f"runtime_env must be a mapping (Ray's runtime_env dict), got {type(self.runtime_env)}")

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any] | RayResources | None) -> RayResources:
        """From ``register(..., resources={...})``: the known keys above, and any other key
        as a custom resource (``{"num_cpus": 2, "browser": 1}``). Raises ``ValueError``."""
        if spec is None:
            return cls()
        if isinstance(spec, RayResources):
            return spec
        known = {k: spec[k] for k in ("num_cpus", "num_gpus", "memory", "runtime_env") if k in spec}
        custom = dict(spec.get("resources", {}))
        custom.update({k: v for k, v in spec.items() if k not in known and k != "resources"})
        return cls(**known, resources=custom)

    def demand(self) -> dict[str, float]:
        """Ray's resource names and amounts (``CPU``, ``GPU``, ``memory``, custom), non-zero."""
        wanted = {"CPU": float(self.num_cpus), "GPU": float(self.num_gpus), **{k: float(v) for k, v in
                                                                                self.resources.items()}}
        if self.memory:
            wanted["memory"] = float(self.memory)
        return {k: v for k, v in wanted.items() if v > 0}

    def options(self) -> dict[str, Any]:
        """Keyword arguments for Ray's ``.options()``."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory is not None:
            opts["memory"] = self.memory
        if self.resources:
            opts["resources"] = dict(self.resources)
        if self.runtime_env is not None:
            opts["runtime_env"] = dict(self.runtime_env)
        return opts


# --- the runtime ----------------------------------------------------------------------------


@dataclass(slots=True)
class _InFlight:
    call_id: str
    tool: str
    task_id: str
    started: float
    deadline: float


def _loopback_only() -> None:
    """A Ray started here serves this host alone: bind it to loopback. Ray resolves
    ``127.0.0.1`` to the machine's own address unless multi-node clusters are off
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read by every Ray process it starts; the
    driver read it at import, so its copy of the setting is turned off too). A cluster
    reached with ``ActorSystem(ray={"address": ...})`` is not touched."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


class RayRuntime:
    """One connection to Ray for a host (Ray's client state is per process).

    ``config`` is ``ActorSystem(ray={...})``: ``address`` (``"auto"``, ``"ray://host:10001"``
    or ``"host:6379"``) connects to a running cluster; without it a local Ray is started
    (or a running one in this process is attached) on this host, with no dashboard,
    bound to loopback only (see :func:`_loopback_only`) and ``num_cpus``/``num_gpus``
    from the config when given. ``namespace`` and
    ``runtime_env`` go to ``ray.init``. ``timers`` serve the servers' liveness pings
    (default: a timer thread of its own). Connecting is lazy (first use) and raises
    what ``ray.init`` raises.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, *, timers: Timers | None = None) -> None:
        self.config = dict(config or {})
        unknown = set(self.config) - {"address", "namespace", "runtime_env", "num_cpus", "num_gpus"}
        if unknown:
            raise ValueError(f"unknown ray settings {sorted(unknown)}: expected address, namespace, runtime_env, "
                             "num_cpus, num_gpus")
        self._lock = threading.Lock()
        self._connected = False
        self.owns_ray = False
        self._own_timers = timers is None
        self._timers = timers
        self._nodes: tuple[float, list[dict[str, float]]] = (0.0, [])
        self._shipped = ShippedTools()
        self._by_digest: OrderedDict[bytes, Any] = OrderedDict()
        self._remotes: dict[str, tuple[Any, Any]] = {}
        self._in_flight: dict[int, _InFlight] = {}
        self._keys = itertools.count()
        self._servers: dict[str, Any] = {}  # rho_actors.integrations.ray.servers.RayServer by actor urn
        self.tasks_total = 0

    @property
    def timers(self) -> Timers:
        """The timer service of the servers' liveness pings."""
        with self._lock:
            if self._timers is None:
                self._timers = Timers("rho_actors-ray-timers")
            return self._timers

    def connect(self) -> None:
        """Connect to (or start) Ray once; later calls return at once."""
        if self._connected:
            return
        with self._lock:
            if self._connected:
                return
            if not ray.is_initialized():
                kwargs: dict[str, Any] = {"namespace": self.config.get("namespace"),
                                          "runtime_env": self.config.get("runtime_env"),
                                          "log_to_driver": False}
                if self.config.get("address"):
                    kwargs["address"] = self.config["address"]
                else:
                    _loopback_only()
                    kwargs.update(_node_ip_address="127.0.0.1", include_dashboard=False,
                                  num_cpus=self.config.get("num_cpus"), num_gpus=self.config.get("num_gpus"))
                ray.init(**kwargs)
                self.owns_ray = True
            self._connected = True

    def shutdown(self) -> None:
        """Stop the timers this runtime owns and, if this runtime started Ray, Ray itself
        (a call still waiting then gets a ``crashed`` or ``cancelled`` result)."""
        if self._own_timers and self._timers is not None:
            self._timers.stop()
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()
        self._connected = False
        self.owns_ray = False

    # --- feasibility --------------------------------------------------------------------

    def infeasible(self, resources: RayResources) -> str | None:
        """Why no node of the cluster could ever run a call needing ``resources`` (by
        each alive node's total resources, refreshed every 2 s), or None."""
        demand = resources.demand()
        if not demand:
            return None
        nodes = self._node_totals()
        if any(all(node.get(k, 0.0) >= v for k, v in demand.items()) for node in nodes):
            return None
        nodes = self._node_totals(fresh=True)
        if any(all(node.get(k, 0.0) >= v for k, v in demand.items()) for node in nodes):
            return None
        best = {k: max((node.get(k, 0.0) for node in nodes), default=0.0) for k in demand}
        short = [f"{k}={_num(v)} (the largest node has {_num(best[k])})" for k, v in demand.items() if best[k] < v]
        if not short:
            short = [f"{', '.join(f'{k}={_num(v)}' for k, v in demand.items())} together"]
        return f"no node of the Ray cluster has {'; '.join(short)}"

    def _node_totals(self, fresh: bool = False) -> list[dict[str, float]]:
        at, nodes = self._nodes
        if fresh or time.monotonic() - at > _NODES_TTL_S:
            alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
            nodes = [dict(n.get("Resources", {})) for n in alive]
            self._nodes = (time.monotonic(), nodes)
        return nodes

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
        """The task functions (without and with the tool) with ``resources`` as options."""
        options = resources.options()
        key = json.dumps(options, sort_keys=True, default=repr)
        remote = self._remotes.get(key)
        if remote is None:
            remote = (_execute.options(max_retries=0, retry_exceptions=False, **options),
                      _execute_shipping.options(max_retries=0, retry_exceptions=False, **options))
            self._remotes[key] = remote
        return remote

    # --- operator view ------------------------------------------------------------------

    def _track(self, call_id: str, tool: str, ref: Any, started: float, deadline: float) -> int:
        key = next(self._keys)
        with self._lock:
            self._in_flight[key] = _InFlight(call_id, tool, ref.task_id().hex(), started, deadline)
            self.tasks_total += 1
        return key

    def _untrack(self, key: int) -> None:
        with self._lock:
            self._in_flight.pop(key, None)

    def tasks(self) -> list[dict[str, Any]]:
        """Ray tasks in flight, oldest first: ``call_id``, ``tool``, ``task_id`` (hex),
        ``ms_running`` and ``ms_left`` to the deadline."""
        now = time.monotonic()
        with self._lock:
            running = list(self._in_flight.values())
        return [{"call_id": t.call_id, "tool": t.tool, "task_id": t.task_id,
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
        """Counters: ``ray_tasks_running``, ``ray_tasks_total`` and ``ray_actors``."""
        with self._lock:
            return {"ray_tasks_running": len(self._in_flight), "ray_tasks_total": self.tasks_total,
                    "ray_actors": len(self._servers)}


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# --- one call ------------------------------------------------------------------------------


_worker_tools: OrderedDict[bytes, Any] = OrderedDict()  # a Ray worker's tools by digest, as a worker process's
_TASK_CONFIG = WorkerConfig(codec="plain", heap_bytes=None)


@ray.remote(max_retries=0)
def _execute(body: bytes, seconds_left: float) -> tuple[bytes, bytes]:
    """The Ray task of one call: ``body`` is the call's ``CALL`` frame (a
    :class:`~rho_actors.sandbox.CallRequest`, its ``deadline`` replaced by
    ``seconds_left`` from the task's start, since clocks differ between hosts). Returns
    the reply frame of :func:`~rho_actors.sandbox.worker.serve_request`: ``NEED_TOOL``
    when this worker lacks the tool, else the result in the plain codec."""
    return _run_task(body, seconds_left, None)


@ray.remote(max_retries=0)
def _execute_shipping(body: bytes, seconds_left: float, holder: list[Any]) -> tuple[bytes, bytes]:
    """:func:`_execute` for a worker that lacked the tool: ``holder`` is ``[ref]`` of its
    pickled bytes in the object store (a nested ref: fetched only here)."""
    return _run_task(body, seconds_left, holder)


def _run_task(body: bytes, seconds_left: float, holder: list[Any] | None) -> tuple[bytes, bytes]:
    request = dataclasses.replace(decode_call(body), deadline=time.monotonic() + seconds_left)
    if holder is not None and request.digest not in _worker_tools:
        request = dataclasses.replace(request, tool_bytes=ray.get(holder[0]))
    return serve_request(request, _worker_tools, _TASK_CONFIG, CODECS["plain"])


_LOST = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.LocalRayletDiedError,
         ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError, ray.exceptions.RaySystemError)


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
    (the worker or its node was lost: the Ray error is named; or the reply was malformed),
    ``memory`` (Ray's memory monitor killed the worker) or ``unavailable`` (an untrusted
    tool; no node of the cluster can ever hold the resources; the runtime env could not
    be set up; Ray is not reachable).
    """
    tool, start, deadline, timeout_ms = call.tool, call.started, call.deadline, call.timeout_ms
    call_id, label, max_output_chars = call.call_id, call.name, call.max_output_chars
    cancel = call.cancel if call.cancel is not None else CancelToken()

    def failed(key: str, **fields: Any) -> ToolResult:
        return failure(key, call_id, label, (time.monotonic() - start) * 1000, **fields)

    if is_untrusted(tool) or call.untrusted:
        return failed("ray_untrusted")
    if cancel.cancelled:
        return failed("cancelled", reason=cancel.reason)
    try:
        runtime.connect()
        problem = runtime.infeasible(resources)
    except Exception as exc:
        return failed("ray_unreachable", problem=describe_exception(exc))
    if problem is not None:
        return failed("ray_infeasible", problem=problem)
    try:
        digest, tool_ref = runtime.ship(tool, call.version)
    except Unshippable as exc:
        return failed("ray_unshippable", problem=str(exc))
    request = call_request(digest, call)
    try:
        body = encode_call(request)
    except WireError as exc:
        return failed("ray_unsendable", problem=str(exc))
    bare, shipping = runtime._remote(resources)
    holder: list[Any] | None = None  # the tool goes along only to a worker that lacks it
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return failed("timeout", timeout_ms=timeout_ms, consequence="it did not start")
        try:
            ref = bare.remote(body, left) if holder is None else shipping.remote(body, left, holder)
        except Exception as exc:
            return failed("ray_refused", problem=describe_exception(exc))
        key = runtime._track(call_id, label, ref, start, deadline)
        cancel.add_callback(functools.partial(_force_cancel, ref))
        try:
            tag, reply = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            _force_cancel(ref)
            return failed("timeout", timeout_ms=timeout_ms, consequence=RAY_CANCELLED)
        except BaseException as exc:
            return _failure(exc, cancel, failed)
        finally:
            runtime._untrack(key)
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
    try:
        ray.cancel(ref, force=True)
    except Exception as exc:  # finished already, or Ray is gone
        logger.debug("ray.cancel of {} failed: {}", ref, describe_exception(exc))


def _failure(exc: BaseException, cancel: CancelToken, failed: Callable[..., ToolResult]) -> ToolResult:
    cause = f"{type(exc).__name__}: {_first_line(exc)}"
    if cancel.cancelled and isinstance(exc, (ray.exceptions.TaskCancelledError, *_LOST)):
        return failed("cancelled", reason=f"{cancel.reason}; {RAY_CANCELLED}")
    if isinstance(exc, ray.exceptions.OutOfMemoryError):
        return failed("ray_memory", cause=cause)
    if isinstance(exc, ray.exceptions.RuntimeEnvSetupError):
        return failed("ray_runtime_env", cause=cause)
    if isinstance(exc, ray.exceptions.TaskCancelledError):
        return failed("ray_cancelled_outside", cause=cause)
    if isinstance(exc, _LOST):
        return failed("ray_lost", cause=cause)
    if isinstance(exc, ray.exceptions.RayTaskError):
        return failed("ray_raised", cause=cause)
    if not isinstance(exc, Exception):
        raise exc  # KeyboardInterrupt in the host: not the tool's doing
    return failed("ray_failed", cause=cause)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


_default: list[RayRuntime] = []
_default_lock = threading.Lock()


def default_runtime(config: Mapping[str, Any] | None = None) -> RayRuntime:
    """The process's shared :class:`RayRuntime` (Ray's client state is per process),
    made with ``config`` on first use and returned by later calls. Raises ``ValueError``
    when a later ``config`` differs from the first (one process, one Ray connection)."""
    with _default_lock:
        if not _default:
            _default.append(RayRuntime(config))
        elif config is not None and dict(config) != _default[0].config:
            raise ValueError(f"this process is already set up for Ray with {_default[0].config}, not {dict(config)}")
        return _default[0]
