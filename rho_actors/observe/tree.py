"""The live supervision tree of a system as plain data (``ActorSystem.tree()``, DESIGN
§6a): each supervisor asked for its children, each node described by what it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pykka

from rho_actors.loop.actor import LoopActor
from rho_actors.loop.handle import Loop
from rho_actors.otp.supervisor import ChildInfo
from rho_actors.runtime import Runtime

__all__ = ["describe_tree"]


def describe_tree(root: pykka.ActorRef[Any], runtime: Runtime, sessions_dir: Path, *, root_id: str,
                  calls_id: str, workers_id: str, ask_timeout_s: float) -> dict[str, Any]:
    """The tree under ``root`` (see :meth:`rho_actors.ActorSystem.tree` for the shape of a
    node): ``calls_id``'s supervisor is a count of running calls, ``workers_id`` under the
    root shows each isolation's view. Each ask waits at most ``ask_timeout_s`` seconds; a
    node that died or did not answer meanwhile is ``alive: False``. Never raises for a
    node's failure."""

    def describe(ref: pykka.ActorRef[Any] | None, node: dict[str, Any], parent: str = "") -> dict[str, Any]:
        if ref is None or not node["alive"]:
            return node
        try:
            if node["kind"] == "supervisor":
                proxy = ref.proxy()
                node["strategy"] = proxy.strategy.get(timeout=ask_timeout_s)
                children: list[ChildInfo] = proxy.which_children().get(timeout=ask_timeout_s)
                if node["id"] == calls_id:  # CallActors, and the call threads of ``thread`` calls
                    threads = sum(isolation.running_calls() for isolation in runtime.isolations.values())
                    node["running"] = sum(c.alive for c in children) + threads
                    entries = runtime.tools.current.entries.items()  # the bounds on calls, and their use now
                    node["governor"] = runtime.governor.describe({name: e.info for name, e in entries})
                    return node
                node["children"] = [describe_child(c, node["id"]) for c in children]
            elif node["id"] == workers_id and parent == root_id:
                isolations = runtime.isolations.items()
                node["isolations"] = {name: view for name, isolation in isolations if (view := isolation.describe())}
            elif callable(getattr(ref.actor_class, "server_info", None)):  # a stateful server: where it runs
                node["server"] = ref.proxy().server_info().get(timeout=ask_timeout_s)
            elif issubclass(ref.actor_class, LoopActor):
                loop = Loop(parent, sessions_dir / parent, runtime)
                node["running"] = loop.running()
                node["pending"] = [{"call_id": p.call_id, "tool": p.name, "kind": p.kind} for p in loop.pending()]
        except (pykka.ActorDeadError, pykka.Timeout):
            node["alive"] = False
        return node

    def describe_child(c: ChildInfo, parent: str) -> dict[str, Any]:
        node = {"id": c.id, "kind": c.type, "restart": c.restart, "restarts": c.restarts, "alive": c.alive}
        if c.children is None:
            return describe(c.ref, node, parent)
        # a lazy subtree (rho_actors.otp.lazy): its supervisor is not started, its child is
        node["strategy"] = "one_for_one"
        node["children"] = [describe_child(inner, c.id) for inner in c.children]
        return node

    return describe(root, {"id": root_id, "kind": "supervisor", "restart": "permanent", "restarts": 0,
                           "alive": root.is_alive()})
