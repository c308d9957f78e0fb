"""Reaching Ray within a bound, off the call path, and leaving it as found (DESIGN §5).
Needs the ``ray`` extra.

``ray.init`` has no time limit: against a cluster that does not answer it can block for
minutes. A :class:`Connection` runs it in a thread of its own; a caller waits for it
within its own bound (a call's deadline) and gets :class:`RayUnreachable` naming why
when Ray is not there yet, or did not answer within ``connect_timeout_s`` (then for
``retry_s`` no new attempt is made: callers get the error at once). A ``ray.init`` that
is still blocked is never started twice; if it succeeds late, the connection is up.

:meth:`Connection.close` leaves Ray as it was found: a local Ray this connection started
is shut down, and its processes (GCS, raylet, workers and the rest) are gone before it
returns (those still there after ``timeout_s`` are killed); a cluster reached by address
is only disconnected from (rho's Ray actors are killed by their servers before).
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil
import ray
from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.errors import RhoError

__all__ = ["Connection", "RayUnreachable", "loopback_only"]

DEFAULT_CONNECT_TIMEOUT_S = 30.0  # to reach a running cluster
DEFAULT_START_TIMEOUT_S = 120.0  # to start a local Ray: tens of seconds on a busy machine
RETRY_S = 5.0


class RayUnreachable(RhoError):
    """Ray could not be reached (yet); ``str(err)`` says why."""


def loopback_only() -> None:
    """A Ray started here serves this host alone: bind it to loopback. Ray resolves
    ``127.0.0.1`` to the machine's own address unless multi-node clusters are off
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read by every Ray process it starts; the
    driver read it at import, so its copy of the setting is turned off too). A cluster
    reached with ``ActorSystem(ray={"address": ...})`` is not touched."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _is_loopback(address: str) -> bool:
    """Whether a Ray address (``"host:port"``, ``"ray://host:port"``) names this host's loopback."""
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _ray_processes() -> list[psutil.Process]:
    """The processes of the local Ray node this process started (GCS, raylet, agents,
    log monitor) and all their descendants (the workers), alive now."""
    node = getattr(ray._private.worker, "_global_node", None)
    found: dict[int, psutil.Process] = {}
    for infos in dict(getattr(node, "all_processes", None) or {}).values():
        for info in infos:
            pid = getattr(getattr(info, "process", None), "pid", None)
            if not isinstance(pid, int):
                continue
            try:
                proc = psutil.Process(pid)
                found[pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
            except psutil.Error:
                continue
    return list(found.values())


class Connection:
    """The process's connection to Ray, made in a thread of its own.

    ``config``: ``address`` (none: start a local Ray of its own on loopback, never
    joining another cluster of this machine unless ``RAY_ADDRESS`` says so, or attach to
    the one this process already runs), ``namespace``, ``runtime_env``, and for a local Ray
    ``num_cpus``, ``num_gpus`` and ``resources`` (custom resources by name).
    ``connect_timeout_s`` bounds each attempt; ``on_connected`` runs once connected, in
    the connecting thread, and should keep it alive until :meth:`close` (a local Ray's
    processes are started with ``PR_SET_PDEATHSIG``: they die with the thread that started
    them)."""

    def __init__(self, config: Mapping[str, Any], connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 on_connected: Callable[[], None] | None = None) -> None:
        self.config = dict(config)
        self.connect_timeout_s = connect_timeout_s
        self._on_connected = on_connected
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.connected = False
        self.owns_ray = False  # this connection called ray.init (and so disconnects at close)
        self.started_local = False  # ... and that started a local Ray
        self._thread: threading.Thread | None = None
        self._began = 0.0
        self._error: str | None = None
        self._retry_at = 0.0
        self._closed = False

    @property
    def where(self) -> str:
        """The cluster's address, or ``"a local Ray"``."""
        address = self.config.get("address")
        return f"the Ray cluster at {address}" if address else "a local Ray"

    def start(self) -> None:
        """Begin connecting in the background, unless connected, connecting, or a failed
        attempt is younger than ``retry_s``. Never blocks on Ray."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self.connected or self._closed or self._thread is not None:
            return
        if self._error is not None and time.monotonic() < self._retry_at:
            return
        self._error = None
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._connect, name="rho_actors-ray-connect", daemon=True)
        self._thread.start()

    def wait(self, wait_s: float) -> None:
        """Return once connected, within ``wait_s`` seconds (starting to connect if
        needed). Raises :class:`RayUnreachable` naming why Ray is not there: the error
        of the last attempt, no answer within ``connect_timeout_s``, or still connecting
        when ``wait_s`` ran out."""
        until = time.monotonic() + max(0.0, wait_s)
        with self._changed:
            if self.connected:
                return
            if self._closed:
                raise RayUnreachable("the connection to Ray is closed (its system stopped)")
            self._start_locked()
            while not self.connected:
                if self._error is not None:
                    raise RayUnreachable(f"{self.where}: {self._error}")
                now = time.monotonic()
                give_up = self._began + self.connect_timeout_s
                if now >= give_up:
                    self._error = f"no answer within {self.connect_timeout_s:g} s"
                    self._retry_at = now + RETRY_S
                    raise RayUnreachable(f"{self.where}: {self._error}")
                if now >= until:
                    raise RayUnreachable(f"still connecting to {self.where} ({now - self._began:.1f} s so far)")
                self._changed.wait(min(until, give_up) - now)

    def _connect(self) -> None:
        try:
            if ray.is_initialized():
                owned = local = False
            else:
                kwargs: dict[str, Any] = {"namespace": self.config.get("namespace"),
                                          "runtime_env": self.config.get("runtime_env"), "log_to_driver": False}
                if self.config.get("address"):
                    kwargs["address"] = self.config["address"]
                    if _is_loopback(str(kwargs["address"])):
                        loopback_only()  # else Ray swaps 127.0.0.1 for the machine's own address
                    local = False
                else:
                    loopback_only()
                    # "local": a Ray of its own, never another cluster of this machine that a
                    # plain ray.init() would join (the latest `ray start` or test harness);
                    # RAY_ADDRESS, when set, still says where to go
                    if not os.environ.get("RAY_ADDRESS"):
                        kwargs["address"] = "local"
                    kwargs.update(_node_ip_address="127.0.0.1", include_dashboard=False,
                                  num_cpus=self.config.get("num_cpus"), num_gpus=self.config.get("num_gpus"),
                                  resources=self.config.get("resources"))
                    local = True
                ray.init(**kwargs)
                owned = True
        except Exception as exc:
            with self._changed:
                self._error = describe_exception(exc)
                self._retry_at = time.monotonic() + RETRY_S
                self._thread = None
                self._changed.notify_all()
            logger.warning("rho_actors could not reach {}: {}", self.where, self._error)
            return
        with self._changed:
            closed = self._closed
            self.owns_ray, self.started_local = owned, local
            self.connected = not closed
            self._error = None
            self._thread = None
            self._changed.notify_all()
        if closed:  # the system stopped while ray.init ran: leave Ray as found
            self._disconnect(5.0)
            return
        if self._on_connected is not None:
            self._on_connected()

    def close(self, timeout_s: float) -> list[int]:
        """Disconnect (and stop a local Ray this connection started, its processes gone
        within ``timeout_s`` seconds, the rest then killed). Returns the pids of Ray
        processes still alive after that (normally none). Idempotent."""
        with self._changed:
            self._closed = True
            was = self.connected
            self.connected = False
            self._changed.notify_all()
        return self._disconnect(timeout_s) if was else []

    def _disconnect(self, timeout_s: float) -> list[int]:
        if not self.owns_ray:
            return []
        procs = _ray_processes() if self.started_local else []
        try:
            ray.shutdown()
        except Exception as exc:
            logger.warning("ray.shutdown failed: {}", describe_exception(exc))
        self.owns_ray = False
        if not procs:
            return []
        _, alive = psutil.wait_procs(procs, timeout=max(0.0, timeout_s))
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(alive, timeout=2.0)
        if alive:
            logger.warning("Ray processes {} outlived ray.shutdown()", [p.pid for p in alive])
        return [p.pid for p in alive]
