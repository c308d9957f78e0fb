"""One session's BFCL backends as a stateful server of an isolation (internal to
:mod:`rho_actors.integrations.bfcl`; DESIGN §5 "Where state lives").

``replay(isolation=...)`` starts, per session, a server holding that session's backend
instances (:class:`BfclBackends`): ``thread`` a :class:`~rho_actors.isolation.servers.ThreadActor`
in the host, ``process`` a trusted :class:`~rho_actors.isolation.servers.ProcessActor`
(the instances are built and kept in the server's own process), ``ray`` a
:class:`~rho_actors.integrations.ray.servers.RayActor` (in a Ray actor). Every call of the
session runs there: its :class:`~rho_actors.integrations.bfcl.BfclTool` (in ``thread``
isolation) finds the server by the name in ``deps["server"]`` and asks it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from rho_actors.integrations.bfcl.convert import execute_direct
from rho_actors.integrations.bfcl.data import ERROR_PREFIX, BfclEntry, build_instances, public_state

__all__ = ["ISOLATIONS", "SERVER_DEP", "BfclBackends", "connect", "server_name", "server_start"]

ISOLATIONS: Final = ("thread", "process", "ray")
"""Where a replay's backends may live (``replay(isolation=...)``)."""
_RAY_START_TIMEOUT_MS: Final = 300_000
SERVER_DEP: Final = "server"
"""The ``deps`` key naming the session's backends server."""


class BfclBackends:
    """The backend instances of one BFCL entry (:func:`build_instances`), built where this
    object is built: a server's state."""

    def __init__(self, entry: BfclEntry) -> None:
        self.instances = build_instances(entry)

    def call(self, class_name: str, name: str, args: Mapping[str, Any]) -> tuple[str, bool]:
        """``instances[class_name].name(**args)`` as :func:`execute_direct` runs it:
        ``(text, raised)``."""
        instance = self.instances.get(class_name)
        if instance is None:
            return f"{ERROR_PREFIX}no {class_name} instance in this session", True
        return execute_direct(instance, name, args)

    def states(self) -> dict[str, dict[str, Any]]:
        """Each instance's public state (:func:`public_state`), by class name."""
        return {class_name: public_state(instance) for class_name, instance in self.instances.items()}


def server_name(entry: BfclEntry) -> str:
    """The name (and child id) of ``entry``'s backends server."""
    return f"bfcl:{entry.id}"


def server_start(isolation: str, entry: BfclEntry) -> Callable[[], Any]:
    """The ``start`` of the child spec of ``entry``'s backends server in ``isolation``
    (one of :data:`ISOLATIONS`; else ``ValueError``). ``ray`` needs the ``ray`` extra."""
    if isolation == "thread":
        from rho_actors.isolation.servers import ThreadActor

        return ThreadActor(BfclBackends, entry)
    if isolation == "process":
        from rho_actors.isolation.servers import ProcessActor

        return ProcessActor(BfclBackends, entry, trusted=True)
    if isolation == "ray":
        from rho_actors.integrations.ray.servers import RayActor

        # a fresh Ray worker per session: on a loaded machine its start can take over a minute
        return RayActor(BfclBackends, entry, resources={"num_cpus": 0}, start_timeout_ms=_RAY_START_TIMEOUT_MS)
    raise ValueError(f"unknown isolation {isolation!r}; choose one of {', '.join(ISOLATIONS)}")


def connect(isolation: str) -> None:
    """Before the system starts: for ``process``, have the trusted fork server import
    BFCL's backend modules once (:func:`rho_actors.sandbox.preload_trusted_modules`),
    so each session's server process starts with them, and start it; for ``ray``, connect to (or
    start) Ray. Both are one-time costs, like the system's start, kept out of every
    session's time."""
    if isolation == "process":
        from rho_actors.integrations.bfcl.data import backend_config
        from rho_actors.sandbox import preload_trusted_modules

        preload_trusted_modules(__name__, *backend_config().CLASS_FILE_PATH_MAPPING.values())
        from multiprocessing import forkserver

        from rho_actors.sandbox import context

        context("forkserver")  # its preload list set, then started now, not in the first session
        forkserver.ensure_running()
    if isolation == "ray":
        from rho_actors.isolation.ray_tasks import default_runtime

        default_runtime().connect()
