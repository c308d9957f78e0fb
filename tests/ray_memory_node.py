"""A Ray head node with a small memory limit, for tests of Ray's out-of-memory kill
(``tests/test_ray_cluster.py``). Run as ``python tests/ray_memory_node.py CONTROLLER_DIR
PROCS_FILE...``: this process joins the cgroup (its pid written to each ``PROCS_FILE``),
so the node's GCS, raylet, agents and workers all share the cgroup's bound; in a mount
namespace of its own it binds the cgroup's memory directory (``CONTROLLER_DIR``) over
the place where Ray's memory monitor reads the node's limit and usage
(``/sys/fs/cgroup/memory`` for cgroup v1, ``/sys/fs/cgroup`` for v2: the monitor reads
``memory.limit_in_bytes``/``memory.usage_in_bytes`` or ``memory.max``/``memory.current``
there), then starts the head node with ``ray.cluster_utils.Cluster``, bound to loopback.

It prints one JSON line, ``{"address": ..., "node_id": ...}``, and keeps the node until
its stdin closes; then it shuts the node down and exits. The memory monitor's settings
come from the environment (``RAY_memory_usage_threshold``,
``RAY_memory_monitor_refresh_ms``), read by the raylet it starts.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

_CLONE_NEWNS = 0x00020000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}{args}: {os.strerror(errno)}")


def _bind_memory_view(controller_dir: str) -> None:
    """In a new mount namespace, show ``controller_dir`` where Ray reads the node's memory."""
    v1 = os.path.exists(os.path.join(controller_dir, "memory.limit_in_bytes"))
    target = "/sys/fs/cgroup/memory" if v1 else "/sys/fs/cgroup"
    _libc_call("unshare", _CLONE_NEWNS)
    _libc_call("mount", b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)
    _libc_call("mount", controller_dir.encode(), target.encode(), None, _MS_BIND, None)


def main(argv: list[str]) -> int:
    controller_dir, procs_files = argv[0], argv[1:]
    for path in procs_files:
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
    _bind_memory_view(controller_dir)

    from ray.cluster_utils import Cluster

    from rho_actors.isolation.ray_connection import loopback_only

    loopback_only()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "node_ip_address": "127.0.0.1",
        "object_store_memory": 80 * 2**20})
    try:
        head = cluster.head_node
        assert head is not None
        print(json.dumps({"address": cluster.address, "node_id": head.node_id}), flush=True)
        sys.stdin.read()  # until the test closes it
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
