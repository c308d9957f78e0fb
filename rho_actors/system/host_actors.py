"""The host's own actors in an :class:`~rho_actors.ActorSystem` (DESIGN §6; internal: the
methods are the system's, re-exported as ``rho_actors.ActorSystem``'s).

:class:`HostActors` is the part of the system that runs the host's own actors beside its
tools: :meth:`~HostActors.start_child` puts one (a stateful tool server, a source's
connection) in a subtree of its own under ``servers`` or ``sources``,
:meth:`~HostActors.stop_child` ends it, :meth:`~HostActors.whereis` and
:meth:`~HostActors.lookup` find a named actor, :meth:`~HostActors.tree` describes the live
supervision tree. It also names the system's own actors and reaches them:
:meth:`~HostActors._ask` asks one (a method of the registry, say) and waits for the
answer, asking again while it restarts, up to :data:`RESTART_PATIENCE_S`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pykka

from rho_actors.observe.tree import describe_tree
from rho_actors.otp.names import Names
from rho_actors.otp.owned import OwnedProcesses
from rho_actors.otp.supervisor import ChildSpec, StartChild, start_adopted
from rho_actors.runtime import Runtime

__all__ = ["CALLS", "REGISTRY", "RESTART_PATIENCE_S", "ROOT", "SERVERS", "SESSIONS", "SOURCES", "WORKERS",
           "HostActors"]

REGISTRY, CALLS, WORKERS, ROOT = "registry", "calls", "workers", "root"
SOURCES, SESSIONS, SERVERS = "sources", "sessions", "servers"
"""The names of the system's own actors (its root's children)."""

RESTART_PATIENCE_S = 5.0  # seconds a call into a system actor being restarted waits for it (then raises)


class HostActors:
    """The host's own actors of an :class:`~rho_actors.ActorSystem` (see the module doc);
    the system sets every attribute below."""

    _names: Names
    _owned: OwnedProcesses
    _intensity: dict[str, Any]
    _runtime: Runtime
    _supervisor: Callable[..., StartChild]
    _ask_timeout_s: float
    _root: pykka.ActorRef[Any]
    _sessions_dir: Path
    _stopped: bool
    exit_reason: object
    _proxies: dict[str, tuple[pykka.ActorRef[Any], Any]]

    def _whereis(self, name: str) -> pykka.ActorRef[Any]:
        """The live ref of the system's actor ``name`` (waiting :data:`RESTART_PATIENCE_S`
        while it restarts); raises ``RuntimeError`` naming the system's state."""
        ref = self._names.whereis(name)
        if ref is None and not self._stopped:  # restarting: its supervisor brings it back at once
            ref = self._names.await_name(name, RESTART_PATIENCE_S, lambda: self._stopped)
        if ref is None:
            state = f"stopped ({self.exit_reason})" if self._stopped else "restarting"
            raise RuntimeError(f"the system's {name!r} actor is not running: the system is {state}")
        return ref

    def _ask(self, name: str, method: str, *args: Any) -> Any:
        """``method(*args)`` of the system's actor ``name``, answered; asked again while it restarts
        (:data:`RESTART_PATIENCE_S`) when it died before handling the message (``ActorDeadError``)."""
        until = time.monotonic() + RESTART_PATIENCE_S
        while True:
            try:
                return getattr(self._proxy(name), method)(*args).get(timeout=self._ask_timeout_s)
            except pykka.ActorDeadError:
                if self._stopped or time.monotonic() >= until:
                    raise

    def _proxy(self, name: str) -> Any:
        """A proxy of the system's actor ``name``, built once per actor (pykka inspects
        every attribute of the actor to build one), anew after a restart. Raises as
        :meth:`_whereis`."""
        ref = self._whereis(name)
        cached = self._proxies.get(name)
        if cached is None or cached[0] is not ref:
            cached = self._proxies[name] = (ref, ref.proxy())
        return cached[1]

    def start_child(
        self, spec: ChildSpec, *, max_restarts: int | None = None, max_seconds: float | None = None,
        under: Literal["servers", "sources"] = "servers",
    ) -> pykka.ActorRef[Any]:
        """Start one of the host's actors (a stateful tool server, say) in its own subtree under ``servers``: a
        supervisor with this server's own restart intensity (``max_restarts`` in ``max_seconds`` seconds; default:
        the system's) over the child of ``spec`` (restarted by its restart type). A server that crash-loops is given
        up alone: its subtree stops, :meth:`whereis` gives ``None``, :meth:`lookup` raises naming why, and the other
        servers, sources and sessions go on. With ``spec.name`` it can be found with :meth:`whereis` (and from a
        tool, with ``ctx["whereis"]``). Returns its ref (it follows no restart: use :meth:`whereis`).
        ``under="sources"`` puts the subtree under ``sources`` instead: for a source's own actors (an MCP server's
        connection), the system's side of the tree. The subtree starts in the caller's thread (within the child's
        own start bound plus 10 s), so a slow server start holds up no other server; a ``RayActor`` without
        ``runtime=`` runs on the system's Ray runtime, once connected. Raises ``ValueError`` when a running actor
        holds ``spec.name``, a running server has ``spec.id`` (OTP's ``already_started``), or for another ``under``;
        the child's start error (a ``RuntimeError`` for a ``BaseException``), and ``RuntimeError`` when the system
        is stopping."""
        if under not in (SERVERS, SOURCES):
            raise ValueError(f"under must be {SERVERS!r} or {SOURCES!r}, got {under!r}")
        holder = self._names.whereis(spec.name) if spec.name is not None else None
        if holder is not None:
            raise ValueError(f"the name {spec.name!r} is held by {holder}")
        intensity = {
            "max_restarts": self._intensity["max_restarts"] if max_restarts is None else max_restarts,
            "max_seconds": self._intensity["max_seconds"] if max_seconds is None else max_seconds,
        }
        if getattr(spec.start, "wants_runtime", False):  # a RayActor without runtime=: the system's Ray runtime
            ray_runtime = self._runtime.isolations["ray"].runtime()  # type: ignore[attr-defined]
            spec = dataclasses.replace(spec, start=spec.start.bound_to(ray_runtime))  # type: ignore[attr-defined]
        child = spec if spec.restart == "permanent" else dataclasses.replace(spec, significant=True)
        subtree = self._supervisor(f"{under[:-1]}:{spec.id}", children=[child], auto_shutdown="any_significant",
                                   **intensity)  # its start waits for the child's: its bound covers the child's own
        own_s = getattr(spec.start, "timeout_s", 0) or getattr(spec.start, "start_timeout_ms", 0) / 1000 + 5
        subtree = dataclasses.replace(subtree, timeout_s=max(subtree.timeout_s, float(own_s) + 10))
        server = ChildSpec(
            spec.id, subtree, restart="temporary", type="supervisor",
            shutdown=(spec.shutdown if isinstance(spec.shutdown, int) else 0) + 1_000,
        )
        with self._owned.starting():  # its processes are the system's (rho_actors.otp.owned)
            return start_adopted(self._proxy(under), server, self._ask_timeout_s)

    def stop_child(self, child_id: str, *, under: Literal["servers", "sources"] = "servers") -> bool:
        """Stop the subtree :meth:`start_child` started for ``child_id`` and forget it (OTP's
        ``terminate_child``: a process server's process is killed); whether there was one."""
        if under not in (SERVERS, SOURCES):
            raise ValueError(f"under must be {SERVERS!r} or {SOURCES!r}, got {under!r}")
        return bool(self._proxy(under).terminate_child(child_id).get(timeout=self._ask_timeout_s + 30))

    def whereis(self, name: str) -> pykka.ActorRef[Any] | None:
        """The live ref of the actor registered as ``name`` in this system (it follows
        restarts), or None (Erlang's ``whereis/1``)."""
        return self._names.whereis(name)

    def lookup(self, name: str) -> pykka.ActorRef[Any]:
        """The live ref registered as ``name``; raises :class:`rho_actors.NotRunningError` naming why there is none:
        never started, stopped, restarting (with the crash), or given up by its supervisor (with the
        :class:`rho_actors.RestartIntensityExceeded` as ``reason``)."""
        return self._names.lookup(name)

    def tree(self) -> dict[str, Any]:
        """The live supervision tree as plain data. Each node: ``id``, ``kind`` (``"supervisor"`` or ``"worker"``),
        ``restart``, ``restarts``, ``alive``; supervisors add ``strategy`` and ``children``; the ``calls`` supervisor
        gives a ``running`` count instead of a node per call, and ``governor``, the bounds on calls with each bounded
        tool's ``running`` and ``queued`` calls (:meth:`rho_actors.governor.Governor.describe`); a session's ``loop``
        adds ``running``: its calls with ``tool`` and ``ms_left`` to the deadline; a stateful server adds ``server``:
        its ``isolation``, ``class``, ``pid``... (:mod:`rho_actors.isolation.servers`); ``workers`` adds
        ``isolations``: what each isolation in use shows (``ray``: its tasks in flight)."""
        return describe_tree(self._root, self._runtime, self._sessions_dir, root_id=ROOT, calls_id=CALLS,
                             workers_id=WORKERS, ask_timeout_s=self._ask_timeout_s)
