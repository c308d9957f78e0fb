"""Stateful tool servers on Ray, supervised by rho (DESIGN §5 and §6). Needs the ``ray`` extra.

:class:`RayActor` is a child's ``start``: it starts a :class:`RayServer`, a rho actor
owning one Ray actor created with Ray's restarts off; when the Ray actor dies (a call
raises ``RayActorError``, or the liveness ping does) the RayServer exits abnormally and
rho's supervisor decides, by its strategy and restart intensity, what happens next.

Example::

    sup = start_link(Supervisor, [ChildSpec("kv", RayActor(KvStore, resources={"num_cpus": 0}), name="kv")])
    names.whereis("kv").ask(RayCall("put", ("k", 1)))
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pykka
import ray
import ray.exceptions
from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.errors import RhoError
from rho_actors.isolation.ray_tasks import RayResources, RayRuntime, default_runtime
from rho_actors.isolation.servers import ServerCall, ServerDown, ServerUnreachable
from rho_actors.otp.actor import Actor, kill, start_link
from rho_actors.otp.timers import Timer
from rho_actors.sandbox import local_modules

__all__ = ["RayActor", "RayCall", "RayServer", "RayServerDown"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


class RayServerDown(ServerDown):
    """A call to a :class:`RayServer` whose Ray actor died, was killed by Ray's memory
    monitor, was lost with its node, or was killed past the call's deadline: its state
    is lost, the server exits and its supervisor decides whether it restarts. A
    :class:`~rho_actors.isolation.servers.ServerDown` (so a
    :class:`~rho_actors.errors.RhoError`): ``key`` is the situation of
    ``results.TEXTS`` (``server_killed`` at the deadline, ``server_ray_memory`` for
    Ray's out-of-memory kill, ``server_crashed`` otherwise), ``fields`` its fields
    (``server``: the class's name, ``method``), ``str(err)`` that text."""


_OOM_MARKS = ("NODE_OUT_OF_MEMORY", "running low on memory", "memory monitor")


def _killed_for_memory(exc: BaseException) -> bool:
    """Whether Ray's error says its memory monitor killed the worker (Ray's
    ``OutOfMemoryError``, or an ``ActorDiedError`` whose exit type is
    ``NODE_OUT_OF_MEMORY``)."""
    if isinstance(exc, ray.exceptions.OutOfMemoryError):
        return True
    text = str(exc)
    return any(mark in text for mark in _OOM_MARKS)


@dataclass(frozen=True, slots=True)
class RayCall:
    """A message for a :class:`RayServer`: call ``method(*args, **kwargs)`` on its Ray
    actor within ``timeout_ms`` milliseconds (default: the server's ``call_timeout_ms``).
    ``ref.ask(RayCall("get", ("k",)))`` answers the method's return value."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class _Liveness:
    pass


@dataclass(frozen=True, slots=True)
class _NodeLost:
    why: str


def _ship_by_value(cls: type) -> None:
    """Have Ray pickle ``cls`` by value when its module is not installed (a local file:
    Ray's workers, on other machines too, could not import it), as tools are shipped."""
    for module in local_modules(cls, installed_only=True):
        with contextlib.suppress(ValueError):  # already registered
            ray.cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


def _oom_line(exc: BaseException) -> str:
    """The line of Ray's error that says why the worker was killed (its first line
    otherwise)."""
    for line in str(exc).splitlines():
        if any(mark in line for mark in _OOM_MARKS):
            return line.strip()
    return _first_line(exc)


def _where(_instance: Any) -> tuple[str, int]:
    return ray.get_runtime_context().get_node_id(), os.getpid()


class RayServer(Actor):
    """A rho actor owning one Ray actor (``cls(*args, **kwargs)`` created with
    ``max_restarts=0``): a stateful tool server on Ray, supervised by rho. Start it with
    :class:`RayActor`.

    Calls: ``ref.ask(RayCall(method, args, kwargs))`` or
    ``ref.proxy().call(method, *args, **kwargs).get()``, served one at a time, each
    within its deadline. A call raising in the Ray actor raises the same error type to the
    caller (Ray's ``RayTaskError`` subclass). When the Ray actor is found dead (a call
    raises Ray's ``ActorDiedError`` or ``OutOfMemoryError``, or the liveness ping every
    ``ping_ms`` does) or a call passes its deadline (a Ray actor method cannot be
    cancelled, so the Ray actor is killed), the caller gets :class:`RayServerDown` naming
    the cause and this actor exits with it as reason; calls queued behind get
    ``RayServerDown`` or ``pykka.ActorDeadError``, never a hang. Ray's
    ``ActorUnavailableError`` (a connection lost for a moment) is no death: the call gets
    :class:`~rho_actors.isolation.servers.ServerUnreachable` once a ping by its deadline
    finds the Ray actor alive, and the server keeps its state; pings take the server down
    only after ``call_timeout_ms`` of it. The Ray actor is killed when this actor stops.

    Raises the Ray error on start (the supervisor's start error) when the Ray actor cannot
    be created within ``start_timeout_ms`` or no node can hold its resources.
    """

    def __init__(
        self,
        cls: type,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        runtime: RayRuntime,
        resources: RayResources,
        call_timeout_ms: int,
        ping_ms: int,
        start_timeout_ms: int,
    ) -> None:
        super().__init__()
        self.cls = cls
        self._args = args
        self._kwargs = dict(kwargs)
        self.runtime = runtime
        self.resources = resources
        self.call_timeout_ms = call_timeout_ms
        self.ping_ms = ping_ms
        self.start_timeout_ms = start_timeout_ms
        self.handle: Any = None
        self.actor_id = ""
        self.node_id = ""
        self.pid = 0
        self.calls = 0
        self._ping: Any = None
        self._timer: Timer | None = None
        self._down_error: RayServerDown | None = None
        self._unreachable_since: float | None = None  # when pings began to find the Ray actor unavailable

    def on_start(self) -> None:
        runtime = self.runtime
        runtime.connect(self.start_timeout_ms / 1000)
        problem = runtime.infeasible(self.resources)
        if problem is not None:
            raise RuntimeError(f"Ray actor {self.cls.__name__} cannot start: {problem}")
        _ship_by_value(self.cls)
        options = self.resources.options()
        avoid = runtime.nodes.avoid()  # not on a node found lost that Ray still lists as alive
        if avoid:
            options["label_selector"] = avoid
        remote_cls: Any = ray.remote(self.cls).options(max_restarts=0, max_task_retries=0, **options)
        self.handle = remote_cls.remote(*self._args, **self._kwargs)
        try:
            self.node_id, self.pid = ray.get(self.handle.__ray_call__.remote(_where),
                                             timeout=self.start_timeout_ms / 1000)
        except BaseException:
            ray.kill(self.handle, no_restart=True)
            raise
        self.actor_id = self.handle._actor_id.hex()
        runtime.add_server(self.actor_urn, self)
        self._schedule_ping()
        if runtime.nodes.is_lost(self.node_id):  # placed on a node found lost meanwhile
            self.node_lost(f"its Ray {runtime.nodes.describe(self.node_id)} was lost")

    def on_stop(self) -> None:
        self.runtime.remove_server(self.actor_urn)
        if self._timer is not None:
            self._timer.cancel()
        self._kill_ray_actor()

    def describe(self) -> dict[str, Any]:
        """This server as plain data (see :meth:`rho_actors.isolation.ray_tasks.RayRuntime.actors`)."""
        return {"server": self.actor_urn, "class": self.cls.__qualname__, "actor_id": self.actor_id,
                "node_id": self.node_id, "node": self.runtime.nodes.describe(self.node_id), "pid": self.pid,
                "calls": self.calls}

    def node_lost(self, why: str) -> None:
        """The node watcher found this server's node lost (any thread): the server goes
        down with ``why`` as soon as it has its turn."""
        self.actor_ref.tell(_NodeLost(why))

    def server_info(self) -> dict[str, Any]:
        """:meth:`describe` with ``isolation`` ``"ray"``, for the supervision tree."""
        return {"isolation": "ray", **self.describe()}

    def _schedule_ping(self) -> None:
        try:
            self._timer = self.runtime.timers.send_after(self.ping_ms / 1000, self.actor_ref, _Liveness())
        except RuntimeError:  # the timers are stopped: the system is stopping
            self._timer = None

    def _check_liveness(self) -> None:
        if self._down_error is not None:
            return
        if self._ping is not None:
            ready, _ = ray.wait([self._ping], timeout=0)
            if ready:
                ping, self._ping = self._ping, None
                try:
                    ray.get(ping)
                    self._unreachable_since = None
                except ray.exceptions.ActorUnavailableError as exc:  # Ray: temporary, the actor may be back
                    if self._still_unreachable(exc):
                        return
                except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError) as exc:
                    self._died("(between calls)", exc)
                    return
        if self._ping is None:
            self._ping = self.handle.__ray_ready__.remote()
        self._schedule_ping()

    def _still_unreachable(self, exc: BaseException) -> bool:
        """A liveness ping found the Ray actor unavailable (Ray's ``ActorUnavailableError``:
        a connection lost for a moment, the actor possibly alive). The server goes down
        only once that has lasted ``call_timeout_ms``; returns whether it went down."""
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
        waited_ms = round((now - self._unreachable_since) * 1000)
        if waited_ms < self.call_timeout_ms:
            logger.info("Ray server {} (Ray actor {}) is unavailable for now ({} ms): {}", self.cls.__name__,
                        self.actor_id, waited_ms, _first_line(exc))
            return False
        self._down("server_crashed", method="(between calls)",
                   cause=f"its Ray actor {self.actor_id} could not be reached for {waited_ms} ms "
                         f"({type(exc).__name__}: {_first_line(exc)})")
        return True

    def _unavailable(self, method: str, exc: BaseException, deadline: float) -> RhoError:
        """A call got Ray's ``ActorUnavailableError`` (it may or may not have run): ask the
        Ray actor whether it is alive, by the call's ``deadline``. Alive (or still
        unavailable): :class:`ServerUnreachable`, the server keeps its state; dead: down."""
        try:
            ray.get(self.handle.__ray_ready__.remote(), timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            return self._down("server_crashed", method=method,
                              cause=f"its Ray actor {self.actor_id} was unavailable and did not answer by the "
                                    f"call's deadline ({type(exc).__name__}: {_first_line(exc)})")
        except ray.exceptions.ActorUnavailableError:
            pass
        except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError) as died:
            return self._died(method, died)
        logger.warning("Ray server {} (Ray actor {}): {}() got {}", self.cls.__name__, self.actor_id, method,
                       _first_line(exc))
        return ServerUnreachable("server_unreachable", {
            "server": self.cls.__name__, "method": method,
            "cause": f"Ray actor {self.actor_id}: {type(exc).__name__}: {_first_line(exc)}"})

    def _died(self, method: str, exc: BaseException) -> RayServerDown:
        """:meth:`_down` for a Ray error saying the Ray actor died (during ``method``)."""
        cause = f"its Ray actor {self.actor_id} died: {type(exc).__name__}: {_first_line(exc)}"
        if _killed_for_memory(exc):
            return self._down("server_ray_memory", method=method,
                              cause=f"Ray actor {self.actor_id}: {type(exc).__name__}: {_oom_line(exc)}")
        return self._down("server_crashed", method=method, cause=cause)

    def _down(self, key: str, **fields: Any) -> RayServerDown:
        """Mark the server failed (``key`` and ``fields``: the situation of
        ``results.TEXTS``): its Ray actor is killed, the calls already queued get the
        returned error at once, and then this actor exits with it as reason."""
        if self._down_error is not None:
            return self._down_error
        error = RayServerDown(key, {"server": self.cls.__name__, **fields})
        self._down_error = error
        logger.warning("Ray server {} (Ray actor {}) is down: {}", self.cls.__name__, self.actor_id, error)
        self._kill_ray_actor()
        kill(self.actor_ref, error)
        return error

    def _kill_ray_actor(self) -> None:
        if self.handle is not None:
            try:
                ray.kill(self.handle, no_restart=True)
            except Exception as exc:
                logger.debug("ray.kill of {} failed: {}", self.actor_id, describe_exception(exc))

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, (RayCall, ServerCall)):  # a ServerCall: as every server kind answers
            return self._call(message)
        if isinstance(message, _Liveness):
            self._check_liveness()
            return None
        if isinstance(message, _NodeLost):
            self._down("server_crashed", method="(between calls)", cause=message.why)
            return None
        logger.warning("RayServer {} ignored an unknown message {!r}", self.cls.__name__, message)
        return None

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` on the Ray actor within ``call_timeout_ms`` (for
        ``ref.proxy().call(...)``). Raises as :class:`RayCall` does."""
        return self._call(RayCall(method, args, kwargs))

    def _call(self, message: RayCall | ServerCall) -> Any:
        if self._down_error is not None:
            raise self._down_error
        timeout_ms = self.call_timeout_ms if message.timeout_ms is None else message.timeout_ms
        try:
            bound = getattr(self.handle, message.method)
        except AttributeError:
            raise AttributeError(f"Ray server {self.cls.__name__} has no method {message.method!r}") from None
        self.calls += 1
        deadline = time.monotonic() + timeout_ms / 1000
        ref = bound.remote(*message.args, **dict(message.kwargs))
        try:
            return ray.get(ref, timeout=timeout_ms / 1000)
        except ray.exceptions.GetTimeoutError:  # a Ray actor method cannot be cancelled: the Ray actor is killed
            raise self._down("server_killed", method=message.method, timeout_ms=timeout_ms) from None
        except ray.exceptions.ActorUnavailableError as exc:  # Ray: temporary; the call may or may not have run
            raise self._unavailable(message.method, exc, deadline) from None
        except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError) as exc:
            raise self._died(message.method, exc) from None


@dataclass(frozen=True, slots=True, init=False)
class RayActor:
    """How to start a :class:`RayServer` (the ``start`` of a
    :class:`rho_actors.ChildSpec`): ``RayActor(cls, *args, resources=..., **kwargs)``
    creates the Ray actor ``cls(*args, **kwargs)`` on every start, with Ray's restarts
    off so that rho's restart strategy and intensity decide. ``resources`` is a mapping
    or :class:`RayResources` (default: 1 CPU); ``runtime`` the :class:`RayRuntime`
    (default: :func:`default_runtime`); ``call_timeout_ms`` each call's default deadline,
    ``ping_ms`` the liveness ping's period, ``start_timeout_ms`` the bound on creating the
    Ray actor. These keyword names are taken: a class needing one gets it through a
    ``functools.partial``.
    """

    cls: type
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    resources: RayResources
    runtime: RayRuntime | None
    call_timeout_ms: int
    ping_ms: int
    start_timeout_ms: int

    def __init__(self, cls: type, *args: Any, resources: Mapping[str, Any] | RayResources | None = None,
                 runtime: RayRuntime | None = None, call_timeout_ms: int = 30_000, ping_ms: int = 1_000,
                 start_timeout_ms: int = 60_000, **kwargs: Any) -> None:
        for key, value in (("call_timeout_ms", call_timeout_ms), ("ping_ms", ping_ms),
                           ("start_timeout_ms", start_timeout_ms)):
            if type(value) is not int or value <= 0:
                raise ValueError(f"RayActor {key} must be milliseconds > 0, got {value!r}")
        if not isinstance(cls, type):
            raise TypeError(f"RayActor needs a class, got {type(cls).__name__}")
        set_ = object.__setattr__
        set_(self, "cls", cls)
        set_(self, "args", args)
        set_(self, "kwargs", kwargs)
        set_(self, "resources", RayResources.from_mapping(resources))
        set_(self, "runtime", runtime)
        set_(self, "call_timeout_ms", call_timeout_ms)
        set_(self, "ping_ms", ping_ms)
        set_(self, "start_timeout_ms", start_timeout_ms)

    @property
    def wants_runtime(self) -> bool:
        """Whether no ``runtime=`` was given: ``ActorSystem.start_child`` then binds the
        system's own (see :meth:`bound_to`)."""
        return self.runtime is None

    def bound_to(self, runtime: RayRuntime) -> RayActor:
        """This start with ``runtime`` as its :class:`RayRuntime`, once that is connected
        (a local Ray can take tens of seconds to start: waited for here, in the caller's
        thread, at most ``start_timeout_ms``). Raises
        :class:`~rho_actors.isolation.ray_connection.RayUnreachable` naming why not."""
        runtime.connect(self.start_timeout_ms / 1000)
        bound = copy.copy(self)
        object.__setattr__(bound, "runtime", runtime)
        return bound

    def __call__(self) -> pykka.ActorRef[Any]:
        runtime = self.runtime if self.runtime is not None else default_runtime()
        return start_link(RayServer, self.cls, self.args, self.kwargs, runtime=runtime, resources=self.resources,
                          call_timeout_ms=self.call_timeout_ms, ping_ms=self.ping_ms,
                          start_timeout_ms=self.start_timeout_ms, timeout_s=self.start_timeout_ms / 1000 + 5)
