"""Selftests: run each tool's optional ``selftest()`` in a throwaway process (DESIGN §2).

The contract: ``selftest()`` checks that the tool works, with no side effect outside a
temporary folder; it passes by returning ``None``, ``Ok(...)`` or ``True`` (an
``async def selftest`` is awaited), and fails by returning ``Error(reason)`` (or
``False``) or by raising. Any other return value fails, naming the contract.

:func:`run_selftests` runs each selftest in its own child process (a trusted tool's
with ``multiprocessing``'s ``forkserver``, never a bare fork of this multi-threaded
process; an untrusted tool's from the clean fork server, confined by default: DESIGN §5).
The tool travels with cloudpickle, by value when its module could not be imported
there. The child leads a new process group, points its working directory, ``HOME``,
``TMPDIR`` (and ``TMP``, ``TEMP``) at a fresh temporary folder, sends its standard
output and error to a file beside that folder, and calls ``selftest()``. Outcomes:

- ``passed`` / ``failed``: the selftest's own verdict (the message is its ``Ok``
  output, its ``Error`` reason, or the exception it raised);
- ``no selftest``: the tool has none (decided without a process when that is certain);
- ``timeout``: no answer within ``timeout_s`` seconds of the child's start: the child's
  whole process group (the selftest's own subprocesses too) is killed;
- ``crashed``: the child died of a signal (``os.abort()``, a segfault: the message names
  it, and Python's fault handler writes where into the output) or exited without an
  answer (``os._exit``), with its exit code.

Several children run at once (``max_parallel``, default up to 8), each folder is
removed once its child and process group are gone, and the rows come back in the order
of the tools. :func:`selftest_system` does the same for the tools a system offers, and
``rho-actors selftest MODULE_OR_PATH...`` for modules, files and folders
(:func:`load_tools`: an untrusted file or folder is never imported here).

Example::

    rows = run_selftests([weather_tool, search_tool], timeout_s=5.0)
    for row in rows:
        print(row.tool, row.outcome, f"{row.duration_ms:.0f} ms", row.message)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import pickle
import shutil
import stat
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, Literal

from rho_actors.declarations.checks import DeclarationError, check_declaration, read_declaration
from rho_actors.encoding import describe_exception
from rho_actors.errors import RhoError
from rho_actors.sandbox import (
    DEFAULT_HEAP_BYTES,
    MAX_SELFTEST_BYTES,
    SELFTEST,
    Channel,
    Child,
    ChildSetup,
    ConfinePolicy,
    DeadlineReached,
    Enclosure,
    Malformed,
    NoTools,
    PluginLoadError,
    PluginRef,
    WireError,
    become_subreaper,
    close,
    context,
    decode_json,
    default_policy,
    discover_plugin,
    encode_json,
    end_child,
    hold_servers,
    linger,
    load_module_file,
    reap,
    release_servers,
    ship,
    signal_name,
    spawn,
    tools_in_module,
)
from rho_actors.tool import Error, Ok, callback, is_untrusted

__all__ = [
    "DEFAULT_SELFTEST_TIMEOUT_S",
    "FAILING",
    "LoadError",
    "Outcome",
    "SelftestRow",
    "declaration_problem",
    "load_target",
    "load_tools",
    "render_rows",
    "run_selftests",
    "selftest_system",
    "tools_in_module",
]

Outcome = Literal["passed", "failed", "no selftest", "timeout", "crashed"]
FAILING: Final[frozenset[str]] = frozenset({"failed", "timeout", "crashed"})
"""The outcomes that make ``rho-actors selftest`` exit with 1."""

DEFAULT_SELFTEST_TIMEOUT_S: Final = 10.0
_MAX_PARALLEL: Final = 8
_MAX_MESSAGE_CHARS: Final = 2_000  # keeps the child's answer one small pipe write
_MAX_OUTPUT_CHARS: Final = 4_000
_EXIT_GRACE_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class SelftestRow:
    """One tool's selftest: ``tool`` (its name), ``outcome`` (see the module doc),
    ``duration_ms`` (milliseconds: the ``selftest()`` call when the child answered,
    else from the child's start to its end), ``message`` (why, or the ``Ok`` output;
    at most 2 000 characters) and ``output`` (the end of what the selftest process
    printed, standard output and error together; at most 4 000 characters)."""

    tool: str
    outcome: Outcome
    duration_ms: float
    message: str
    output: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict."""
        return asdict(self)


class LoadError(RhoError):
    """A command-line target could not be loaded; ``str(err)`` names it and says why."""


# --------------------------------------------------------------------------- the child


def _clip(text: str, limit: int = _MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=repr, ensure_ascii=False)
    except BaseException:
        try:
            return repr(value)
        except BaseException:
            return f"<{type(value).__qualname__}>"


def _verdict(value: Any) -> tuple[Outcome, str]:
    if value is None or value is True:
        return "passed", ""
    if isinstance(value, Ok):
        return "passed", "" if value.output is None else _text(value.output)
    if isinstance(value, Error):
        return "failed", _text(value.reason)
    if value is False:
        return "failed", "selftest() returned False"
    return "failed", (f"selftest() returned a {type(value).__qualname__}; a selftest returns None or Ok(...) "
                      "to pass, Error(reason) to fail")


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def declaration_problem(tool: Any) -> str | None:
    """Why ``tool``'s declaration fails the checks of a default system (so it is never
    offered: a selftest failure), or ``None``. Runs the tool's declaration callbacks in
    this thread: a trusted tool's here, an untrusted one's only in its selftest process."""
    try:
        check_declaration(read_declaration(tool))
    except DeclarationError as err:
        return f"its declaration fails its checks, so it is never offered: {err}"
    return None


def _selftest_answer(payload: bytes, check: bool = False) -> dict[str, Any]:
    """Load the tool (``check``: and check its declaration) and run its selftest; the
    answer as plain data."""
    try:
        tool = pickle.loads(payload)
    except BaseException as exc:
        return {"outcome": "failed",
                "message": f"the tool could not be loaded in the selftest process: {describe_exception(exc)}"}
    name: str | None = None
    name_cb = callback(tool, "name")
    if name_cb is not None:
        with contextlib.suppress(BaseException):
            answer = name_cb()
            name = answer if type(answer) is str else None
    problem = declaration_problem(tool) if check else None
    if problem is not None:
        return {"outcome": "failed", "message": problem, "name": name}
    run = callback(tool, "selftest")
    if run is None:
        return {"outcome": "no selftest", "message": "", "name": name}
    started = time.perf_counter()
    try:
        value = run()
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
    except BaseException as exc:
        duration_ms = (time.perf_counter() - started) * 1000
        traceback.print_exc()
        return {"outcome": "failed", "message": f"selftest() raised {describe_exception(exc)}",
                "duration_ms": duration_ms, "name": name}
    duration_ms = (time.perf_counter() - started) * 1000
    try:
        outcome, message = _verdict(value)
    except BaseException as exc:
        outcome, message = "failed", f"its result could not be read: {describe_exception(exc)}"
    return {"outcome": outcome, "message": message, "duration_ms": duration_ms, "name": name}


def checked_selftest_child(channel: Channel, payload: bytes) -> None:
    """:func:`selftest_child` that fails a tool whose declaration fails its checks
    (:func:`declaration_problem`) before running its selftest."""
    selftest_child(channel, payload, check=True)


def selftest_child(channel: Channel, payload: bytes, check: bool = False) -> None:
    """Entry point of a selftest child (set up by :func:`enter_child` with its private
    folder and output file): one ``SELFTEST`` answer, then it waits to be ended with
    whatever it started."""
    become_subreaper()
    try:
        answer = _selftest_answer(payload, check)
    except BaseException as exc:
        answer = {"outcome": "failed", "message": f"the selftest process failed: {describe_exception(exc)}"}
    answer["message"] = _clip(str(answer.get("message", "")))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    channel.send(SELFTEST, encode_json(answer))
    linger(channel)


# --------------------------------------------------------------------------- the parent


def _fallback_name(tool: Any) -> str:
    """What a tool's module, class or type is called (runs none of its code)."""
    try:
        if isinstance(tool, PluginRef):
            return tool.label
        if isinstance(tool, types.ModuleType):
            file = getattr(tool, "__file__", None)
            return Path(file).stem if isinstance(file, str) else str(tool.__name__)
        target = tool if isinstance(tool, type) else type(tool)
        return str(target.__qualname__)
    except BaseException:
        return "?"


def _label(tool: Any) -> tuple[str, bool]:
    """``(name, certain)``: a trusted tool's ``name()`` when it answers a str, else
    :func:`_fallback_name` (``certain`` false: the child's answer may name it). No code
    of an untrusted tool runs here."""
    if not is_untrusted(tool):
        cb = callback(tool, "name")
        if cb is not None:
            with contextlib.suppress(BaseException):
                name = cb()
                if type(name) is str and name:
                    return name, True
    return _fallback_name(tool), False


def _surely_without_selftest(tool: Any) -> bool:
    """Whether ``tool`` certainly has no ``selftest`` (found without running its code:
    no such attribute, and no ``__getattr__`` that could make one)."""
    if isinstance(tool, PluginRef):
        return False  # the child that loads the file decides
    try:
        missing = object()
        if inspect.getattr_static(tool, "selftest", missing) is not missing:
            return False
        if isinstance(tool, types.ModuleType):
            return "__getattr__" not in vars(tool)
        return inspect.getattr_static(type(tool), "__getattr__", missing) is missing
    except BaseException:
        return False


def _read_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _MAX_OUTPUT_CHARS * 4))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return text[-_MAX_OUTPUT_CHARS:]


def _remove_tree(root: str) -> None:
    """Remove ``root``, also when the selftest left read-only folders in it."""

    def retry(func: Callable[..., Any], path: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, stat.S_IRWXU)
            func(path)

    shutil.rmtree(root, onerror=retry)
    if os.path.lexists(root):
        shutil.rmtree(root, ignore_errors=True)


def _await_answer(child: Child, deadline: float) -> tuple[dict[str, Any] | None, bool]:
    """``(answer, ended)``: the child's answer, or ``None`` and whether the child ended
    without one (``False``: the deadline passed first)."""
    try:
        tag, body = child.channel.recv(deadline, MAX_SELFTEST_BYTES)
    except DeadlineReached:
        return None, False
    except (EOFError, Malformed):  # closed without an answer, or an oversized one
        return None, True
    try:
        answer = decode_json(body) if tag == SELFTEST else None
    except WireError:
        answer = None
    return (answer if _well_formed(answer) else {"outcome": "malformed"}), True


_ANSWER_TYPES: Final[Mapping[str, tuple[type, ...]]] = {
    "outcome": (str,), "message": (str,), "duration_ms": (int, float), "name": (str, type(None)),
}


def _well_formed(answer: Any) -> bool:
    """Whether a child's answer has the shape :func:`_selftest_answer` gives it (a
    ``dict`` of known keys with values of exact types)."""
    return type(answer) is dict and "outcome" in answer and all(
        key in _ANSWER_TYPES and type(value) in _ANSWER_TYPES[key] for key, value in answer.items()
    )


def _row(name: str, certain: bool, answer: dict[str, Any] | None, ended: bool, code: int | None,
         elapsed_ms: float, timeout_s: float, output: str) -> SelftestRow:
    """The row for a child's answer (or its absence)."""
    if answer is not None:
        outcome = answer.get("outcome")
        if outcome not in ("passed", "failed", "no selftest"):
            return SelftestRow(name, "crashed", elapsed_ms, "the selftest process sent a malformed answer", output)
        child_name = answer.get("name")
        if not certain and isinstance(child_name, str) and child_name:
            name = child_name
        duration = answer.get("duration_ms")
        if outcome == "no selftest":
            duration = 0.0
        return SelftestRow(
            name,
            outcome,
            float(duration) if isinstance(duration, (int, float)) else elapsed_ms,
            _clip(str(answer.get("message", ""))),
            output,
        )
    if not ended:
        return SelftestRow(name, "timeout", elapsed_ms,
                           f"no answer within {timeout_s:g} s: its process group was killed", output)
    if isinstance(code, int) and code < 0:
        message = f"the selftest process died of {signal_name(-code)}"
    else:
        message = f"the selftest process exited with code {code} without an answer"
    return SelftestRow(name, "crashed", elapsed_ms, message, output)


def _run_one(
    given: str | None, tool: Any, timeout_s: float, start_method: str, confine: ConfinePolicy | None = None,
    heap_bytes: int | None = None, check: bool = False,
) -> SelftestRow:
    name, certain = (given, True) if given is not None else _label(tool)
    trusted = confine is None
    if check and trusted:  # a trusted tool's declaration is read here (an untrusted one's by its child)
        problem = declaration_problem(tool)
        if problem is not None:
            return SelftestRow(name, "failed", 0.0, _clip(problem))
    if _surely_without_selftest(tool) and (trusted or not check):
        return SelftestRow(name, "no selftest", 0.0, "")
    try:
        _, payload = ship(tool)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return SelftestRow(name, "failed", 0.0, _clip(f"the tool could not be shipped to a child process: {exc}"))
    ctx = context(start_method)
    root = tempfile.mkdtemp(prefix="rho_selftest-")
    workdir = os.path.join(root, "work")
    output_path = os.path.join(root, "output.txt")
    child: Child | None = None
    enclosure: Enclosure | None = None
    try:
        if confine is not None:  # an untrusted tool's: confined as its workers are, scrubbed environment
            enclosure = Enclosure(confine, heap_bytes or None)
            setup = dataclasses.replace(enclosure.setup, output_path=output_path)
        else:
            os.mkdir(workdir, 0o700)
            setup = ChildSetup(None, output_path, workdir)
        try:
            entry = checked_selftest_child if check and not trusted else selftest_child
            child = spawn(ctx, entry, payload, setup, name="rho-selftest")
        except Exception as exc:
            return SelftestRow(name, "crashed", 0.0,
                               _clip(f"could not start a selftest process: {describe_exception(exc)}"))
        if enclosure is not None:
            enclosure.started(child.pid)
        started = time.monotonic()  # from the child's start: a fork server starting first does not count
        answer, ended = _await_answer(child, started + timeout_s)
        if answer is None and ended:
            reap(child.proc, _EXIT_GRACE_S)  # closed its pipe: give it a moment to finish exiting
        elapsed_ms = (time.monotonic() - started) * 1000
        code = child.proc.exitcode
        end_child(child, enclosure)  # the child, and whatever it started
        return _row(name, certain, answer, ended, code, elapsed_ms, timeout_s, _read_tail(output_path))
    finally:
        if child is not None:
            if child.proc.exitcode is None:
                end_child(child, enclosure)
            close(child.proc, child.channel.conn)
        if enclosure is not None:
            enclosure.remove()  # what is left of its tree (its cgroup), its private folder
        _remove_tree(root)


def run_selftests(
    tools: Iterable[Any] | Mapping[str, Any],
    *,
    timeout_s: float = DEFAULT_SELFTEST_TIMEOUT_S,
    max_parallel: int | None = None,
    start_method: str = "forkserver",
    confine: ConfinePolicy | None = None,
    heap_bytes: int = DEFAULT_HEAP_BYTES,
) -> list[SelftestRow]:
    """Run each tool's ``selftest()`` in a throwaway child process (see the module doc).

    ``tools``: the tools (each named by its ``name()`` when trusted, else by what the
    child process reads), or a mapping ``{name: tool}``. ``timeout_s``: seconds each
    selftest gets from its process's start; past it the process group is killed and the
    row is ``timeout``. ``max_parallel``: children at once (default: the CPU count,
    between 2 and 8). ``start_method``: ``"forkserver"`` (default) or ``"spawn"``, for
    trusted tools (an untrusted one's child always starts clean, DESIGN §5).

    An untrusted tool's selftest (a plugin file's, or a tool marked untrusted) runs
    confined as a system's workers are, by ``confine`` (default:
    :func:`~rho_actors.sandbox.confine.enclosure.default_policy`; unconfined only with the explicit
    :data:`~rho_actors.sandbox.confine.enclosure.UNCONFINED`), its whole tree bounded to
    ``heap_bytes`` (bytes, default 256 MiB: a cgroup, else an RSS sampler, and
    ``RLIMIT_AS`` per process).

    A tool whose declaration fails the checks of a default system (and so would never
    be offered) is ``failed``, naming why, whether or not it has a selftest.

    Returns one :class:`SelftestRow` per tool, in the given order. A tool's failure,
    hang or crash is its row, never an exception here; raises ``ValueError`` for a
    ``timeout_s`` that is not a positive number, a ``max_parallel`` below 1, or an
    unknown ``start_method``.
    """
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if max_parallel is not None and (type(max_parallel) is not int or max_parallel < 1):
        raise ValueError(f"max_parallel must be an int of 1 or more, got {max_parallel!r}")
    context(start_method)  # a bad start method fails here, before any child
    named = [(str(name), tool) for name, tool in tools.items()] if isinstance(tools, Mapping) else [
        (None, tool) for tool in tools
    ]
    policy = confine or default_policy()
    items = [(name, tool, policy if isinstance(tool, PluginRef) or is_untrusted(tool) else None)
             for name, tool in named]
    return _run_all(items, float(timeout_s), max_parallel, start_method, heap_bytes, check=True)


def _run_all(
    items: list[tuple[str | None, Any, ConfinePolicy | None]], timeout_s: float, max_parallel: int | None,
    start_method: str, heap_bytes: int | None, check: bool = False,
) -> list[SelftestRow]:
    if not items:
        return []
    workers = max_parallel or max(2, min(_MAX_PARALLEL, os.cpu_count() or 2))
    hold_servers()  # the host's fork-server settings come back when the last child is done
    try:
        with concurrent.futures.ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="rho-selftest") as pool:
            futures = [pool.submit(_run_one, name, tool, timeout_s, start_method, confine, heap_bytes, check)
                       for name, tool, confine in items]
            return [f.result() for f in futures]
    finally:
        release_servers()


def selftest_system(
    system: Any, timeout_s: float = DEFAULT_SELFTEST_TIMEOUT_S, confine: ConfinePolicy | None = None,
    heap_bytes: int = DEFAULT_HEAP_BYTES,
) -> list[SelftestRow]:
    """:func:`run_selftests` of every tool ``system`` (an :class:`rho_actors.ActorSystem`)
    offers now, named by their checked declarations, in registration order (a tool left
    out by its declaration checks is not run). ``timeout_s``: seconds per selftest.
    The selftest of a tool registered untrusted runs confined by ``confine`` (the
    system's policy: as its workers are, with a scrubbed environment, its whole tree
    bounded to ``heap_bytes`` and killed after it; ``None``:
    :func:`~rho_actors.sandbox.confine.enclosure.default_policy`). Raises ``ValueError`` for a
    bad ``timeout_s``."""
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    policy = confine or default_policy()
    items: list[tuple[str | None, Any, ConfinePolicy | None]] = [
        (name, entry.tool, policy if entry.untrusted else None) for name, entry in system.tool_set().entries.items()
    ]
    return _run_all(items, float(timeout_s), None, "forkserver", heap_bytes)


# --------------------------------------------------------------------------- command-line targets


def load_target(target: str) -> list[types.ModuleType]:
    """The modules a ``rho-actors selftest`` argument names: a ``.py`` file (loaded as
    a plugin file, see :func:`rho_actors.sources.source_actor.load_module_file`), a folder (each
    ``*.py`` directly in it, not starting with ``.`` or ``_``), or a module name
    (imported with the current directory on ``sys.path``, as ``python -m`` does).

    Raises :class:`LoadError` naming ``target`` when it cannot be loaded.
    """
    path = Path(target)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".py" and not p.name.startswith((".", "_")))
        if not files:
            raise LoadError(f"{target}: a folder with no .py files")
        return [m for file in files for m in load_target(str(file))]
    if target.endswith(".py") or os.sep in target or path.is_file():
        if not path.is_file():
            raise LoadError(f"{target}: no such file")
        try:
            return [load_module_file(path)]
        except PluginLoadError as exc:
            raise LoadError(str(exc)) from None
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return [importlib.import_module(target)]
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise LoadError(f"{target}: cannot import it: {describe_exception(exc)}") from None


def load_tools(target: str, *, trusted: bool = False, confine: ConfinePolicy | None = None) -> list[Any]:
    """The tools a ``rho-actors selftest`` (or ``chat --tools``) argument names.

    A ``.py`` file or a folder (each ``*.py`` directly in it, not starting with ``.``
    or ``_``) is untrusted unless ``trusted``: its files are never imported in this
    process; each file's tools are found in a throwaway child process
    (:func:`rho_actors.sandbox.plugins.discover_plugin`) and come back as
    :class:`~rho_actors.sandbox.plugins.PluginRef` stand-ins that child processes load;
    that child is confined by ``confine`` (default:
    :func:`~rho_actors.sandbox.confine.enclosure.default_policy`; unconfined only with the explicit
    :data:`~rho_actors.sandbox.confine.enclosure.UNCONFINED`).
    Trusted, or a module name (installed code, imported as ``python -m`` does), it is
    :func:`load_target` and :func:`tools_in_module`.

    Raises :class:`LoadError` naming ``target`` when it cannot be loaded."""
    path = Path(target)
    if trusted or not (path.is_dir() or target.endswith(".py") or os.sep in target or path.is_file()):
        return [tool for module in load_target(target) for tool in tools_in_module(module)]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".py" and not p.name.startswith((".", "_")))
        if not files:
            raise LoadError(f"{target}: a folder with no .py files")
        return [tool for file in files for tool in load_tools(str(file), confine=confine)]
    if not path.is_file():
        raise LoadError(f"{target}: no such file")
    try:
        return list(discover_plugin(path, path.read_bytes(), confine=confine or default_policy()))
    except NoTools:
        return []
    except OSError as exc:
        raise LoadError(f"{target}: cannot be read: {describe_exception(exc)}") from None
    except PluginLoadError as exc:
        raise LoadError(str(exc)) from None


def render_rows(rows: Iterable[SelftestRow]) -> Any:
    """The rows as a ``rich.table.Table``: tool, outcome, duration (ms), message; each
    text shown as written, never as markup, control characters replaced
    (:func:`~rho_actors.observe.terminal.terminal_text`)."""
    from rich.table import Table

    from rho_actors.observe.terminal import terminal_text

    styles = {"passed": "green", "failed": "red", "timeout": "red", "crashed": "bold red", "no selftest": "dim"}
    table = Table(title="selftests", title_justify="left")
    table.add_column("tool", style="bold")
    table.add_column("outcome")
    table.add_column("duration", justify="right")
    table.add_column("message", overflow="fold")
    for row in rows:
        ms = row.duration_ms
        duration = "" if row.outcome == "no selftest" else f"{ms:,.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
        table.add_row(terminal_text(row.tool), terminal_text(row.outcome, style=styles.get(row.outcome, "")),
                      duration, terminal_text(row.message))
    return table
