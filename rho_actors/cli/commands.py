"""The ``rho-actors`` command line.

Commands (argparse subcommands; each command group registers itself in
:func:`build_parser` through an ``_add_<group>`` function, so new groups such as
``selftest``, ``tree`` or ``chat`` are added as siblings)::

    rho-actors replay bfcl [--category base|miss_func|miss_param|long_context]
                           [--limit N] [--json] [--tree] [--isolation thread|process|ray]
    rho-actors selftest MODULE_OR_PATH... [--timeout S] [--json] [--trusted] [--unconfined]
    rho-actors chat --model openai:MODEL|anthropic:MODEL [--base-url URL] [--session ID]
                    [--max-steps N] [--tools MODULE_OR_PATH...] [--untrusted] [--unconfined] [--data-dir DIR]
                    [--system TEXT]
    rho-actors top [--connect ADDRESS] [--token TOKEN] [--once] [--json]
    rho-actors tree [--tools MODULE_OR_PATH...] [--untrusted] [--unconfined] [--connect ADDRESS]
                    [--token TOKEN] [--json]
    rho-actors approve DATA_DIR SESSION CALL_ID [--by NAME]
    rho-actors reject DATA_DIR SESSION CALL_ID --message TEXT [--by NAME]
    rho-actors --version
    rho-actors -v|-vv COMMAND ...   # rho's log on stderr: INFO (-v) or DEBUG (-vv) and above

Exit codes: 0 success, 1 the command ran and found a failure (for ``replay bfcl``:
a result or a state differed other than through a listed rejection; for ``selftest``: a
selftest failed, timed out or crashed, or a file of a folder could not be loaded (it is
reported and the others run, as is an explicit file that cannot be loaded, or a
tool whose declaration fails its checks); for ``chat``: a prompt ended with an error, a model error
included), 2 usage error, a missing optional dependency or a target of which nothing can
be loaded.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rho_actors.agent.group_commit import DEFAULT_WAL_WRITER_DELAY_MS, WAL_WRITER_DELAY_RANGE_MS, wal_writer_delay_s
from rho_actors.cli.mcp_http import add_http_flags, http_guard
from rho_actors.cli.verbose import add_verbose, showing_log

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


# --------------------------------------------------------------------------- replay


def _add_replay(commands: Any) -> None:
    replay = commands.add_parser(
        "replay", help="replay recorded conversations through the runtime",
        description="Replay recorded conversations through the runtime, each tool call run supervised with "
                    "its deadline, and compare the results with the recorded ones. TARGET: bfcl (the "
                    "Berkeley Function Calling Leaderboard's multi-turn conversations).")
    targets = replay.add_subparsers(dest="target", metavar="TARGET", required=True)

    # light: bfcl_eval itself is imported only when a replay runs
    from rho_actors.integrations.bfcl import CATEGORIES

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
    bfcl.add_argument(
        "--limit", type=_non_negative_int, default=None, metavar="N", help="replay only the first N entries"
    )
    bfcl.add_argument("--json", action="store_true", help="print the summary as one JSON object (no progress bar)")
    bfcl.add_argument(
        "--isolation", choices=("thread", "process", "ray"), default="thread",
        help="where each session's backend instances live and its calls run: a host actor, a process of its own, "
        "a Ray actor (default: thread)",
    )
    bfcl.add_argument(
        "--tree", action="store_true", help="also print the live supervision tree, taken after the last session"
    )
    bfcl.set_defaults(handler=_run_replay_bfcl)


def _run_replay_bfcl(args: argparse.Namespace) -> int:
    from rho_actors.integrations.bfcl import BfclUnavailableError, replay

    try:
        report = replay(category=args.category, limit=args.limit, progress=not args.json, tree=args.tree,
                        isolation=args.isolation)
    except BfclUnavailableError as exc:
        print(f"rho-actors: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json())
    else:
        console = _console()
        console.print(report.render())
        if report.tree is not None:
            from rho_actors.cli.tree import render_tree

            console.print(render_tree(report.tree))
    return report.exit_code


def _console() -> Any:
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)  # a log or pipe: no 80-column wrapping


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
    selftest.add_argument("--trusted", action="store_true",
                          help="import .py files and folders in this process (default: never, only in child processes)")
    selftest.add_argument("--unconfined", action="store_true", help=_UNCONFINED_HELP)
    selftest.set_defaults(handler=_run_selftest)


_UNCONFINED_HELP = (
    "run untrusted files' top level and selftests without OS confinement (default: confined as a system's "
    "workers are: a uid of their own, Landlock, rlimits, a cgroup with a 256 MiB memory bound)"
)


def _policy(args: argparse.Namespace) -> Any:
    """The confinement of untrusted input for this command: the default one, or none
    with ``--unconfined``."""
    from rho_actors.sandbox import UNCONFINED, default_policy

    return UNCONFINED if getattr(args, "unconfined", False) else default_policy()


def _load_tools(
    targets: Sequence[str], command: str, *, trusted: bool, confine: Any = None, keep_going: bool = False,
) -> tuple[list[Any], list[str]]:
    """The tools of ``targets`` and why each file that could not be loaded was not. Each
    ``.py`` file of a folder is loaded on its own: a broken one is reported on stderr
    (naming it) and the others are still loaded. Files are untrusted unless ``trusted``:
    never imported here (:func:`rho_actors.selftest.load_tools`). Raises
    :class:`_ChatSetupError` for a target of which nothing could be loaded, or that
    holds no tools; with ``keep_going`` such a target is reported the same way and the
    others go on (raises only when no target gives a tool)."""
    from pathlib import Path

    from rho_actors.selftest import LoadError, load_tools

    tools: list[Any] = []
    broken: list[str] = []
    for target in targets:
        path = Path(target)
        parts = [target]
        if path.is_dir():
            parts = sorted(str(p) for p in path.iterdir() if p.suffix == ".py" and not p.name.startswith((".", "_")))
        found: list[Any] = []
        failures: list[str] = []
        loaded = 0
        for part in parts or [target]:
            try:
                found.extend(load_tools(part, trusted=trusted, confine=confine))
                loaded += 1
            except LoadError as exc:
                failures.append(str(exc))
        if loaded and not found:
            failures.append(f"{target}: no tools found in it")
        if not keep_going and failures and (not loaded or not found):
            raise _ChatSetupError(f"cannot load {failures[0]}" if loaded == 0 else failures[-1])
        for failure in failures:
            print(f"rho-actors {command}: cannot load {failure}; the other files go on", file=sys.stderr)
        broken.extend(failures)
        tools.extend(t for t in found if all(t is not seen for seen in tools))
    if keep_going and not tools:
        raise _ChatSetupError(f"no tools could be loaded from {', '.join(targets)}")
    return tools, broken


def _run_selftest(args: argparse.Namespace) -> int:
    import json

    from rho_actors.selftest import FAILING, render_rows, run_selftests

    try:
        tools, broken = _load_tools(args.targets, "selftest", trusted=args.trusted, confine=_policy(args),
                                    keep_going=True)
    except _ChatSetupError as exc:
        print(f"rho-actors selftest: {exc}", file=sys.stderr)
        return 2
    rows = run_selftests(tools, timeout_s=args.timeout, confine=_policy(args))
    code = 1 if broken or any(row.outcome in FAILING for row in rows) else 0
    counts = {outcome: sum(row.outcome == outcome for row in rows)
              for outcome in ("passed", "failed", "timeout", "crashed", "no selftest")}
    if args.json:
        print(json.dumps({"results": [row.to_dict() for row in rows], "counts": counts, "broken_files": len(broken),
                          "load_errors": broken, "exit_code": code}, indent=2))
    else:
        console = _console()
        console.print(render_rows(rows))
        summary = [f"{n} {outcome}" for outcome, n in counts.items() if n]
        if broken:
            summary.append(f"{len(broken)} file(s) not loaded")
        console.print(", ".join(summary) or "no tools")
    return code


# --------------------------------------------------------------------------- chat

class _ChatSetupError(Exception):
    """The chat cannot start; ``str(err)`` says why (exit code 2)."""


def _model_spec(text: str) -> str:
    from rho_actors.agent.providers import PROVIDERS

    provider, sep, name = text.partition(":")
    if not sep or provider not in PROVIDERS or not name:
        raise argparse.ArgumentTypeError(
            f"expected PROVIDER:MODEL with PROVIDER one of {', '.join(PROVIDERS)}, got {text!r}"
        )
    return text


def _steps(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {value}")
    return value


def _add_chat(commands: Any) -> None:
    chat = commands.add_parser(
        "chat",
        help="talk with a model that calls your tools, in the terminal",
        description=(
            "An interactive agent session: each line you type is a prompt; the model's tool calls run "
            "in an ActorSystem (each printed with its outcome and duration as it finishes), then its "
            "answer is printed. EOF (Ctrl-D) or /exit quits; the exit code is 1 when a prompt ended with an "
            "error (a model error included). The conversation is kept in "
            "DATA_DIR/sessions/ID/transcript.jsonl: --session ID resumes it. Keys come from "
            "OPENAI_API_KEY / ANTHROPIC_API_KEY."
        ),
    )
    chat.add_argument("--model", required=True, type=_model_spec, metavar="PROVIDER:MODEL",
                      help="openai:MODEL or anthropic:MODEL (e.g. openai:gpt-4o-mini)")
    chat.add_argument("--base-url", default=None, metavar="URL",
                      help="the provider's API at another address (an OpenAI-compatible server for openai:)")
    chat.add_argument("--session", default=None, metavar="ID", help="session id to start or resume (default: new)")
    chat.add_argument("--max-steps", type=_steps, default=10, metavar="N",
                      help="model requests per prompt at most (default: 10)")
    chat.add_argument("--tools", nargs="+", action="extend", default=[], metavar="MODULE_OR_PATH",
                      help="module name, .py file or folder whose tools the model gets")
    chat.add_argument("--untrusted", action="store_true",
                      help="register the tools untrusted: declarations read and calls run in other processes")
    chat.add_argument("--unconfined", action="store_true", help=_UNCONFINED_HELP)
    chat.add_argument("--system", default=None, metavar="TEXT",
                      help="instructions (a system prompt) sent first in every request; not recorded")
    chat.add_argument("--data-dir", default=None, metavar="DIR",
                      help="where sessions are kept (default: $XDG_STATE_HOME/rho_actors, ~/.local/state/rho_actors)")
    chat.add_argument("--mcp", action="append", default=[], metavar='"CMD ARGS"',
                      help="a stdio MCP server whose tools the model gets (repeatable; needs rho_actors[mcp])")
    chat.set_defaults(handler=_run_chat)


def _chat_model(spec: str, base_url: str | None) -> Any:
    """The :class:`rho_actors.agent.model.Model` for ``spec`` (``PROVIDER:MODEL``), its adapter
    imported only now. Raises :class:`_ChatSetupError` naming ``pip install
    'rho_actors[PROVIDER]'`` when the provider's SDK is missing."""
    from rho_actors.agent.providers import model_from_spec

    try:
        return model_from_spec(spec, base_url=base_url)
    except ImportError as exc:  # the SDK is missing: the message names the install command
        raise _ChatSetupError(str(exc)) from None
    except Exception as exc:
        raise _ChatSetupError(f"cannot start the model {spec!r}: {exc}") from None


def _chat_tools(targets: Sequence[str], trusted: bool, confine: Any = None) -> list[Any]:
    return _load_tools(targets, "chat", trusted=trusted, confine=confine)[0]


def _chat_data_dir(given: str | None) -> str:
    if given is not None:
        return given
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "rho_actors")


def _run_chat(args: argparse.Namespace) -> int:
    from rho_actors import ActorSystem, DuplicateToolError
    from rho_actors.agent.transcript import TRANSCRIPT_NAME, TranscriptError, load

    try:
        model = _chat_model(args.model, args.base_url)
        tools = _chat_tools(args.tools, trusted=not args.untrusted, confine=_policy(args))
    except _ChatSetupError as exc:
        print(f"rho-actors chat: {exc}", file=sys.stderr)
        return 2
    with ActorSystem(data_dir=_chat_data_dir(args.data_dir), confinement=False if args.unconfined else None) as system:
        try:
            for tool in tools:
                registration = system.register(tool, untrusted=args.untrusted)
                if not registration.offered:
                    print(f"rho-actors chat: {registration.origin} is left out: {registration.reason}",
                          file=sys.stderr)
            for command in args.mcp:
                _add_mcp_server(system, command)
            loop = system.start_loop(args.session)
            earlier = len(load(loop.data_dir / TRANSCRIPT_NAME).messages)
        except (DuplicateToolError, TypeError, ValueError, TranscriptError, OSError, _ChatSetupError) as exc:
            print(f"rho-actors chat: {exc}", file=sys.stderr)
            return 2
        offered = ", ".join(info.name for info in system.tools()) or "none"
        state = f"resumed, {earlier} messages so far" if earlier else "new"
        print(f"session {loop.session_id} ({state}); model {args.model}; tools: {offered}", flush=True)
        if args.system is not None:
            if not args.system.strip():
                print("rho-actors chat: --system is blank", file=sys.stderr)
                return 2
            loop.instructions = args.system
        failed = _chat_repl(system, loop, model, args.max_steps)
    return 1 if failed else 0


def _add_mcp_server(system: Any, command: str) -> None:
    """Add the stdio MCP server ``command`` (split as a shell would) as a source."""
    import shlex

    try:
        from rho_actors.mcp import MCPServer
    except ImportError:
        raise _ChatSetupError("--mcp needs the MCP SDK: pip install 'rho_actors[mcp]'") from None
    argv = shlex.split(command)
    if not argv:
        raise _ChatSetupError("--mcp needs a command")
    from rho_actors.mcp.names import default_name, numbered

    class _Held:  # the names of the system's running sources
        def __contains__(self, name: object) -> bool:
            return system.whereis(f"source:{name}") is not None

    source = MCPServer(command=argv, name=numbered(default_name(argv), _Held()))
    try:
        handle = system.add_source(source, poll_s=None)
    except FileNotFoundError as exc:  # its program is not there: nothing was started
        raise _ChatSetupError(str(exc)) from None
    if not source.connected:
        handle.close()
        why = source.last_error or f"it did not connect within {source.connect_timeout_s:g} s"
        raise _ChatSetupError(f"the MCP server {command!r} cannot start: {why}")
    handle.refresh()


def _chat_repl(system: Any, loop: Any, model: Any, max_steps: int) -> int:
    """Read prompts from stdin until EOF or ``/exit``; print each call as it finishes
    (from the system's call events), then the answer. Returns how many prompts ended
    with an error."""
    import threading

    from rho_actors import CallEvent
    from rho_actors.agent.driver import prompt

    out_lock = threading.Lock()

    def say(text: str) -> None:
        with out_lock:
            print(text, flush=True)

    def show(event: Any) -> None:
        if not isinstance(event, CallEvent) or event.session_id != loop.session_id:
            return
        if event.kind == "started":
            say(f"  -> {event.tool} [{event.call_id}]")
        elif event.kind in ("finished", "timed_out"):
            say(f"  <- {event.tool} [{event.call_id}]: {event.outcome}, {event.duration_ms:.1f} ms")

    unsubscribe = system.subscribe(show)
    interactive = sys.stdin.isatty()
    failed = 0
    try:
        while True:
            if interactive:
                print("> ", end="", flush=True)
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:
                break
            if not line or line.strip() in ("/exit", "/quit"):
                break
            text = line.strip()
            if not text:
                continue
            try:
                result = prompt(loop, text, model=model, max_steps=max_steps)
            except KeyboardInterrupt:
                say("(interrupted; calls still running finish on their own)")
                continue
            if result.text:
                say(result.text)
            if result.error is not None:
                failed += 1
                with out_lock:
                    print(f"rho-actors chat: {result.error}", file=sys.stderr, flush=True)
    finally:
        unsubscribe()
    return failed


# --------------------------------------------------------------------------- mcp


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8000), got {text!r}")
    return host, int(port)


def _add_mcp(commands: Any) -> None:
    mcp = commands.add_parser(
        "mcp", help="the Model Context Protocol: serve tools to MCP clients",
        description="The Model Context Protocol. ACTION: serve (serve your tools, and those of upstream MCP "
                    "servers, to MCP clients over stdio or streamable HTTP).")
    actions = mcp.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = actions.add_parser(
        "serve",
        help="serve tools to MCP clients over stdio or streamable HTTP",
        description=(
            "Serve the tools of MODULE_OR_PATH... and of upstream MCP servers (rho as a gateway) to MCP "
            "clients: over stdio (the default: a client starts this command), or over streamable HTTP at "
            "http://HOST:PORT/mcp. Each MCP session is a rho session with its own data folder; each call "
            "runs supervised, with its deadline."
        ),
    )
    serve.add_argument("--tools", nargs="+", action="extend", default=[], metavar="MODULE_OR_PATH",
                       help="module name, .py file or folder whose tools are served")
    upstream = serve.add_argument_group(
        "upstream MCP servers", "serve other MCP servers' tools through rho: each server supervised (restarted "
        "within its intensity), each call with its deadline; a tool name two servers list is served as "
        "SERVER__TOOL (see --collisions)")
    upstream.add_argument("--mcp", action="append", default=[], metavar='"CMD ARGS"',
                          help="a stdio MCP server (repeatable)")
    upstream.add_argument("--mcp-url", action="append", default=[], metavar="URL",
                          help="a streamable HTTP MCP server (repeatable)")
    upstream.add_argument("--untrusted-mcp", action="append", default=[], metavar='"CMD ARGS"',
                          help="a stdio MCP server run confined as untrusted tools are: a uid of its own, no network, "
                               "its own folder, Landlock, a memory bound (repeatable)")
    upstream.add_argument("--config", default=None, metavar="GATEWAY.TOML",
                          help="upstream servers, one [servers.NAME] table each (command or url, env, "
                               "timeout_ms, max_restarts, max_seconds, trusted...; see docs/guides/mcp-gateway.md)")
    upstream.add_argument("--collisions", choices=("namespace", "refuse"), default=None,
                          help="a tool name listed by two servers: serve both as SERVER__TOOL (namespace, the "
                               "default) or refuse to start")
    serve.add_argument("--http", type=_host_port, default=None, metavar="HOST:PORT",
                       help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    serve.add_argument("--untrusted", action="store_true",
                       help="register the tools untrusted: declarations read and calls run in other processes")
    serve.add_argument("--unconfined", action="store_true", help=_UNCONFINED_HELP)
    serve.add_argument("--data-dir", default=None, metavar="DIR",
                       help="where sessions are kept (default: a temporary folder, removed at exit)")
    serve.add_argument("--synchronous-commit", choices=("on", "off"), default="on", help="on: a result is synced to "
                       "disk before it is sent; off: within --wal-writer-delay after, by a group commit (a power "
                       "loss may lose the results of that last delay; see docs/guides/mcp.md)")
    serve.add_argument("--wal-writer-delay", type=_wal_writer_delay, default=DEFAULT_WAL_WRITER_DELAY_MS,
                       metavar="MS", help="with --synchronous-commit off: how long a result may wait for its sync, "
                       f"in milliseconds, from 1 to 10000 (PostgreSQL's wal_writer_delay; default "
                       f"{DEFAULT_WAL_WRITER_DELAY_MS})")
    add_http_flags(serve)
    serve.set_defaults(handler=_run_mcp_serve)


def _wal_writer_delay(text: str) -> float:
    try:
        return wal_writer_delay_s(float(text)) * 1000
    except ValueError:
        low, high = WAL_WRITER_DELAY_RANGE_MS
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds from {low} to {high}, got {text!r}"
                                         ) from None


def _run_mcp_serve(args: argparse.Namespace) -> int:
    from rho_actors import ActorSystem, DuplicateToolError

    try:
        from rho_actors.mcp import serve
    except ImportError:
        print("rho-actors mcp: the MCP SDK is missing: pip install 'rho_actors[mcp]'", file=sys.stderr)
        return 2
    from rho_actors.mcp.gateway import Gateway, GatewayConfigError, GatewayError, gateway_config

    try:
        upstreams = gateway_config(args.config, args.mcp, args.mcp_url, args.untrusted_mcp, args.collisions)
    except GatewayConfigError as exc:
        print(f"rho-actors mcp serve: {exc}", file=sys.stderr)
        return 2
    if not args.tools and not upstreams.servers:
        print("rho-actors mcp serve: nothing to serve: give --tools, or MCP servers (--mcp, --mcp-url, "
              "--untrusted-mcp, --config)", file=sys.stderr)
        return 2
    try:
        tools = _chat_tools(args.tools, trusted=not args.untrusted, confine=_policy(args)) if args.tools else []
    except _ChatSetupError as exc:
        print(f"rho-actors mcp serve: {exc}", file=sys.stderr)
        return 2
    with ActorSystem(data_dir=args.data_dir, confinement=False if args.unconfined else None) as system:
        try:
            for tool in tools:
                registration = system.register(tool, untrusted=args.untrusted)
                if not registration.offered:
                    print(f"rho-actors mcp serve: {registration.origin} is left out: {registration.reason}",
                          file=sys.stderr)
        except (DuplicateToolError, TypeError, ValueError) as exc:
            print(f"rho-actors mcp serve: {exc}", file=sys.stderr)
            return 2
        gateway = Gateway(upstreams)
        try:
            gateway.start(system)
        except GatewayError as exc:
            print(f"rho-actors mcp serve: {exc}", file=sys.stderr)
            return 2
        for name, status in gateway.status().items():
            state = "connected" if status["connected"] else "not connected yet"
            info = status["server_info"] or {}
            itself = f" (it says it is {info.get('name')} {info.get('version', '')})".rstrip() if info else ""
            why = "" if status["connected"] else _not_connected(status)
            print(f"MCP server {name} ({'trusted' if status['trusted'] else 'confined'}): {state}, "
                  f"{len(status['tools'])} tools{itself}{why}", file=sys.stderr, flush=True)
        guard = None
        if args.http is not None:
            try:
                guard = http_guard(args)
            except ValueError as exc:
                print(f"rho-actors mcp serve: {exc}", file=sys.stderr)
                return 2
            print(f"serving MCP at http://{args.http[0]}:{args.http[1]}/mcp", file=sys.stderr, flush=True)
        try:
            serve(system, http=args.http, guard=guard, synchronous_commit=args.synchronous_commit == "on",
                  wal_writer_delay_ms=args.wal_writer_delay)
        except KeyboardInterrupt:
            pass
        except OSError as exc:
            print(f"rho-actors mcp serve: {exc}", file=sys.stderr)
            return 2
    return 0


def _not_connected(status: dict[str, Any]) -> str:
    """Why an upstream is not connected, for its status line (its stderr's last words)."""
    if status.get("given_up"):
        return f": given up ({status['given_up']})"
    error = status.get("last_error")
    return f": {error}; it is started again within its restart intensity" if error else ""


# --------------------------------------------------------------------------- entry point


def _version() -> str:
    """The installed distribution's version (``unknown`` when run from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rho_actors")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``rho-actors`` argument parser: one subparser per command group."""
    parser = argparse.ArgumentParser(
        prog="rho-actors",
        description="An OTP-style actor runtime for an LLM agent's tool calls.",
    )
    parser.add_argument("--version", action="version", version=f"rho-actors {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from rho_actors.cli.decisions import add_parsers as _add_decisions
    from rho_actors.cli.tree import add_parser as _add_tree
    from rho_actors.observe.top import add_parser as _add_top

    for add in (_add_replay, _add_selftest, _add_chat, _add_mcp, _add_top, _add_tree, _add_decisions):
        add(commands)
    add_verbose(parser)
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
    with showing_log(args.verbose):
        return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
