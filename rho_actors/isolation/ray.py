"""``ray`` isolation: a call runs as a Ray task (DESIGN §5); the work is done by
:func:`rho_actors.isolation.ray_tasks.run_call` (given the call as one ``WorkerCall``),
imported on first use so that a system without the ``ray`` extra still starts (its
``ray`` calls are then ``unavailable``).

The call's CallActor runs ``run_call`` and waits; it owns the deadline: at it the
result is ``timeout`` and the task is force-cancelled (its worker killed). Each tool's
Ray resources are given at registration (``register(tool, isolation="ray",
resources={...})``, checked by :meth:`RayIsolation.check_options`; default: 1 CPU) and
travel with its registry entry. Untrusted tools are refused: Ray unpickles what its
workers return, so code that takes over a worker could forge objects in the host.

The system has one Ray runtime (:meth:`RayIsolation.runtime`), used by its ``ray``
calls and by every ``RayActor`` it starts (``ActorSystem.start_child`` binds it). With
``ActorSystem(ray={...})`` connecting begins in the background when the system starts;
without it, at the first ``ray`` call or Ray server. Connecting is bounded and never on a
call's path: a call made meanwhile waits for it within its own deadline and is
``unavailable`` past it. At the system's stop the runtime leaves Ray as it found it
(:meth:`rho_actors.isolation.ray_tasks.RayRuntime.shutdown`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from loguru import logger

from rho_actors.errors import needs_extra
from rho_actors.isolation.base import Isolation, IsolationServices, worker_call
from rho_actors.isolation.call import CallSpec, RunCall
from rho_actors.results import failure
from rho_actors.tool import ToolResult

if TYPE_CHECKING:
    from rho_actors.isolation.ray_tasks import RayRuntime

__all__ = ["RayIsolation"]


class _Running:
    __slots__ = ("call",)

    def __init__(self, call: CallSpec) -> None:
        self.call = call

    def cancel(self, reason: str) -> None:
        """Set the call's token: its Ray task is force-cancelled."""
        self.call.cancel.cancel(reason)


class RayIsolation(Isolation):
    """Runs each call as a Ray task through ``runtime`` (default: the process's
    :func:`rho_actors.isolation.ray_tasks.default_runtime`, connected on the first call)."""

    name: ClassVar[str] = "ray"
    untrusted_refused: ClassVar[str | None] = (
        "Ray unpickles what its workers return, so a compromised worker could forge objects in the host; "
        "use isolation='process'"
    )

    def __init__(self, services: IsolationServices, runtime: RayRuntime | None = None) -> None:
        super().__init__(services)
        self._lock = threading.Lock()
        self._runtime = runtime
        self._held = False  # the runtime is the process's default one, held by this isolation
        self._open = False

    def check_options(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
        """``resources`` of a Ray tool: ``num_cpus``, ``num_gpus``, ``memory``,
        ``runtime_env`` and custom resources (see
        :meth:`rho_actors.isolation.ray_tasks.RayResources.from_mapping`). Raises
        ``ValueError`` for bad resources and ``ImportError`` without the ``ray`` extra."""
        with needs_extra("ray", 'isolation="ray"'):
            from rho_actors.isolation.ray_tasks import RayResources

        RayResources.from_mapping(options)
        return MappingProxyType(dict(options))

    def runtime(self) -> RayRuntime:
        """The Ray runtime of this isolation (the system's one: the process's
        :func:`~rho_actors.isolation.ray_tasks.default_runtime`, held until
        :meth:`shutdown`). Raises ``ImportError`` without the ``ray`` extra, and
        ``ValueError`` when this process already uses Ray with other settings."""
        from rho_actors.isolation.ray_tasks import default_runtime

        with self._lock:
            if self._runtime is None:
                self._runtime = default_runtime(self.services.ray, hold=True)
                self._held = True
            return self._runtime

    def start(self, call: CallSpec) -> _Running:
        self.services.calls.start().tell(RunCall(call, self._run))
        return _Running(call)

    def _run(self, call: CallSpec) -> ToolResult:
        """The runner, in the CallActor's thread: the call as a Ray task, until its result."""
        if not self._open:
            return failure("ray_not_running", call.call_id, call.name)
        try:
            from rho_actors.isolation.ray_tasks import RayResources, run_call

            runtime = self.runtime()
        except ImportError as err:
            return failure("ray_not_installed", call.call_id, call.name, problem=str(err))
        tools = self.services.tools
        entry = tools.current.entries.get(call.name) if tools is not None else None
        if entry is not None and entry.tool is not call.tool:
            entry = None
        resources = RayResources.from_mapping(entry.placement.options if entry is not None else {})
        # the registry's entry is the tool's version, as for worker processes (ShippedTools)
        return run_call(runtime, worker_call(call, version=entry), resources)

    def open(self) -> None:
        """Accept calls; with ``ActorSystem(ray={...})``, begin connecting to Ray in the
        background (Ray is imported in that thread, not here)."""
        with self._lock:
            self._open = True
        if self.services.ray is not None:
            threading.Thread(target=self._warm, name="rho_actors-ray-warm", daemon=True).start()

    def _warm(self) -> None:
        try:
            self.runtime().start_connecting()
        except Exception as exc:  # no ray extra, or other settings in use: said at the first call
            logger.warning("the ray isolation cannot connect: {}", exc)

    def shutdown(self, timeout_s: float) -> None:
        """Refuse new calls (running ones are cancelled through their tokens by the
        system) and release the runtime: the last system to release the process's
        runtime leaves Ray as it found it (a local Ray it started is stopped, with its
        processes, within ``timeout_s``)."""
        with self._lock:
            self._open = False
            runtime, held, self._held = self._runtime, self._held, False
            if held:
                self._runtime = None
        if held and runtime is not None:
            from rho_actors.isolation.ray_tasks import release_default

            release_default(runtime, timeout_s)

    def describe(self) -> dict[str, Any]:
        """``tasks`` in flight (call, tool, task id, time running and left) and ``actors``
        (the Ray actors of supervised Ray servers, with their nodes), once Ray is in use."""
        with self._lock:
            runtime = self._runtime
        return {"tasks": runtime.tasks(), "actors": runtime.actors()} if runtime is not None else {}

    def stats(self) -> dict[str, int]:
        """The runtime's counters (``ray_tasks_running``, ``ray_tasks_total``,
        ``ray_actors``), none before its first use."""
        with self._lock:
            runtime = self._runtime
        return runtime.stats() if runtime is not None else {}
