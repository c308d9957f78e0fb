"""The Ray cluster's live nodes, as rho places calls on them (DESIGN §5). Needs the ``ray`` extra.

Ray's GCS marks a node dead only after it has missed its health checks for a while
(about 15 s by default), and until then it keeps placing work there: a call pinned to a
node that has just died waits out its whole deadline. :class:`NodeTable` keeps its own
view: the nodes the GCS says are alive, minus the nodes found lost, either named by a
call that failed with Ray's ``NodeDiedError`` (:meth:`NodeTable.mark_lost`) or found by
:meth:`NodeTable.refresh`, which asks each node's raylet for a TCP connection (a raylet
that is gone refuses it at once; one that does not answer twice in a row is lost too).
Feasibility (:meth:`NodeTable.infeasible`) is checked
against that view, so a call no live node can hold is ``unavailable`` at once.

A node id is never reused (a restarted raylet gets a new one), so a node found lost stays
lost. Through Ray Client (``ray://``) the raylets are not reachable from the host, and
only the GCS's view is used.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import ray

__all__ = ["NodeTable", "short_id"]

_TTL_S = 2.0  # how long a view of the nodes' totals is trusted for feasibility checks
_PROBE_TIMEOUT_S = 1.0  # a raylet that does not accept a connection within this is lost
_MAX_LOST = 4096
_NODE_ID_LABEL = "ray.io/node-id"  # the label every Ray node has


def short_id(node_id: str) -> str:
    """The first 8 hex digits of a Ray node id, as Ray's own logs show it."""
    return node_id[:8]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _probe(address: str, port: int) -> str | None:
    """None when the raylet at ``address:port`` accepts a TCP connection, else why not:
    ``"refuses connections"`` (nothing listens: it is gone) or ``"does not answer"``."""
    try:
        with socket.create_connection((address, port), timeout=_PROBE_TIMEOUT_S):
            return None
    except ConnectionRefusedError:
        return "refuses connections"
    except OSError:
        return "does not answer"


class NodeTable:
    """The live nodes of the Ray cluster this process is connected to (thread-safe).

    ``probe`` says whether raylets are asked directly (off through Ray Client)."""

    def __init__(self, probe: bool = True) -> None:
        self.probe = probe
        self._lock = threading.Lock()
        self._at = 0.0
        self._alive: dict[str, dict[str, Any]] = {}  # node id -> ray.nodes() entry, the GCS's view
        self._lost: dict[str, str] = {}  # node id -> how it was found lost
        self._where: dict[str, str] = {}  # node id -> its address, for the texts
        self._silent: dict[str, int] = {}  # node id -> probes in a row that timed out

    def mark_lost(self, node_id: str, why: str) -> bool:
        """Count ``node_id`` as lost (``why``: how it was found). True if it was not yet."""
        with self._lock:
            if not node_id or node_id in self._lost:
                return False
            self._lost[node_id] = why
            while len(self._lost) > _MAX_LOST:
                self._lost.pop(next(iter(self._lost)))
            return True

    def is_lost(self, node_id: str) -> bool:
        """Whether ``node_id`` is known lost."""
        with self._lock:
            return node_id in self._lost

    def lost(self) -> dict[str, str]:
        """The nodes found lost: node id -> how."""
        with self._lock:
            return dict(self._lost)

    def avoid(self) -> dict[str, str]:
        """Ray's ``label_selector`` option keeping new work off the lost nodes the GCS
        still lists as alive (``{}`` when there are none): Ray would place work there
        until it marks them dead."""
        with self._lock:
            lost = sorted(node_id for node_id in self._lost if node_id in self._alive)
        return {_NODE_ID_LABEL: f"!in({', '.join(lost)})"} if lost else {}

    def describe(self, node_id: str) -> str:
        """``"node 1a2b3c4d (127.0.0.1)"`` for the texts."""
        with self._lock:
            where = self._where.get(node_id)
        return f"node {short_id(node_id)}" + (f" ({where})" if where else "")

    def refresh(self) -> set[str]:
        """Read the GCS's node table and, with ``probe``, ask each alive node's raylet
        for a connection; returns the node ids newly found lost (a node the GCS now
        marks dead counts too). Raises what ``ray.nodes()`` raises."""
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        newly: set[str] = set()
        alive: dict[str, dict[str, Any]] = {}
        for node in nodes:
            node_id = str(node.get("NodeID", ""))
            with self._lock:
                self._where[node_id] = str(node.get("NodeManagerAddress", ""))
            if not node.get("Alive"):
                with self._lock:
                    seen = node_id in self._alive
                if seen and self.mark_lost(node_id, "Ray marked it dead"):
                    newly.add(node_id)
                continue
            alive[node_id] = node
        if self.probe:
            for node_id, node in alive.items():
                address, port = str(node.get("NodeManagerAddress", "")), int(node.get("NodeManagerPort") or 0)
                if self.is_lost(node_id) or not address or not port:
                    continue
                why = _probe(address, port)
                before = self._silent.pop(node_id, 0)
                silent = before + 1 if why == "does not answer" else 0
                if silent == 1:  # a timeout may be a passing stall: lost at the second one in a row
                    self._silent[node_id] = silent
                elif why is not None and self.mark_lost(node_id, f"its raylet at {address}:{port} {why}"):
                    newly.add(node_id)
        with self._lock:
            self._alive = alive
            self._at = time.monotonic()
        return newly

    def totals(self, fresh: bool = False) -> list[dict[str, float]]:
        """Each live node's total resources (Ray's names), refreshed when older than 2 s
        or ``fresh``."""
        with self._lock:
            stale = fresh or time.monotonic() - self._at > _TTL_S
        if stale:
            self.refresh_gcs()
        with self._lock:
            return [dict(n.get("Resources", {})) for i, n in self._alive.items() if i not in self._lost]

    def refresh_gcs(self) -> None:
        """Read the GCS's node table only (no probes: quick enough for a call's path)."""
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        alive = {str(n.get("NodeID", "")): n for n in nodes if n.get("Alive")}
        with self._lock:
            for node_id, node in alive.items():
                self._where[node_id] = str(node.get("NodeManagerAddress", ""))
            self._alive = alive
            self._at = time.monotonic()

    def infeasible(self, demand: Mapping[str, float]) -> str | None:
        """Why no live node could ever hold ``demand`` (Ray's resource names and
        amounts), or None."""
        if not demand:
            return None

        def fits(nodes: list[dict[str, float]]) -> bool:
            return any(all(node.get(k, 0.0) >= v for k, v in demand.items()) for node in nodes)

        nodes = self.totals()
        if fits(nodes):
            return None
        nodes = self.totals(fresh=True)
        if fits(nodes):
            return None
        best = {k: max((node.get(k, 0.0) for node in nodes), default=0.0) for k in demand}
        short = [f"{k}={_num(v)} (the largest node has {_num(best[k])})" for k, v in demand.items() if best[k] < v]
        if not short:
            short = [f"{', '.join(f'{k}={_num(v)}' for k, v in demand.items())} together"]
        text = f"no node of the Ray cluster has {'; '.join(short)}"
        with self._lock:
            gone = [(node_id, why) for node_id, why in self._lost.items() if node_id in self._where]
        if gone:
            text += "; lost: " + ", ".join(f"{self.describe(n)}, {why}" for n, why in gone[-3:])
        return text
