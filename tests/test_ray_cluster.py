"""Node loss on a real multi-node Ray cluster: Ray's own test harness
(``ray.cluster_utils.Cluster``: a head and worker nodes as separate raylets, on loopback
only), with custom resources that pin calls to a node. Starting the nodes takes tens of
seconds, so these run outside the default run: ``pytest -m ray_cluster tests/test_ray_cluster.py``."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ChildSpec, ErrorKind, ToolCall

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'rho_actors[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

from rho_actors.integrations.ray.servers import RayActor, RayCall  # noqa: E402
from rho_actors.isolation.ray_connection import loopback_only  # noqa: E402
from tests.conftest import WAIT_S, wait_for  # noqa: E402

pytestmark = [pytest.mark.ray_cluster, pytest.mark.timeout(300)]

LOOPBACK: dict[str, Any] = {"node_ip_address": "127.0.0.1"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process by something else")
    loopback_only()
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **LOOPBACK})
    try:
        yield made
    finally:
        if ray.is_initialized():
            ray.shutdown()
        made.shutdown()  # type: ignore[no-untyped-call]


class Where:
    """A tool doing what ``args["do"]`` says in its Ray worker; ``pid_file`` gets the pid."""

    @staticmethod
    def name() -> str:
        return "where"

    @staticmethod
    def description() -> str:
        return "Where the call runs."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object"}

    @staticmethod
    def timeout_ms() -> int:
        return 60_000

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        if "pid_file" in args:
            Path(args["pid_file"]).write_text(str(os.getpid()))
        if args.get("do") == "sleep":
            time.sleep(args["s"])
        return ray.get_runtime_context().get_node_id()


class Pinned(Where):
    @staticmethod
    def name() -> str:
        return "pinned"


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n


def _tasks(system: ActorSystem) -> list[dict[str, Any]]:
    workers = next(c for c in system.tree()["children"] if c["id"] == "workers")
    tasks: list[dict[str, Any]] = workers.get("isolations", {}).get("ray", {}).get("tasks", [])
    return tasks


def _actors(system: ActorSystem) -> list[dict[str, Any]]:
    workers = next(c for c in system.tree()["children"] if c["id"] == "workers")
    actors: list[dict[str, Any]] = workers.get("isolations", {}).get("ray", {}).get("actors", [])
    return actors


def test_node_loss(cluster: Cluster, tmp_path: Path) -> None:
    """A node with a running call, a queued call and a supervised server is killed
    (its raylet and everything on it, SIGKILL): the running call is ``crashed`` naming
    the node within seconds (not at its 60 s deadline), the queued one and a new call
    pinned to the node are ``unavailable`` at once, later calls run on the remaining
    node, the server is restarted there within its intensity and the tree shows where;
    at ``stop()`` the system's Ray actors are gone and the cluster is as it was found."""
    node_b = cluster.add_node(num_cpus=2, resources={"node_b": 1, "worker": 4}, **LOOPBACK)
    system = ActorSystem(data_dir=tmp_path / "data", ray={"address": cluster.address})
    box: list[Any] = []
    try:
        system.register(Where, isolation="ray", resources={"num_cpus": 0, "worker": 1})
        system.register(Pinned, isolation="ray", resources={"num_cpus": 0, "node_b": 1})
        # the server starts while node B is the only node that can hold it
        spec = ChildSpec("counter", RayActor(Counter, resources={"num_cpus": 0, "worker": 1}, ping_ms=200),
                         name="counter")
        system.start_child(spec, max_restarts=2, max_seconds=60)
        assert system.lookup("counter").ask(RayCall("incr"), timeout=WAIT_S) == 1
        [server] = _actors(system)
        assert server["node_id"] == node_b.node_id and server["node"] == f"node {node_b.node_id[:8]} (127.0.0.1)"
        node_a = cluster.add_node(num_cpus=2, resources={"node_a": 1, "worker": 4}, **LOOPBACK)
        loop = system.start_loop("s1")
        pid_file = tmp_path / "pid"
        other = system.start_loop("s2")
        turns = [threading.Thread(target=lambda: box.append(loop.run_turn([
            ToolCall("c1", "pinned", json.dumps({"do": "sleep", "s": 300, "pid_file": str(pid_file)}))]))),
            threading.Thread(target=lambda: box.append(other.run_turn([ToolCall("c2", "pinned", "{}")])))]
        turns[0].start()
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", 60), "c1 never began on node B"
        turns[1].start()  # node_b=1 is held by c1: c2 waits in Ray's queue
        assert wait_for(lambda: {t["call_id"]: t["node_id"] for t in _tasks(system)} == {
            "c1": node_b.node_id, "c2": ""}), _tasks(system)
        killed = time.monotonic()
        cluster.remove_node(node_b, allow_graceful=False)  # SIGKILL: raylet, object store, workers
        for turn in turns:
            turn.join(30)
        took = time.monotonic() - killed
        assert len(box) == 2, "the turns did not end within 30 s of the node's loss"
        [crashed], [queued] = sorted(box, key=lambda turn: turn[0].call_id)
        assert crashed.error_kind is ErrorKind.CRASHED, crashed
        assert f"the Ray node it ran on, node {node_b.node_id[:8]} (127.0.0.1), was lost" in crashed.content, crashed
        assert queued.error_kind is ErrorKind.UNAVAILABLE and "node_b=1" in queued.content, queued
        assert took < 10, f"the calls on the lost node came back {took:.1f} s after the kill"
        # a new call pinned to the lost node: unavailable at once (Ray still lists it alive for ~15 s)
        began = time.monotonic()
        [pinned] = loop.run_turn([ToolCall("c3", "pinned", "{}")])
        assert pinned.error_kind is ErrorKind.UNAVAILABLE, pinned
        assert f"lost: node {node_b.node_id[:8]}" in pinned.content, pinned
        assert time.monotonic() - began < 2.0
        # later calls run on the remaining nodes
        later = loop.run_turn([ToolCall(f"c{i}", "where", "{}") for i in range(4, 8)])
        assert all(r.ok for r in later), later
        assert {r.content for r in later} == {node_a.node_id}, later
        # the server was restarted on node A, within its intensity; the tree shows where
        assert wait_for(lambda: [a["node_id"] for a in _actors(system)] == [node_a.node_id], 30), _actors(system)
        assert system.lookup("counter").ask(RayCall("incr"), timeout=WAIT_S) == 1  # a fresh Ray actor
        servers = next(c for c in system.tree()["children"] if c["id"] == "servers")
        [subtree] = servers["children"]
        assert subtree["children"][0]["restarts"] == 1, subtree
        assert system.stats()["ray_nodes_lost"] == 1
    finally:
        system.stop()
    assert not ray.is_initialized()  # the system disconnected from the cluster it was given
    # the cluster as found: none of the system's actors alive, no placement group
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        assert wait_for(lambda: all(a["State"] == "DEAD" for a in ray._private.state.actors().values()), 30)
        assert len(ray._private.state.actors()) == 2  # the server's first Ray actor and its restart
        assert ray.util.placement_group_table() == {}
        alive = [n for n in ray.nodes() if n["Alive"]]
        assert len(alive) in (2, 3)  # head and node A (node B until Ray marks it dead)
    finally:
        ray.shutdown()

