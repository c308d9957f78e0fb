"""``rho-actors tree``: print a system's supervision tree (rich, or JSON).

Usage::

    rho-actors tree [--tools MODULE_OR_PATH...] [--untrusted] [--unconfined]
                    [--connect ADDRESS] [--token TOKEN] [--json]

With ``--connect ADDRESS`` (or ``$RHO_ACTORS_OBSERVER`` and no ``--tools``) it is the
tree of the running system whose observer is there (:meth:`rho_actors.ActorSystem.observe`;
a TCP address needs ``$RHO_ACTORS_TOKEN``, or ``--token``, which ``ps`` shows to every
user of the machine); otherwise the tree of a fresh
system with the tools of ``--tools`` registered (untrusted files are never imported
here: :func:`rho_actors.selftest.load_tools`), and the names of the tools it offers.
Exit codes: 0, or 2 when a target cannot be loaded, a tool is refused, or the observer
cannot be reached or refuses the token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rho_actors.observe.top import observed_tree, reach_error, tree_view

__all__ = ["add_parser", "fresh_tree", "render_tree", "run"]


def add_parser(commands: Any) -> None:
    """Add ``tree`` to the ``rho-actors`` subcommands."""
    tree = commands.add_parser(
        "tree", help="print the supervision tree of a fresh system with your tools, or of a running one",
        description=__doc__.split("\n\n")[3].replace("\n", " ") if __doc__ else None,
    )
    tree.add_argument("--tools", nargs="+", action="extend", default=[], metavar="MODULE_OR_PATH",
                      help="module name, .py file or folder whose tools the fresh system registers")
    tree.add_argument("--untrusted", action="store_true",
                      help="register the tools untrusted: declarations read in other processes")
    tree.add_argument("--unconfined", action="store_true",
                      help="read untrusted files and declarations without OS confinement")
    tree.add_argument("--connect", metavar="ADDRESS", default=None,
                      help="a running system's observer: its Unix socket path or 127.0.0.1:PORT")
    tree.add_argument("--token", default=os.environ.get("RHO_ACTORS_TOKEN"),
                      help="the observer's token, for a TCP address (default: $RHO_ACTORS_TOKEN; prefer it: "
                            "a command line shows in ps to every user of the machine)")
    tree.add_argument("--json", action="store_true", help="print the tree as one JSON object")
    tree.set_defaults(handler=run)


def fresh_tree(targets: list[str], *, untrusted: bool = False, unconfined: bool = False) -> tuple[dict[str, Any],
                                                                                                   list[str]]:
    """The tree of a new :class:`rho_actors.ActorSystem` (stopped after) with the tools
    of ``targets`` registered, and the names of the tools it offers. Raises
    :class:`rho_actors.selftest.LoadError`, and what ``register_many`` raises."""
    from rho_actors import ActorSystem
    from rho_actors.sandbox import UNCONFINED, default_policy
    from rho_actors.selftest import load_tools

    policy = UNCONFINED if unconfined else default_policy()
    tools = [tool for target in targets for tool in load_tools(target, trusted=not untrusted, confine=policy)]
    with ActorSystem(confinement=False if unconfined else None) as system:
        system.register_many(tools, untrusted=untrusted)
        return system.tree(), [info.name for info in system.tools()]


def run(args: argparse.Namespace) -> int:
    """Run ``rho-actors tree``; returns the exit code."""
    from rho_actors import DuplicateToolError
    from rho_actors.selftest import LoadError

    address = args.connect or (None if args.tools else os.environ.get("RHO_ACTORS_OBSERVER"))
    offered: list[str] | None = None
    try:
        if address:
            node = observed_tree(address, args.token)
        else:
            node, offered = fresh_tree(args.tools, untrusted=args.untrusted, unconfined=args.unconfined)
    except (ValueError, LoadError, DuplicateToolError, TypeError) as exc:
        print(f"rho-actors tree: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a plain ConnectionError is the observer's answer (a refused token)
        shown = f"the observer refused: {exc}" if type(exc) is ConnectionError else reach_error(address or "?", exc)
        print(f"rho-actors tree: {shown}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"tree": node, **({"tools": offered} if offered is not None else {})}, indent=2))
        return 0
    from rich.console import Console

    console = Console()
    console.print(tree_view(node))
    if offered is not None:
        console.print(f"tools offered: {', '.join(offered) or 'none'}", markup=False, highlight=False)
    return 0


def render_tree(node: dict[str, Any]) -> Any:
    """A :meth:`rho_actors.ActorSystem.tree` node as a ``rich.tree.Tree``."""
    from rich.tree import Tree

    def label(n: dict[str, Any]) -> str:
        state = "[green]alive[/]" if n["alive"] else "[red]down[/]"
        text = f"[bold]{n['id']}[/] {n['kind']}, {n['restart']}, restarts {n['restarts']}, {state}"
        if "strategy" in n:
            text += f", {n['strategy']}"
        if isinstance(n.get("running"), int):
            text += f", {n['running']} calls running"
        return text

    def grow(tree: Any, n: dict[str, Any]) -> Any:
        for child in n.get("children", []):
            grow(tree.add(label(child)), child)
        if n["kind"] == "worker" and isinstance(n.get("running"), list):
            for call in n["running"]:
                tree.add(f"call {call['call_id']}: {call['tool']}, {call['ms_left']:.0f} ms left")
        return tree

    return grow(Tree(label(node)), node)
