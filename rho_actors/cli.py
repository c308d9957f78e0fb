"""The ``rho-actors`` command line.

Commands (argparse subcommands; each command group registers itself in
:func:`build_parser` through an ``_add_<group>`` function, so new groups such as
``selftest``, ``tree`` or ``chat`` are added as siblings)::

    rho-actors replay bfcl [--category base|miss_func|miss_param|long_context]
                           [--limit N] [--json] [--tree]
    rho-actors selftest MODULE_OR_PATH... [--timeout S] [--json]

Exit codes: 0 success, 1 the command ran and found a failure (for ``replay bfcl``:
a result or a state differed other than through a listed rejection; for ``selftest``: a
selftest failed, timed out or crashed), 2 usage error, a missing optional dependency or
a target that cannot be loaded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["build_parser", "main", "render_tree"]

Handler = Callable[[argparse.Namespace], int]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


# --------------------------------------------------------------------------- replay


def _add_replay(commands: Any) -> None:
    replay = commands.add_parser("replay", help="replay recorded conversations through the runtime")
    targets = replay.add_subparsers(dest="target", metavar="TARGET", required=True)

    # light: bfcl_eval itself is imported only when a replay runs
    from rho_actors.bfcl import CATEGORIES

    bfcl = targets.add_parser(
        "bfcl",
        help="replay BFCL's multi-turn ground truth against its real backends",
        description=(
            "Replay the Berkeley Function Calling Leaderboard's multi-turn conversations through "
            "an ActorSystem and compare every result and final state with direct execution. "
            "Needs: pip install --no-deps bfcl-eval==2026.3.23 mpmath"
        ),
    )
    bfcl.add_argument("--category", choices=CATEGORIES, default="base", help="multi-turn category (default: base)")
    bfcl.add_argument("--limit", type=_positive_int, default=None, metavar="N", help="replay only the first N entries")
    bfcl.add_argument("--json", action="store_true", help="print the summary as one JSON object (no progress bar)")
    bfcl.add_argument(
        "--tree", action="store_true", help="also print the live supervision tree, taken after the last session"
    )
    bfcl.set_defaults(handler=_run_replay_bfcl)


def _run_replay_bfcl(args: argparse.Namespace) -> int:
    from rho_actors.bfcl import BfclUnavailableError, replay

    try:
        report = replay(category=args.category, limit=args.limit, progress=not args.json, tree=args.tree)
    except BfclUnavailableError as exc:
        print(f"rho-actors: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json())
    else:
        console = _console()
        console.print(report.render())
        if report.tree is not None:
            console.print(render_tree(report.tree))
    return report.exit_code


def _console() -> Any:
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)  # a log or pipe: no 80-column wrapping


def render_tree(node: dict[str, Any]) -> Any:
    """A :meth:`rho_actors.ActorSystem.tree` node as a ``rich.tree.Tree``."""
    from rich.tree import Tree

    def label(n: dict[str, Any]) -> str:
        state = "[green]alive[/]" if n["alive"] else "[red]down[/]"
        text = f"[bold]{n['id']}[/] {n['kind']}, {n['restart']}, restarts {n['restarts']}, {state}"
        if "strategy" in n:
            text += f", {n['strategy']}"
        if "spares" in n:
            text += f", {n['running']} calls running, {n['spares']} spares"
        return text

    def grow(tree: Any, n: dict[str, Any]) -> Any:
        for child in n.get("children", []):
            grow(tree.add(label(child)), child)
        if n["kind"] == "worker" and isinstance(n.get("running"), list):
            for call in n["running"]:
                tree.add(f"call {call['call_id']}: {call['tool']}, {call['ms_left']:.0f} ms left")
        return tree

    return grow(Tree(label(node)), node)


# --------------------------------------------------------------------------- selftest


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text}")
    return value


def _add_selftest(commands: Any) -> None:
    selftest = commands.add_parser(
        "selftest",
        help="run the selftest() of tools, each in a throwaway process",
        description=(
            "Run each tool's selftest() in its own child process, with its working directory, HOME and "
            "TMPDIR in a fresh temporary folder, under a time bound. A target is a module name, a .py file "
            "or a folder of .py files; a module that is itself a tool is one tool, otherwise each tool "
            "defined in it is. Exit codes: 0 all passed (or have no selftest), 1 a selftest failed, timed "
            "out or crashed, 2 a usage error or a target that cannot be loaded."
        ),
    )
    selftest.add_argument("targets", nargs="+", metavar="MODULE_OR_PATH", help="module name, .py file or folder")
    selftest.add_argument("--timeout", type=_positive_seconds, default=10.0, metavar="S",
                          help="seconds each selftest gets (default: 10)")
    selftest.add_argument("--json", action="store_true", help="print the results as one JSON object")
    selftest.set_defaults(handler=_run_selftest)


def _run_selftest(args: argparse.Namespace) -> int:
    import json

    from rho_actors.selftest import FAILING, LoadError, load_target, render_rows, run_selftests, tools_in_module

    tools: list[Any] = []
    for target in args.targets:
        try:
            modules = load_target(target)
        except LoadError as exc:
            print(f"rho-actors selftest: cannot load {exc}", file=sys.stderr)
            return 2
        found = [t for module in modules for t in tools_in_module(module)]
        if not found:
            print(f"rho-actors selftest: {target}: no tools found in it", file=sys.stderr)
            return 2
        tools.extend(t for t in found if all(t is not seen for seen in tools))
    rows = run_selftests(tools, timeout_s=args.timeout)
    code = 1 if any(row.outcome in FAILING for row in rows) else 0
    counts = {outcome: sum(row.outcome == outcome for row in rows)
              for outcome in ("passed", "failed", "timeout", "crashed", "no selftest")}
    if args.json:
        print(json.dumps({"results": [row.to_dict() for row in rows], "counts": counts, "exit_code": code},
                         indent=2))
    else:
        console = _console()
        console.print(render_rows(rows))
        console.print(", ".join(f"{n} {outcome}" for outcome, n in counts.items() if n) or "no tools")
    return code


# --------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    """The ``rho-actors`` argument parser: one subparser per command group."""
    parser = argparse.ArgumentParser(
        prog="rho-actors",
        description="An OTP-style actor runtime for an LLM agent's tool calls.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (_add_replay, _add_selftest):
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit
    code (0 ok, 1 failure found, 2 usage error or missing dependency)."""
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return exc.code if isinstance(exc.code, int) else 2
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
