"""The two sources that come with the runtime (DESIGN §1 "source"; re-exported by
:mod:`rho_actors.sources`, which describes what a source is and how it is served):
:class:`PluginFolder`, a folder of tool files, and :class:`EntryPointGroup`, an
entry-point group of the installed distributions; and :class:`Broken`, what a source
serves for a key it could not turn into a tool.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import importlib.metadata
import os
import stat
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from rho_actors.declarations.checks import not_a_tool
from rho_actors.encoding import describe_exception, shown_text
from rho_actors.files import UnsafePathError, open_regular
from rho_actors.sandbox import (
    DEFAULT_DISCOVERY_TIMEOUT_S,
    ConfinePolicy,
    PluginLoadError,
    discover_plugin,
    load_module_file,
    tools_in_module,
)
from rho_actors.tool import missing_callbacks

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_MAX_PLUGIN_FILE_BYTES",
    "DEFAULT_PARALLEL_READS",
    "DEFAULT_SCAN_TIMEOUT_S",
    "HALT_WAIT_S",
    "MAX_REASON_CHARS",
    "Broken",
    "EntryPointGroup",
    "PluginFolder",
]

DEFAULT_GROUP = "rho_actors.tools"
"""The entry-point group :class:`EntryPointGroup` reads by default."""
MAX_REASON_CHARS: Final = 2_000
"""The longest reason a source's key is shown with (a :class:`Broken`'s, a failed
registration's), in characters."""


@dataclass(frozen=True, slots=True)
class Broken:
    """Stands in for a tool a source could not load: ``reason`` says why (shown in
    :meth:`rho_actors.sources.source_actor.SourceHandle.status`, logged once per version),
    kept as one line (a file's name and a child's words escaped, cut to
    :data:`MAX_REASON_CHARS`: :func:`~rho_actors.encoding.shown_text`)."""

    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", shown_text(self.reason, MAX_REASON_CHARS))


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def _the_tool(file: Path, module: types.ModuleType) -> Any:
    """A plugin file's one tool: the module itself, or the one tool defined in it (an
    ``@tool`` function, say); a :class:`Broken` otherwise."""
    found = tools_in_module(module)
    if len(found) == 1:
        return found[0]
    if not found:
        return Broken(f"{file}: not a tool: {not_a_tool(module)}")
    return Broken(f"{file}: defines {len(found)} tools; a plugin file holds one")


class _Loaded:
    """What a source loaded, by key: a key is loaded again only when its version changes."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[object, Any]] = {}

    def get(self, key: str, version: object, load: Callable[[], Any]) -> Any:
        cached = self._by_key.get(key)
        if cached is None or cached[0] != version:
            cached = (version, load())
            self._by_key[key] = cached
        return cached[1]

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget every key not in ``keys`` (their files or entry points are gone)."""
        for gone in set(self._by_key) - set(keys):
            del self._by_key[gone]


def _load_plugin(file: Path, data: bytes) -> Any:
    try:
        module = load_module_file(file, data)
    except PluginLoadError as exc:
        return Broken(str(exc))
    return _the_tool(file, module)


def _discover(file: Path, data: bytes, timeout_s: float, confine: ConfinePolicy | None,
              cancel: threading.Event) -> Any:
    """An untrusted plugin file's one tool as a :class:`~rho_actors.sandbox.plugins.PluginRef`
    (found in a child process, ended at once when ``cancel`` is set: the file is not
    imported here); a :class:`Broken` otherwise."""
    try:
        found = discover_plugin(file, data, timeout_s=timeout_s, confine=confine, cancel=cancel)
    except PluginLoadError as exc:
        return Broken(str(exc))
    if len(found) == 1:
        return found[0]
    if not found:
        return Broken(f"{file}: not a tool: it lacks the callbacks at module level, and defines no tool either")
    return Broken(f"{file}: defines {len(found)} tools; a plugin file holds one")


def _load_entry_point(ep: importlib.metadata.EntryPoint, dist_name: str) -> Any:
    where = f"entry point {ep.name} = {ep.value} ({dist_name})"
    try:
        tool = ep.load()
    except KeyboardInterrupt:
        if threading.current_thread() is threading.main_thread():
            raise  # a real Ctrl-C (signals reach only the main thread)
        return Broken(f"{where}: loading it raised KeyboardInterrupt")
    except BaseException as exc:
        return Broken(f"{where}: loading it raised {describe_exception(exc)}")
    return Broken(f"{where}: not a tool: {not_a_tool(tool)}") if missing_callbacks(tool) else tool


DEFAULT_MAX_PLUGIN_FILE_BYTES: Final = 1 * 2**20
"""Default size bound of one plugin file, in bytes (1 MiB), checked with ``fstat``
before the file is read."""
DEFAULT_SCAN_TIMEOUT_S: Final = 30.0
"""Default bound of one scan of a :class:`PluginFolder`, in seconds: every file still
being read or searched for its tool then is reported, and looked at again next scan."""
DEFAULT_PARALLEL_READS: Final = 4
"""Default number of files of a :class:`PluginFolder` read and searched at once."""
HALT_WAIT_S: Final = 10.0
"""How long :meth:`PluginFolder.halt` waits for its reads to end once cancelled (a
discovery child's tree is killed within a fraction of a second; a trusted folder's
import in a reading thread cannot be interrupted: it is left to finish, logged)."""


@dataclass(frozen=True, slots=True)
class _Seen:
    """A file's last outcome: its ``lstat`` signature, content hash and tool (or Broken)."""

    signature: tuple[int, ...]
    version: object
    tool: Any


def _signature(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _on_sys_path(folder: Path) -> str | None:
    """Why an untrusted plugin folder's files are not loaded: the folder is on this
    process's ``sys.path`` (``""`` is the working directory), so any of its files could
    be imported here by the name of a module looked up later (an optional dependency, a
    module imported on first use), with this process's uid; else ``None``."""
    real = os.path.realpath(folder)
    if any(os.path.realpath(p or os.getcwd()) == real for p in sys.path if isinstance(p, str)):
        return ("refused: the plugin folder is on sys.path, so this process could import its files as modules; "
                "keep untrusted plugins in a folder of their own")
    return None


class PluginFolder:
    """A folder of tool modules: each ``*.py`` file directly in ``path`` (not starting
    with ``.`` or ``_``) is one tool, the module itself or the one tool defined in it
    (see the module doc).

    Untrusted (``trusted=False``, the default): a file is never imported in this
    process, and a folder on this process's ``sys.path`` (the script's own folder, say)
    gives no tools: each of its files is a :class:`Broken` saying so, since any of them
    could be imported here by a module name looked up later. Which tool it holds is
    found in a throwaway child process (bounded by
    ``discovery_timeout_s`` seconds; its process tree is killed at the end), and the
    tool in the scan is a :class:`~rho_actors.sandbox.plugins.PluginRef` (the path, the
    tool's name in the file and the file's bytes), registered untrusted: its
    declaration read, selftest and calls load the file in child processes. The
    discovery child is confined as the system's declaration reads are (the system's
    policy, taken when the folder is added with :func:`rho_actors.sources.source_actor.add_source`; before that, no OS
    confinement but a scrubbed environment). Trusted: the file is imported here (its
    top-level code runs in this process).

    Files are read safely (DESIGN §3 "Plugin files"): a name is ``lstat``-ed and
    opened with ``O_NOFOLLOW | O_NONBLOCK``; only a regular file with one link of at
    most ``max_file_bytes`` bytes (checked with ``fstat`` before reading; default
    :data:`DEFAULT_MAX_PLUGIN_FILE_BYTES`) is read. A symlink, a FIFO, a device, a
    hard-linked file or a larger file is a :class:`Broken` naming the file and what it
    is, never its content. A file whose ``lstat`` is unchanged since the last scan is
    not read again. New and changed files are read and searched ``parallel_reads`` at
    a time (default :data:`DEFAULT_PARALLEL_READS`), and one scan waits at most
    ``scan_timeout_s`` seconds for them all (default :data:`DEFAULT_SCAN_TIMEOUT_S`):
    a file not done by then is a :class:`Broken` for this scan, and its outcome is
    taken up by a later scan. The reading threads end with each scan that leaves no read
    under way (a later scan with files to read starts new ones), and at :meth:`halt`
    (its :class:`~rho_actors.sources.source_actor.SourceActor` stopping: the system's
    stop, the source's close), which cancels the reads under way (their discovery
    children's trees killed) and waits for their threads to end.

    ``scan()`` returns ``{str(file path): (tool or Broken, content hash)}``; it
    raises ``OSError`` (``FileNotFoundError``, ``NotADirectoryError``...) when the folder
    cannot be listed. Unchanged files are not loaded again. ``name`` defaults to
    ``"plugins:<path>"``. ``bounds()`` gives the bounds as plain data.
    """

    def __init__(
        self, path: str | Path, *, name: str | None = None, trusted: bool = False,
        discovery_timeout_s: float = DEFAULT_DISCOVERY_TIMEOUT_S,
        max_file_bytes: int = DEFAULT_MAX_PLUGIN_FILE_BYTES,
        scan_timeout_s: float = DEFAULT_SCAN_TIMEOUT_S,
        parallel_reads: int = DEFAULT_PARALLEL_READS,
    ) -> None:
        for label, value in (("max_file_bytes", max_file_bytes), ("parallel_reads", parallel_reads)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{label} must be a positive int, got {value!r}")
        if not (isinstance(scan_timeout_s, (int, float)) and scan_timeout_s > 0):
            raise ValueError(f"scan_timeout_s must be a positive number of seconds, got {scan_timeout_s!r}")
        self.path = Path(path)
        self.name = name if name is not None else f"plugins:{self.path}"
        self.trusted = trusted
        self.discovery_timeout_s = discovery_timeout_s
        self.max_file_bytes = max_file_bytes
        self.scan_timeout_s = float(scan_timeout_s)
        self.parallel_reads = parallel_reads
        self.confine: ConfinePolicy | None = None
        self._seen: dict[str, _Seen] = {}  # by file path: its last outcome
        self._running: dict[str, tuple[tuple[int, ...], concurrent.futures.Future[_Seen]]] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # made by a scan with files to read
        self._cancel = threading.Event()  # set by halt(): the reads of this pool end at once

    def attach(self, system: Any) -> None:
        """Take ``system``'s confinement policy for discovery children (called by
        :func:`add_source`)."""
        self.confine = getattr(system, "confine_policy", None)

    def detach(self) -> None:
        """:meth:`halt` (called by ``SourceHandle.close``)."""
        self.halt()

    def halt(self, timeout_s: float = HALT_WAIT_S) -> None:
        """End the threads that read files (called when the source's actor stops: the
        system's stop, a restart, the source's close; a later scan starts new ones): the
        reads under way are cancelled (a discovery child's process tree is killed; their
        files are read again by a later scan) and their threads waited for, at most
        ``timeout_s`` seconds (a trusted folder's import cannot be interrupted: one still
        running then is logged and left to end by itself). Never raises."""
        pool, self._pool = self._pool, None
        cancel, self._cancel = self._cancel, threading.Event()
        running = [future for _, future in self._running.values()]
        self._running.clear()
        if pool is None:
            return
        cancel.set()
        pool.shutdown(wait=False, cancel_futures=True)
        _, late = concurrent.futures.wait(running, timeout=timeout_s)
        if late:
            logger.warning("{}: {} file reads still run {} s after they were cancelled; their threads end "
                           "when they do", self.name, len(late), timeout_s)
            return
        pool.shutdown(wait=True)  # each thread is past its read: this joins them

    def bounds(self) -> dict[str, Any]:
        """``{"max_file_bytes": int, "scan_timeout_s": float, "parallel_reads": int,
        "discovery_timeout_s": float}``, shown in the source's ``status()``."""
        return {"max_file_bytes": self.max_file_bytes, "scan_timeout_s": self.scan_timeout_s,
                "parallel_reads": self.parallel_reads, "discovery_timeout_s": self.discovery_timeout_s}

    def scan(self) -> dict[str, tuple[Any, object]]:
        """``{str(path): (module or Broken, content hash)}`` for the folder's files now.
        Raises ``OSError`` when the folder cannot be listed."""
        deadline = time.monotonic() + self.scan_timeout_s
        folder = self.path.resolve()
        names = sorted(n for n in os.listdir(folder) if n.endswith(".py") and not n.startswith((".", "_")))
        found: dict[str, tuple[Any, object]] = {}
        waiting: dict[str, concurrent.futures.Future[_Seen]] = {}
        importable = None if self.trusted else _on_sys_path(folder)
        for filename in names:
            file = self.path / filename
            key = str(file)
            if importable is not None:
                found[key] = (Broken(f"{file}: {importable}"), ("refused", importable))
                continue
            try:
                st = os.stat(folder / filename, follow_symlinks=False)
            except FileNotFoundError:  # removed since the listing
                continue
            except OSError as exc:
                found[key] = (Broken(f"{file}: cannot be read: {describe_exception(exc)}"), ("unreadable", str(exc)))
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            refused = self._refusal(file, st)
            if refused is not None:
                found[key] = (Broken(refused), ("refused", refused))
                continue
            signature = _signature(st)
            seen = self._seen.get(key)
            if seen is not None and seen.signature == signature:
                found[key] = (seen.tool, seen.version)
                continue
            running = self._running.get(key)
            if running is None or (running[1].done() and running[0] != signature):
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(self.parallel_reads,
                                                                       thread_name_prefix="rho-plugin-read")
                future = self._pool.submit(self._read_one, file, folder / filename, signature, seen, self._cancel)
                running = self._running[key] = (signature, future)
            waiting[key] = running[1]
        concurrent.futures.wait(waiting.values(), timeout=max(0.0, deadline - time.monotonic()))
        for key, future in waiting.items():
            if not future.done():
                reason = (f"{key}: still being read or searched for its tool after the scan's bound of "
                          f"{self.scan_timeout_s} s; taken up by a later scan")
                found[key] = (Broken(reason), ("pending", self._running[key][0]))
                continue
            del self._running[key]
            outcome = future.result()
            self._seen[key] = outcome
            found[key] = (outcome.tool, outcome.version)
        for gone in set(self._seen) - set(found):
            del self._seen[gone]
        if self._pool is not None and not self._running:  # no read outlasts this scan: its threads end now
            self.halt()  # (else they idled until the source was closed: a system stopped left them for good)
        return dict(sorted(found.items()))

    def _refusal(self, file: Path, st: os.stat_result) -> str | None:
        """Why the file with status ``st`` is not read (never its content), or ``None``."""
        if stat.S_ISLNK(st.st_mode):
            return f"{file}: a symbolic link: plugin files must be regular files (links are not followed)"
        if not stat.S_ISREG(st.st_mode):
            return f"{file}: not a regular file (a FIFO, socket or device is never opened)"
        if st.st_nlink != 1:
            return f"{file}: has {st.st_nlink} hard links: a plugin file must have one"
        if st.st_size > self.max_file_bytes:
            return f"{file}: {st.st_size} bytes, over the bound of {self.max_file_bytes} bytes of a plugin file"
        return None

    def _read_one(self, file: Path, real: Path, signature: tuple[int, ...], seen: _Seen | None,
                  cancel: threading.Event) -> _Seen:
        """Read ``file`` (at ``real``) safely and find its tool (in a pool thread; a
        discovery ended at once when ``cancel`` is set)."""
        try:
            data = self._read(file, real)
        except _Refused as exc:
            return _Seen(signature, ("refused", str(exc)), Broken(str(exc)))
        except OSError as exc:
            reason = f"{file}: cannot be read: {describe_exception(exc)}"
            return _Seen(signature, ("unreadable", str(exc)), Broken(reason))
        version = _digest(data)
        if seen is not None and seen.version == version:
            return _Seen(signature, version, seen.tool)  # touched, not changed: the same tool
        try:
            tool = (_load_plugin(file, data) if self.trusted
                    else _discover(file, data, self.discovery_timeout_s, self.confine, cancel))
        except BaseException as exc:  # this thread must always answer
            tool = Broken(f"{file}: finding its tool failed: {describe_exception(exc)}")
        return _Seen(signature, version, tool)

    def _read(self, file: Path, real: Path) -> bytes:
        """The bytes of the regular file ``real``: opened without following a link or
        blocking, its ``fstat`` checked before reading. Raises :class:`_Refused` or
        ``OSError``."""
        try:
            fd = open_regular(real, os.O_RDONLY)
        except UnsafePathError:
            raise _Refused(f"{file}: a symbolic link or not a regular file (not followed, not opened)") from None
        try:
            st = os.fstat(fd)
            refused = self._refusal(file, st)
            if refused is not None:
                raise _Refused(refused)
            chunks: list[bytes] = []
            size = 0
            while size <= self.max_file_bytes:
                chunk = os.read(fd, min(1 << 20, self.max_file_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > self.max_file_bytes:
                raise _Refused(f"{file}: grew over the bound of {self.max_file_bytes} bytes of a plugin file")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"PluginFolder({str(self.path)!r})"


class _Refused(Exception):
    """A plugin file that is not read: ``str(err)`` says why (never its content)."""


# --------------------------------------------------------------------------- entry points


class EntryPointGroup:
    """The tools of an entry-point group of the installed distributions (default
    :data:`DEFAULT_GROUP`, ``rho_actors.tools``), e.g. in a ``pyproject.toml``::

        [project.entry-points."rho_actors.tools"]
        weather = "my_pkg.weather"            # a module that is a tool
        search = "my_pkg.tools:Search"        # a class or object that is a tool

    ``scan()`` returns ``{"<distribution>:<entry point>": (tool or Broken,
    "<distribution version>:<entry point value>")}``; an entry point that fails to load
    or is not a tool is a :class:`Broken`. An entry point is loaded once per version;
    note that Python reuses a module it has already imported, so an upgraded
    distribution's new code is only seen by a new process. ``name`` defaults to
    ``"entry-points:<group>"``.
    """

    def __init__(self, group: str = DEFAULT_GROUP, *, name: str | None = None) -> None:
        self.group = group
        self.name = name if name is not None else f"entry-points:{group}"
        self._loaded = _Loaded()

    def scan(self) -> dict[str, tuple[Any, object]]:
        """``{"<distribution>:<name>": (tool or Broken, "<version>:<value>")}`` for the
        group's entry points now."""
        found: dict[str, tuple[Any, object]] = {}
        for ep in importlib.metadata.entry_points(group=self.group):
            dist = ep.dist
            dist_name = dist.name if dist is not None else "?"
            dist_version = dist.version if dist is not None else "?"
            key = f"{dist_name}:{ep.name}"
            version = f"{dist_version}:{ep.value}"
            tool = self._loaded.get(key, version, functools.partial(_load_entry_point, ep, dist_name))
            found[key] = (tool, version)
        self._loaded.keep_only(found)
        return found

    def __repr__(self) -> str:
        return f"EntryPointGroup({self.group!r})"
