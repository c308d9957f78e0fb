"""Node loss on a real multi-node Ray cluster: Ray's own test harness
(``ray.cluster_utils.Cluster``: a head and worker nodes as separate raylets, on loopback
only), with custom resources that pin calls to a node; and Ray's out-of-memory kill on a
head node whose processes share a cgroup with a small memory limit
(``tests/ray_memory_node.py``). Starting the nodes takes tens of seconds, so these run
outside the default run: ``pytest -m ray_cluster tests/test_ray_cluster.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ChildSpec, ErrorKind, ToolCall, tool
from rho_actors.isolation.servers import call_server
from rho_actors.results import TEXTS
from rho_actors.sandbox.confine.cgroups import Cgroup, find_hierarchy

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'rho_actors[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

from rho_actors.integrations.ray.servers import RayActor, RayCall  # noqa: E402
from rho_actors.isolation.ray_connection import loopback_only  # noqa: E402
from tests.conftest import WAIT_S, read_line, slack, wait_for  # noqa: E402

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
        on_b = wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", 2 * WAIT_S)
        assert on_b, "c1 never began on node B"
        turns[1].start()  # node_b=1 is held by c1: c2 waits in Ray's queue
        assert wait_for(lambda: {t["call_id"]: t["node_id"] for t in _tasks(system)} == {
            "c1": node_b.node_id, "c2": ""}), _tasks(system)
        killed = time.monotonic()
        cluster.remove_node(node_b, allow_graceful=False)  # SIGKILL: raylet, object store, workers
        for turn in turns:
            turn.join(WAIT_S)
        took = time.monotonic() - killed
        assert len(box) == 2, f"the turns did not end within {WAIT_S} s of the node's loss"
        [crashed], [queued] = sorted(box, key=lambda turn: turn[0].call_id)
        assert crashed.error_kind is ErrorKind.CRASHED, crashed
        assert f"the Ray node it ran on, node {node_b.node_id[:8]} (127.0.0.1), was lost" in crashed.content, crashed
        assert queued.error_kind is ErrorKind.UNAVAILABLE and "node_b=1" in queued.content, queued
        assert took < slack(10.0), f"the calls on the lost node came back {took:.1f} s after the kill"
        # a new call pinned to the lost node: unavailable at once (Ray still lists it alive for ~15 s)
        began = time.monotonic()
        [pinned] = loop.run_turn([ToolCall("c3", "pinned", "{}")])
        assert pinned.error_kind is ErrorKind.UNAVAILABLE, pinned
        assert f"lost: node {node_b.node_id[:8]}" in pinned.content, pinned
        assert time.monotonic() - began < slack(2.0)
        # later calls run on the remaining nodes
        later = loop.run_turn([ToolCall(f"c{i}", "where", "{}") for i in range(4, 8)])
        assert all(r.ok for r in later), later
        assert {r.content for r in later} == {node_a.node_id}, later
        # the server was restarted on node A, within its intensity; the tree shows where
        assert wait_for(lambda: [a["node_id"] for a in _actors(system)] == [node_a.node_id]), _actors(system)
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
        assert wait_for(lambda: all(a["State"] == "DEAD" for a in ray._private.state.actors().values()))
        assert len(ray._private.state.actors()) == 2  # the server's first Ray actor and its restart
        assert ray.util.placement_group_table() == {}
        alive = [n for n in ray.nodes() if n["Alive"]]
        assert len(alive) in (2, 3)  # head and node A (node B until Ray marks it dead)
    finally:
        ray.shutdown()



# --- Ray's out-of-memory kill --------------------------------------------------------------

MEMORY_LIMIT = 2 * 2**30  # the node's cgroup; Ray's monitor kills at half of it (about 0.3 GiB is Ray's own)
NODE_SCRIPT = Path(__file__).with_name("ray_memory_node.py")


@pytest.fixture
def memory_node() -> Iterator[dict[str, Any]]:
    """A head node in a cgroup of 2 GiB (``tests/ray_memory_node.py``) whose memory
    monitor kills past half of it, checking every 100 ms; the node's processes and its
    cgroup are gone afterwards."""
    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process by something else")
    if isinstance(find_hierarchy(), str):
        pytest.skip(f"no cgroup to bound a Ray node's memory: {find_hierarchy()}")
    loopback_only()  # this driver reaches the node on loopback, as the node was started
    cgroup = Cgroup("ray-memory-node", memory_max=MEMORY_LIMIT, pids_max=None)
    env = {**os.environ, "RAY_memory_usage_threshold": "0.5", "RAY_memory_monitor_refresh_ms": "100",
           "RAY_ADDRESS": "local"}
    node = subprocess.Popen([sys.executable, str(NODE_SCRIPT), cgroup.dirs["memory"], *cgroup.procs_files],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert node.stdout is not None
        line = read_line(node.stdout, 2 * WAIT_S)
        assert line, f"the memory-limited Ray node did not start (exit code {node.poll()})"
        yield {**json.loads(line), "cgroup": cgroup}
    finally:
        assert node.stdin is not None
        node.stdin.close()
        try:
            node.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(WAIT_S)
        gone = wait_for(lambda: cgroup.pids() == [])
        left = {pid: _cmdline(pid) for pid in cgroup.pids()}
        cgroup.kill()
        cgroup.remove()
        assert gone, f"Ray processes outlived the node's shutdown by 15 s: {left}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


def _hold(mib: int, began: str = "") -> str:
    """Take ``mib`` MiB in 16 MiB steps, each written to, 20 ms apart (Ray's monitor looks
    every 100 ms); ``began``, a file, gets the pid first."""
    if began:
        Path(began).write_text(str(os.getpid()))
    held = []
    for _ in range(mib // 16):
        held.append(bytearray(16 * 2**20))
        time.sleep(0.02)
    return f"held {len(held) * 16} MiB"


def _timed_turn(loop: Any, call: ToolCall, began: Path) -> tuple[list[Any], float]:
    """``loop.run_turn([call])`` and the seconds from the call's start in its Ray worker
    (``began`` written) to its result (a fresh Ray worker may take long to start here)."""
    box: list[Any] = []
    turn = threading.Thread(target=lambda: box.append(loop.run_turn([call])))
    turn.start()
    assert wait_for(began.exists, 100), f"{call.id} never began in its Ray worker"
    start = time.monotonic()
    turn.join(110)
    assert box, f"{call.id} got no result within 110 s of its start"
    return box[0], time.monotonic() - start


class Hog:
    """A tool taking ``args["mib"]`` MiB of memory in its Ray worker."""

    @staticmethod
    def name() -> str:
        return "hog"

    @staticmethod
    def description() -> str:
        return "Take memory."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"mib": {"type": "integer"}}}

    @staticmethod
    def timeout_ms() -> int:
        return 120_000

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        return _hold(args["mib"], args.get("began", ""))


class Store(Counter):
    """A stateful Ray server that can be made to take memory."""

    def hog(self, mib: int, began: str) -> str:
        return _hold(mib, began)


def test_ray_out_of_memory_kill(memory_node: dict[str, Any], tmp_path: Path) -> None:
    """On a node bounded to 2 GiB, a call taking 1.5 GiB is killed by Ray's memory
    monitor: its result is ``memory`` naming Ray's kill, well before its 60 s deadline,
    and the next call runs. A supervised Ray server killed the same way answers the tool
    that called it with ``memory`` (its state lost) and is restarted, within its
    intensity, with fresh state."""
    @tool(timeout_ms=120_000)
    def store(method: str, ctx: Any, mib: int = 0, began: str = "") -> Any:
        """Call the store."""
        return call_server(ctx, "store", method, *([mib, began] if method == "hog" else []), timeout_ms=110_000)

    system = ActorSystem(data_dir=tmp_path / "data", ray={"address": memory_node["address"]})
    try:
        system.register(Hog, isolation="ray", resources={"num_cpus": 1})
        system.register(store)
        loop = system.start_loop("s1")
        hog = {"mib": 1536, "began": str(tmp_path / "c1")}
        [killed], took = _timed_turn(loop, ToolCall("c1", "hog", json.dumps(hog)), tmp_path / "c1")
        assert killed.error_kind is ErrorKind.MEMORY, killed
        assert re.match(r"tool 'hog' ran out of memory: Ray's memory monitor killed its worker \(OutOfMemoryError: "
                        r"\d+ worker\(s\) were killed due to the node running low on memory", killed.content), killed
        assert "2.00GB limit" in killed.content, killed  # the node's limit is its cgroup's
        assert took < slack(30.0), f"the memory kill came back {took:.1f} s after the call began (its deadline: 120 s)"
        [after] = loop.run_turn([ToolCall("c2", "hog", '{"mib": 64}')])
        assert after.ok and after.content == "held 64 MiB", after  # the node is usable
        # a supervised server on Ray, killed by the memory monitor, restarted fresh
        spec = ChildSpec("store", RayActor(Store, resources={"num_cpus": 0}, ping_ms=200), name="store")
        system.start_child(spec, max_restarts=2, max_seconds=60)
        first = system.whereis("store")
        results = loop.run_turn([ToolCall("c3", "store", '{"method": "incr"}')])
        results += loop.run_turn([ToolCall("c4", "store", '{"method": "incr"}')])
        assert [r.content for r in results] == ["1", "2"], results
        hog = {"method": "hog", "mib": 1536, "began": str(tmp_path / "c5")}
        [lost], took = _timed_turn(loop, ToolCall("c5", "store", json.dumps(hog)), tmp_path / "c5")
        assert lost.error_kind is ErrorKind.MEMORY and TEXTS["server_ray_memory"][0] is ErrorKind.MEMORY, lost
        assert lost.content.startswith("server 'store' ran out of memory during hog(): Ray's memory monitor "
                                       "killed its Ray actor (Ray actor "), lost
        assert "running low on memory" in lost.content and "everything it held is lost" in lost.content, lost
        assert took < slack(30.0), f"the server's memory kill came back {took:.1f} s after the call began"
        assert wait_for(lambda: system.whereis("store") not in (None, first))
        [fresh] = loop.run_turn([ToolCall("c6", "store", '{"method": "incr"}')])
        assert fresh.ok and fresh.content == "1", fresh  # a fresh Ray actor: the state was lost
        servers = next(c for c in system.tree()["children"] if c["id"] == "servers")
        [subtree] = servers["children"]
        assert subtree["children"][0]["restarts"] == 1, subtree
    finally:
        system.stop()
    assert not ray.is_initialized()


def test_a_local_ray_never_joins_another_cluster_of_this_machine(memory_node: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With another Ray cluster running on this machine and advertised (the test harness
    writes its address where a plain ``ray.init()`` looks, as ``ray start`` does), a
    runtime without an address starts a Ray of its own instead of joining it; and stops
    it at shutdown."""
    from rho_actors.isolation.ray_tasks import RayRuntime

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    advertised = ray._private.utils.read_ray_address()
    assert advertised is not None, "no cluster of this machine is advertised"
    runtime = RayRuntime({"num_cpus": 1})
    try:
        runtime.connect()
        assert runtime.owns_ray
        context = ray.get_runtime_context()
        assert context.gcs_address != advertised
        assert context.get_node_id() != memory_node["node_id"]
    finally:
        runtime.shutdown()
    assert not ray.is_initialized()
