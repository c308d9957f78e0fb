"""``ray`` isolation: tool calls as Ray tasks, stateful tool servers as Ray actors, both
under rho's deadlines and supervision (DESIGN §5). Needs the ``ray`` extra.

A call runs as one Ray task (``max_retries=0``) with its tool's resources
(:class:`RayResources`). The tool travels once per version: its cloudpickle bytes are put
in Ray's object store and each Ray worker keeps the unpickled tool by digest (a worker
that lacks it says so, and the call is sent again with a reference to the bytes). In the task
the tool's outcome becomes a result with rho's own builders and comes back as JSON text,
which the host validates before it becomes a :class:`ToolResult`. Ray has no per-task
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

import asyncio
import base64
import functools
import hashlib
import itertools
import json
import os
import pickle
import sys
import threading
import time
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import cloudpickle
import ray
import ray.exceptions
from loguru import logger
from pydantic import BaseModel, ConfigDict, ValidationError

from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception
from rho_actors.otp.timers import Timers
from rho_actors.results import error_result, result_from_exception, result_from_return
from rho_actors.tool import ErrorKind, Image, ToolResult, is_untrusted

__all__ = [
    "RayResources",
    "RayRuntime",
    "default_runtime",
    "run_on_ray",
]

_WORKER_TOOLS = 64  # unpickled tools a Ray worker keeps, by digest
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
        self._shipped: weakref.WeakKeyDictionary[Any, tuple[str, Any]] = weakref.WeakKeyDictionary()
        self._by_digest: OrderedDict[str, Any] = OrderedDict()
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

    def ship(self, tool: Any) -> tuple[str, Any]:
        """``(digest, object ref)`` of the tool's cloudpickle bytes in Ray's object store:
        once per module, class or function object; an instance is pickled on every call
        and put again only when its bytes changed. Raises what pickling raises."""
        cacheable = isinstance(tool, (type, types.ModuleType, types.FunctionType))
        if cacheable:
            try:
                shipped = self._shipped.get(tool)
            except TypeError:
                shipped = None
            if shipped is not None:
                return shipped
        _by_value(tool)
        data = cloudpickle.dumps(tool, protocol=pickle.HIGHEST_PROTOCOL)
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        with self._lock:
            ref = self._by_digest.get(digest)
            if ref is None:
                ref = ray.put(data)
                self._by_digest[digest] = ref
                while len(self._by_digest) > 256:
                    self._by_digest.popitem(last=False)
            else:
                self._by_digest.move_to_end(digest)
        shipped = (digest, ref)
        if cacheable:
            try:
                self._shipped[tool] = shipped
            except TypeError:
                pass
        return shipped

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


_by_value_checked: set[str] = set()


def _by_value(tool: Any) -> None:
    """Ship the tool's own modules by value unless they belong to an installed package:
    the Ray workers (perhaps on other hosts) may not have the host's scripts and tests.
    Its modules: its own (a module tool), its ``__module__``, its class's and, for a
    wrapper such as ``@tool``, the wrapped function's."""
    names: list[Any]
    if isinstance(tool, types.ModuleType):
        names = [tool.__name__]
    else:
        wrapped = getattr(tool, "__wrapped__", None)
        names = [getattr(tool, "__module__", None), type(tool).__module__, getattr(wrapped, "__module__", None)]
    for name in names:
        if not isinstance(name, str) or name in _by_value_checked:
            continue
        _by_value_checked.add(name)
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if module is None or path is None or name in ("__main__", "builtins") or name.split(".")[0] == "rho_actors":
            continue
        if "site-packages" in path or "dist-packages" in path:
            continue
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:
            pass


# --- one call ------------------------------------------------------------------------------


_worker_tools: OrderedDict[str, Any] = OrderedDict()


def _plain_reply(result: ToolResult) -> str:
    """A result as the JSON text a Ray task returns (call id, name and time set by the host)."""
    try:
        details = json.loads(json.dumps(result.details, allow_nan=False)) if result.details is not None else None
    except (TypeError, ValueError) as exc:
        return _plain_reply(error_result(result.call_id, result.name, ErrorKind.RAISED,
                                         f"tool {result.name!r} returned details that are not plain JSON data "
                                         f"({describe_exception(exc)})"))
    return json.dumps({
        "ok": result.ok, "content": result.content,
        "error_kind": None if result.error_kind is None else str(result.error_kind),
        "details": details,
        "images": [{"data": base64.b64encode(i.data).decode("ascii"), "mime_type": i.mime_type}
                   for i in result.images],
    })


async def _until(coro: Any, deadline: float) -> Any:
    return await asyncio.wait_for(coro, max(0.0, deadline - time.monotonic()))


_NEED_TOOL = "\x00need-tool"  # a task's answer when its worker lacks the tool: sent again with it


@ray.remote(max_retries=0)
def _execute(payload: str) -> str:
    """The Ray task of one call. ``payload`` is JSON text: ``[digest, name, call_id, args,
    fields, seconds_left, max_chars]``. Returns the tool's outcome as JSON text (see
    :func:`_plain_reply`), or :data:`_NEED_TOOL` when this worker does not hold the tool."""
    return _run_task(payload, None)


@ray.remote(max_retries=0)
def _execute_shipping(payload: str, holder: list[Any]) -> str:
    """:func:`_execute` for a worker that lacked the tool: ``holder`` is ``[ref]`` of its
    cloudpickle bytes in the object store (a nested ref: fetched only here)."""
    return _run_task(payload, holder)


def _run_task(payload: str, holder: list[Any] | None) -> str:
    digest, name, call_id, args, fields, seconds_left, max_chars = json.loads(payload)
    deadline = time.monotonic() + seconds_left
    tool = _worker_tools.get(digest)
    if tool is None:
        if holder is None:
            return _NEED_TOOL
        try:
            tool = cloudpickle.loads(ray.get(holder[0]))
        except BaseException as exc:
            text = f"tool {name!r} could not be unpickled in its Ray worker: {describe_exception(exc)}"
            return _plain_reply(error_result(call_id, name, ErrorKind.RAISED, text))
        _worker_tools[digest] = tool
        while len(_worker_tools) > _WORKER_TOOLS:
            _worker_tools.popitem(last=False)
    else:
        _worker_tools.move_to_end(digest)
    ctx = MappingProxyType({**fields, "deadline": deadline, "cancel": CancelToken()})
    try:
        value = tool.run(args, ctx)
        if asyncio.iscoroutine(value):
            value = asyncio.run(_until(value, deadline))
        result = result_from_return(call_id, name, value, max_chars, 0.0)
    except TimeoutError as exc:
        if time.monotonic() >= deadline:
            result = error_result(call_id, name, ErrorKind.TIMEOUT, f"tool {name!r} did not finish before its deadline")
        else:
            result = result_from_exception(call_id, name, exc, max_chars, 0.0)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are `exited` results
        result = result_from_exception(call_id, name, exc, max_chars, 0.0)
    return _plain_reply(result)


class _Image(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    data: str
    mime_type: str


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    ok: bool
    content: str
    error_kind: ErrorKind | None
    details: Any
    images: list[_Image]


def _decode_reply(text: Any, call_id: str, name: str, duration_ms: float) -> ToolResult:
    """The :class:`ToolResult` of a task's JSON reply. Raises ``ValueError`` naming what
    is malformed."""
    if not isinstance(text, str):
        raise ValueError(f"expected JSON text, got {type(text).__name__}")
    try:
        reply = _Reply.model_validate_json(text)
        images = tuple(Image(base64.b64decode(i.data, validate=True), i.mime_type) for i in reply.images)
    except (ValidationError, ValueError) as exc:
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    if reply.ok != (reply.error_kind is None):
        raise ValueError("ok and error_kind disagree")
    return ToolResult(call_id, name, reply.ok, reply.content, reply.error_kind, reply.details, images, duration_ms)


_LOST = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.LocalRayletDiedError,
         ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError, ray.exceptions.RaySystemError)


def run_on_ray(
    runtime: RayRuntime,
    tool: Any,
    args: dict[str, Any],
    ctx: Mapping[str, Any],
    deadline: float,
    cancel: CancelToken,
    max_output_chars: int,
    resources: RayResources,
    *,
    name: str | None = None,
    started: float | None = None,
) -> ToolResult:
    """Run ``tool.run(args, ctx)`` as one Ray task and return its result. Blocks (call it
    from the call's own thread); never raises for anything the tool or Ray does.

    ``deadline`` and ``started`` (default: now; ``duration_ms`` counts from it) are
    ``time.monotonic()`` instants, seconds. From ``ctx`` only plain data travels:
    ``session_id``, ``call_id``, ``data_dir`` (as text) and ``withheld``; in the task,
    ``ctx`` also holds ``deadline`` (a ``time.monotonic()`` instant of the worker) and
    ``cancel``, a token never set (the task is killed instead). ``name`` is the tool's
    checked name (default: its ``__name__`` or type name).

    The result is the tool's own (``ok``, ``raised``, ``exited``), or an error with kind
    ``timeout`` (the deadline passed: the task was force-cancelled, its worker killed),
    ``cancelled`` (``cancel`` was set: the task was force-cancelled too), ``crashed``
    (the worker or its node was lost: the Ray error is named; or the reply was malformed),
    ``memory`` (Ray's memory monitor killed the worker) or ``unavailable`` (an untrusted
    tool; no node of the cluster can ever hold the resources; the runtime env could not
    be set up; Ray is not reachable).
    """
    start = time.monotonic() if started is None else started
    call_id = str(ctx.get("call_id", ""))
    label = name if name is not None else str(getattr(tool, "__name__", type(tool).__name__))

    def failed(kind: ErrorKind, message: str) -> ToolResult:
        return error_result(call_id, label, kind, message, (time.monotonic() - start) * 1000)

    if is_untrusted(tool):
        return failed(ErrorKind.UNAVAILABLE, f"tool {label!r} is untrusted and cannot run on Ray")
    if cancel.cancelled:
        return failed(ErrorKind.CANCELLED, f"tool {label!r} was cancelled ({cancel.reason}) before it ran")
    try:
        runtime.connect()
        problem = runtime.infeasible(resources)
    except Exception as exc:
        return failed(ErrorKind.UNAVAILABLE, f"tool {label!r} did not run: Ray is not reachable "
                      f"({describe_exception(exc)})")
    if problem is not None:
        return failed(ErrorKind.UNAVAILABLE, f"tool {label!r} cannot run on Ray: {problem}")
    try:
        digest, tool_ref = runtime.ship(tool)
    except Exception as exc:
        return failed(ErrorKind.RAISED, f"tool {label!r} could not be shipped to Ray: {describe_exception(exc)}")
    fields = {
        "session_id": ctx.get("session_id"),
        "call_id": ctx.get("call_id"),
        "data_dir": None if ctx.get("data_dir") is None else str(ctx.get("data_dir")),
        "withheld": list(ctx.get("withheld", ())),
    }
    bare, shipping = runtime._remote(resources)
    holder: list[Any] | None = None  # the tool goes along only to a worker that lacks it
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return failed(ErrorKind.TIMEOUT, f"tool {label!r} did not run: its deadline had passed")
        try:
            payload = json.dumps([digest, label, call_id, args, fields, left, max_output_chars], allow_nan=False)
        except (TypeError, ValueError) as exc:
            return failed(ErrorKind.RAISED, f"tool {label!r}: its arguments are not plain JSON data and cannot go "
                          f"to Ray ({describe_exception(exc)})")
        try:
            ref = bare.remote(payload) if holder is None else shipping.remote(payload, holder)
        except Exception as exc:
            return failed(ErrorKind.UNAVAILABLE, f"tool {label!r} did not run: Ray refused the task "
                          f"({describe_exception(exc)})")
        key = runtime._track(call_id, label, ref, start, deadline)
        cancel.add_callback(functools.partial(_force_cancel, ref))
        try:
            text = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            _force_cancel(ref)
            budget_ms = round((deadline - start) * 1000)
            return failed(ErrorKind.TIMEOUT, f"tool {label!r} did not finish within its timeout of {budget_ms} ms; "
                          "its Ray task was force-cancelled (a running task's worker is killed)")
        except BaseException as exc:
            return _failure(exc, label, cancel, failed)
        finally:
            runtime._untrack(key)
        if text != _NEED_TOOL or holder is not None:
            break
        holder = [tool_ref]
    try:
        return _decode_reply(text, call_id, label, (time.monotonic() - start) * 1000)
    except ValueError as exc:
        return failed(ErrorKind.CRASHED, f"tool {label!r}: its Ray task sent a malformed reply ({exc})")


def _force_cancel(ref: Any) -> None:
    try:
        ray.cancel(ref, force=True)
    except Exception as exc:  # finished already, or Ray is gone
        logger.debug("ray.cancel of {} failed: {}", ref, describe_exception(exc))


def _failure(exc: BaseException, label: str, cancel: CancelToken,
             failed: Callable[[ErrorKind, str], ToolResult]) -> ToolResult:
    cause = f"{type(exc).__name__}: {_first_line(exc)}"
    if cancel.cancelled and isinstance(exc, (ray.exceptions.TaskCancelledError, *_LOST)):
        return failed(ErrorKind.CANCELLED, f"tool {label!r} was cancelled ({cancel.reason}); its Ray task was "
                      "force-cancelled (a running task's worker is killed)")
    if isinstance(exc, ray.exceptions.OutOfMemoryError):
        return failed(ErrorKind.MEMORY, f"tool {label!r} ran out of memory: Ray's memory monitor killed its worker "
                      f"({cause})")
    if isinstance(exc, ray.exceptions.RuntimeEnvSetupError):
        return failed(ErrorKind.UNAVAILABLE, f"tool {label!r} did not run: its Ray runtime_env could not be set up "
                      f"({cause})")
    if isinstance(exc, ray.exceptions.TaskCancelledError):
        return failed(ErrorKind.CANCELLED, f"tool {label!r}: its Ray task was cancelled from outside ({cause})")
    if isinstance(exc, _LOST):
        return failed(ErrorKind.CRASHED, f"tool {label!r} crashed: its Ray worker or node was lost ({cause})")
    if isinstance(exc, ray.exceptions.RayTaskError):
        return failed(ErrorKind.RAISED, f"tool {label!r} failed in its Ray task ({cause})")
    if not isinstance(exc, Exception):
        raise exc  # KeyboardInterrupt in the host: not the tool's doing
    return failed(ErrorKind.CRASHED, f"tool {label!r}: Ray failed ({cause})")


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
