"""``rho-actors top``: a live terminal view of a system's observer (rich).

Usage::

    rho-actors top [--connect ADDRESS] [--token TOKEN] [--once] [--json]

``ADDRESS`` is the Unix socket path or ``127.0.0.1:PORT`` given to
:meth:`rho_actors.ActorSystem.observe` (default: ``$RHO_ACTORS_OBSERVER``); a TCP
address needs the observer's token (``$RHO_ACTORS_TOKEN``, or ``--token``, which ``ps``
shows to every user of the machine). ``--once``
prints one snapshot and exits (``--json``: as JSON, for scripts); otherwise it runs until
Ctrl-C, or until the observer closes the connection, which it says on stderr (the system
stopped). Exit codes: 0, or 2
when the observer cannot be reached (nothing listening is said as "connection
refused") or refuses the token.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from rho_actors.observe.observer import json_line
from rho_actors.observe.terminal import safe_text, terminal_text

__all__ = ["TopView", "add_parser", "connect", "messages", "observed_tree", "reach_error", "tree_view"]

CONNECT_TIMEOUT_S = 5.0


def connect(address: str, token: str | None = None, timeout_s: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A socket connected to an observer at ``address`` (a Unix socket path, or
    ``HOST:PORT``), the token sent when it is a TCP address. Raises ``OSError`` when it
    cannot be reached (``ConnectionRefusedError`` when nothing listens there: checked
    first) and ``ValueError`` for a TCP address that answers but was given no token."""
    host, _, port = address.rpartition(":")
    if host and port.isdigit():
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        if not token:
            sock.close()
            raise ValueError(f"the observer at {address} needs its token ($RHO_ACTORS_TOKEN, or --token)")
        sock.sendall(json.dumps({"token": token}).encode() + b"\n")
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
    sock.settimeout(None)
    return sock


def reach_error(address: str, exc: BaseException) -> str:
    """What ``top`` and ``tree`` print when :func:`connect` to ``address`` failed."""
    if isinstance(exc, ConnectionRefusedError):
        return f"cannot reach the observer at {address}: connection refused (nothing listens there)"
    if isinstance(exc, FileNotFoundError):
        return f"cannot reach the observer at {address}: no such socket"
    return f"cannot reach the observer at {address}: {exc}"


def observed_tree(address: str, token: str | None = None) -> dict[str, Any]:
    """The supervision tree of the system whose observer is at ``address`` (from its
    first snapshot). Raises as :func:`connect`, ``ConnectionError`` when the observer
    refuses the token or closes before a snapshot."""
    sock = connect(address, token)
    try:
        for message in messages(sock):
            if message.get("type") == "snapshot" and isinstance(message.get("tree"), dict):
                tree: dict[str, Any] = message["tree"]
                return tree
        raise ConnectionError("the observer closed the connection before its first snapshot")
    finally:
        sock.close()


def messages(sock: socket.socket) -> Iterator[dict[str, Any]]:
    """The observer's messages, one JSON object per line, until it closes. Raises
    ``ConnectionError`` for an ``error`` message (a refused token)."""
    with sock.makefile("rb") as lines:
        for line in lines:
            message = json.loads(line)
            if message.get("type") == "error":
                raise ConnectionError(str(message.get("error")))
            yield message


class TopView:
    """The state ``top`` shows: the last snapshot, kept current by call events between
    snapshots (a ``started`` call appears at once; a finished one moves to the recent
    events)."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {}
        self.calls: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []

    def update(self, message: dict[str, Any]) -> None:
        """Apply one observer message."""
        kind = message.get("type")
        if kind == "snapshot":
            self.snapshot = message
            calls = [c for c in message.get("calls", []) if isinstance(c, dict)]
            self.calls = {(c.get("session_id", ""), c.get("call_id", "")): c for c in calls}
            self.events = list(message.get("events", []))[-20:]
            self.reports = list(message.get("reports", []))[-10:]
        elif kind == "event":
            key = (message.get("session_id", ""), message.get("call_id", ""))
            if message.get("kind") == "started":
                self.calls[key] = {"session_id": key[0], "call_id": key[1], "tool": message.get("tool"),
                                   "ms_left": None}
            else:
                self.calls.pop(key, None)
            self.events = [*self.events, message][-20:]
        elif kind == "report":
            self.reports = [*self.reports, message][-10:]

    def render(self) -> RenderableType:
        """The view as a rich renderable: the tree, running calls, workers, recent events.
        Every text the observer sent (call ids, tool names, reasons...) is shown as
        written, never read as markup, control characters replaced
        (:func:`~rho_actors.observe.terminal.terminal_text`)."""
        snap = self.snapshot
        parts: list[RenderableType] = []
        tree = Tree(Text("supervision tree", style="bold"))
        if isinstance(snap.get("tree"), dict):
            _tree(tree, snap["tree"])
        parts.append(tree)
        calls = Table("session", "call", "tool", "ms left", title=f"running calls ({len(self.calls)})",
                      title_justify="left")
        for call in self.calls.values():
            left = call.get("ms_left")
            calls.add_row(terminal_text(call.get("session_id")), terminal_text(call.get("call_id")),
                          terminal_text(call.get("tool")), _number(left, "{:.0f}", "…"))
        parts.append(calls)
        workers = Table("pid", "rss MiB", title=f"worker processes ({len(snap.get('workers', []))})",
                        title_justify="left")
        for worker in snap.get("workers", []):
            rss = worker.get("rss_bytes")
            workers.add_row(terminal_text(worker.get("pid")),
                            _number(rss / 2**20 if isinstance(rss, (int, float)) else None, "{:.1f}", "?"))
        parts.append(workers)
        events = Table("event", "session", "call", "tool", "outcome", "ms", title="recent call events",
                       title_justify="left")
        for event in self.events[-10:]:
            events.add_row(terminal_text(event.get("kind")), terminal_text(event.get("session_id")),
                           terminal_text(event.get("call_id")), terminal_text(event.get("tool")),
                           terminal_text(event.get("outcome") or ""),
                           _number(event.get("duration_ms", 0.0), "{:.1f}", "?"))
        parts.append(events)
        if self.reports:
            reports = Table("report", "fields", title="recent reports", title_justify="left")
            for report in self.reports:
                fields = {k: v for k, v in report.items() if k not in ("type", "event")}
                reports.add_row(terminal_text(report.get("event")),
                                terminal_text(json.dumps(fields, default=repr, ensure_ascii=False)[:120]))
            parts.append(reports)
        stats = snap.get("stats", {})
        stats = stats if isinstance(stats, dict) else {}
        parts.append(terminal_text(f"abandoned threads running: {stats.get('abandoned_threads_running', 0)}   "
                                   f"dropped updates: {snap.get('dropped', 0)}"))
        governor = stats.get("governor")
        if isinstance(governor, dict):
            parts.append(terminal_text(governor_line(governor)))
        return Group(*parts)


def governor_line(governor: dict[str, Any]) -> str:
    """One line of the governor's counts (``stats()["governor"]``): thread calls
    against their bound, running and queued calls per bounded tool, refusals per reason
    and retries (DESIGN §4 "The governor")."""
    def counts(value: Any) -> str:
        return ", ".join(f"{k} {v}" for k, v in value.items() if v) if isinstance(value, dict) else ""

    return (f"governor: thread calls {governor.get('thread_calls_running', 0)}/{governor.get('max_thread_calls')}   "
            f"running: {counts(governor.get('running')) or '-'}   queued: {counts(governor.get('queued')) or '-'}   "
            f"refused: {counts(governor.get('refused')) or '-'}   retried: {governor.get('retried', 0)}")


def _number(value: Any, spec: str, missing: str) -> Text:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Text(spec.format(value))
    return Text(missing if value is None else safe_text(value))


def tree_view(node: dict[str, Any], title: str = "supervision tree") -> Tree:
    """A :meth:`rho_actors.ActorSystem.tree` node (or an observer snapshot's ``tree``)
    as a ``rich.tree.Tree``, every text shown as written (never read as markup)."""
    tree = Tree(Text(title, style="bold"))
    _tree(tree, node)
    return tree


def _tree(branch: Tree, node: dict[str, Any], depth: int = 0) -> None:
    label = Text.assemble(terminal_text(node.get("id")), " ",
                          terminal_text(f"{safe_text(node.get('kind', ''))} {safe_text(node.get('restart', ''))}",
                                        style="dim"))
    if node.get("restarts"):
        label.append_text(terminal_text(f" restarts={safe_text(node['restarts'])}", style="yellow"))
    if not node.get("alive", True):
        label.append_text(Text(" down", style="red"))
    running = node.get("running")
    if isinstance(running, int) and not isinstance(running, bool):
        label.append(f" running={running}")
    elif isinstance(running, (list, dict)) and running:
        label.append(f" running={len(running)}")
    pending = node.get("pending")
    if isinstance(pending, list) and pending:
        label.append_text(Text(f" pending={len(pending)}", style="yellow"))
    child = branch.add(label)
    children = node.get("children", [])
    if depth < 64 and isinstance(children, list):
        for sub in children:
            if isinstance(sub, dict):
                _tree(child, sub, depth + 1)


# --------------------------------------------------------------------------- command line


def add_parser(commands: Any) -> None:
    """Add ``top`` to the ``rho-actors`` subcommands."""
    top = commands.add_parser(
        "top", help="watch a running system's tree and calls live",
        description="Watch a running system's supervision tree and its calls live, through the observer "
                    "it serves (ActorSystem.observe); until Ctrl-C, or until the observer closes the "
                    "connection, which it says (the system stopped).")
    top.add_argument("--connect", metavar="ADDRESS", default=os.environ.get("RHO_ACTORS_OBSERVER"),
                     help="the observer's Unix socket path or 127.0.0.1:PORT (default: $RHO_ACTORS_OBSERVER)")
    top.add_argument("--token", default=os.environ.get("RHO_ACTORS_TOKEN"),
                     help="the observer's token, for a TCP address (default: $RHO_ACTORS_TOKEN; prefer it: "
                           "a command line shows in ps to every user of the machine)")
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument("--json", action="store_true", help="with --once: print the snapshot as JSON")
    top.set_defaults(handler=run)


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run ``rho-actors top``; returns the exit code."""
    if not args.connect:
        print("rho-actors top: no observer address: give --connect ADDRESS or set $RHO_ACTORS_OBSERVER",
              file=sys.stderr)
        return 2
    try:
        sock = connect(args.connect, args.token)
    except ValueError as exc:
        print(f"rho-actors top: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rho-actors top: {reach_error(args.connect, exc)}", file=sys.stderr)
        return 2
    console = console or Console()
    view = TopView()
    try:
        stream = messages(sock)
        if args.once:
            first = next(stream, None)
            if first is None:
                print("rho-actors top: the observer closed the connection", file=sys.stderr)
                return 2
            if args.json:
                sys.stdout.write(json_line(first).decode("utf-8"))
            else:
                view.update(first)
                console.print(view.render())
            return 0
        with Live(view.render(), console=console, auto_refresh=False) as live:
            last = 0.0
            for message in stream:
                view.update(message)
                now = time.monotonic()
                if message.get("type") == "snapshot" or now - last > 0.1:
                    live.update(view.render(), refresh=True)
                    last = now
        print(f"rho-actors top: the observer at {args.connect} closed the connection: the system stopped, "
              "or stopped being observed", file=sys.stderr)
        return 0
    except ConnectionError as exc:
        print(f"rho-actors top: the observer refused: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        sock.close()
