"""What every sandbox child runs first (internal).

:func:`child_main` is the one entry point of every child process (worker processes,
throwaway declaration reads, selftests). It calls :func:`enter_child` with the child's
:class:`ChildSetup` (plain data) before any tool code is unpickled or run, then the
child's own ``entry(channel, payload)``, and ends the process with ``os._exit`` whatever
happens.

A confined child (``ChildSetup.confinement``, DESIGN §5 "Confinement") replaces its
environment with ``ChildSetup.env``, pins its imports to directory descriptors opened
while it is still root (:func:`pin_imports`), then calls
:func:`rho_actors.sandbox.confine.confinement.apply` before anything else runs; a step that fails is
written to standard error as one JSON line ``{"confinement_error": "..."}`` and the
child exits with status 1 without running tool code.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import posix
import resource
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rho_actors.sandbox.channel import Channel
from rho_actors.sandbox.confine.confinement import Confinement, ConfinementError, apply, release_host_pipes

__all__ = ["ChildSetup", "child_main", "enter_child", "pin_imports", "replace_environment", "resolve_ahead"]


@dataclass(frozen=True, slots=True)
class ChildSetup:
    """How a child is set up before it runs anything (plain data only).

    ``heap_bytes``: the ``RLIMIT_AS`` bound in bytes, on what the child maps beyond the
    address space it started with (what the fork server preloaded is not charged;
    ``None`` or ``0``: none; a confined child takes it from its confinement instead).
    ``output_path``: a file that takes the child's standard output and error (its
    standard input is then ``/dev/null``, and Python's fault handler writes there);
    ``None``: standard output goes to standard error, so a tool cannot corrupt the
    host's stdout. ``workdir``: the child's working directory, ``HOME`` and temporary
    folder (``TMPDIR``, ``TMP``, ``TEMP``); ``None``: inherited.
    ``confinement``: apply it (after ``env`` and :func:`pin_imports`); ``None``: none.
    ``env``: the child's whole environment (``None``: inherited); the inherited one is
    wiped from memory first. ``import_dirs``: folders (the tool's code) whose modules must
    stay importable after the child drops its uid. ``clean``: the child runs untrusted
    code, so it is forked by the clean fork server (:mod:`rho_actors.sandbox.clean`),
    never by ``multiprocessing``.
    """

    heap_bytes: int | None = None
    output_path: str | None = None
    workdir: str | None = None
    confinement: Confinement | None = None
    env: Mapping[str, str] | None = None
    import_dirs: tuple[str, ...] = ()
    clean: bool = False


def enter_child(setup: ChildSetup) -> tuple[str, ...]:
    """First thing in every child: route its output, replace its environment, confine it
    (or, unconfined, lead a new process group and bound its address space), and move into
    its working folder. Returns the confinement mechanisms applied. Raises
    :class:`~rho_actors.sandbox.confine.confinement.ConfinementError` naming a failed step."""
    if setup.output_path is None:
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            os.dup2(2, 1)
    else:
        fd = os.open(setup.output_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        with contextlib.suppress(Exception):  # no usable stderr: no fault report
            faulthandler.enable(file=sys.stderr, all_threads=True)
    if setup.env is not None:
        replace_environment(setup.env)
    applied: tuple[str, ...] = ()
    host_paths = _host_paths()  # a clean child's: the host's folders, only once confined
    if setup.confinement is not None:
        if setup.confinement.uid is not None:  # imports must survive the uid drop
            host_paths = pin_imports(setup.import_dirs, host_paths)
        applied = apply(setup.confinement)
    else:  # a trusted child keeps neither multiprocessing's fork-server nor its tracker pipe
        release_host_pipes()
        os.setsid()
    if host_paths is not None:
        sys.path[:] = host_paths
        sys.path_importer_cache.clear()
    if setup.workdir is not None:
        for var in ("HOME", "TMPDIR", "TMP", "TEMP"):
            os.environ[var] = setup.workdir
        os.chdir(setup.workdir)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    heap = setup.heap_bytes
    if setup.confinement is None and heap is not None and heap > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = mapped_bytes() + heap  # what the child started with (the fork server's preloads) is not charged
        limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return applied


def mapped_bytes() -> int:
    """This process's address space now (bytes mapped: ``/proc/self/statm``'s first
    field), 0 when it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def replace_environment(env: Mapping[str, str]) -> None:
    """Make ``env`` this process's whole environment. The inherited values are
    overwritten in memory first, in Python's ``posix.environ`` bytes and in the block
    ``/proc/self/environ`` shows, so code run later cannot read them back."""
    bytes_header = sys.getsizeof(b"") - 1
    for key, value in list(posix.environ.items()):
        with contextlib.suppress(OSError, ValueError):
            os.unsetenv(key)
        if len(value) > 1:  # a 1-byte bytes object is CPython's shared singleton: never overwritten
            ctypes.memset(id(value) + bytes_header, 0, len(value))
    posix.environ.clear()
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5) fields 50, 51)
        if 0 < start < end:
            ctypes.memset(start, 0, end - start)
    for name, text in env.items():
        os.environ[name] = text


def _host_paths() -> list[str] | None:
    """The host's ``sys.path`` in a child of the clean fork server, else ``None``."""
    zygote = sys.modules.get("rho_actors.sandbox.zygote")
    paths = getattr(zygote, "HOST_PATHS", None)
    return list(paths) if paths else None


_resolved: dict[str, str] = {}
"""Absolute folders and their ``os.path.realpath``, resolved once in the clean fork
server (:func:`resolve_ahead`) and inherited by every child it forks."""
_packages: list[Any] = []
"""The packages (modules with a list ``__path__``) loaded when :func:`resolve_ahead` ran."""
_modules_then: list[int] = []  # how many modules were loaded then


def resolve_ahead(paths: Iterable[str] = ()) -> int:
    """In the clean fork server, once its preloads are imported and before it forks:
    resolve ``sys.path``, ``paths`` (the host's folders) and every loaded package's
    ``__path__`` (``os.path.realpath``), so that each child's :func:`pin_imports` opens
    them without resolving each again (about 5 ms of CPU a confined start, 500
    modules' folders: benchmarks/PROFILE.md §33). A folder is resolved as it was when
    the fork server started, as the fork server's own imports were; one a child meets
    that was not resolved ahead (a relative one, a package imported after) is resolved
    then. The packages then loaded are noted too: a child in which no module was
    imported since looks at their ``__path__`` only, not at every module's (each look
    at a module copies a page the child shares with the fork server). The importer
    cache is emptied (the fork server imports nothing more; each child would empty it
    again). Returns how many folders were resolved."""
    folders = [*sys.path, *paths]
    _packages[:] = _package_list()
    _modules_then[:] = [len(sys.modules)]
    for module in _packages:
        folders += module.__path__
    sys.path_importer_cache.clear()
    for folder in folders:
        if isinstance(folder, str) and os.path.isabs(folder) and folder not in _resolved:
            _resolved[folder] = os.path.realpath(folder)
    return len(_resolved)


def _package_list() -> list[Any]:
    """The loaded modules with a list ``__path__`` (packages): those noted by
    :func:`resolve_ahead` while no module was imported since, else all, looked up."""
    if _modules_then and _modules_then[0] == len(sys.modules):
        return _packages
    return [module for module in list(sys.modules.values()) if isinstance(getattr(module, "__path__", None), list)]


def _real(path: str) -> str:
    return _resolved.get(path) or os.path.realpath(path)


def pin_imports(extra: tuple[str, ...] = (), later: list[str] | None = None) -> list[str] | None:
    """Keep every ``sys.path`` folder (and ``extra``, and the folders ``later`` names)
    importable after this process drops its uid: open each while still privileged and
    import through ``/proc/self/fd/N`` instead (``sys.path``, packages' ``__path__``, the
    importer cache), so a Python installed in a folder closed to the dropped uid
    (``/root``) still loads modules while the folder itself stays closed. Landlock still
    applies: it checks the real files. Returns ``later`` pinned (``None`` stays ``None``),
    for the caller to make ``sys.path`` once confined."""
    pinned: dict[str, str] = {}

    def pin(paths: list[str]) -> list[str]:
        entries = []
        for entry in paths:
            real = _real(entry or os.getcwd())
            if real not in pinned:
                try:
                    fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                except OSError:
                    continue
                pinned[real] = f"/proc/self/fd/{fd}"
            entries.append(pinned[real])
        return list(dict.fromkeys(entries))

    sys.path[:] = pin([*extra, *sys.path])
    pinned_later = None if later is None else pin([*extra, *later])
    sys.path_importer_cache.clear()
    roots = sorted(pinned, key=len, reverse=True)

    def moved(path: str) -> str:
        for root in roots:
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return pinned[root] + path[len(root):]
        return path

    for module in _package_list():
        path = getattr(module, "__path__", None)
        if isinstance(path, list):
            path[:] = [moved(_real(p)) if isinstance(p, str) else p for p in path]
    return pinned_later


def child_main(conn: Any, setup: ChildSetup, entry: Callable[[Channel, Any], None], payload: Any) -> None:
    """The entry point of every sandbox child: :func:`enter_child`, then
    ``entry(channel, payload)`` on the child's end of its :class:`Channel`; the
    process then ends (``os._exit(0)``) whatever happened. A confinement step that
    fails ends it with status 1 and ``{"confinement_error": "..."}`` on standard error."""
    try:
        try:
            enter_child(setup)
        except (ConfinementError, Exception) as exc:
            problem = str(exc) if isinstance(exc, ConfinementError) else f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(OSError):
                os.write(2, json.dumps({"confinement_error": problem}).encode() + b"\n")
            os._exit(1)
        entry(conn if isinstance(conn, Channel) else Channel(conn), payload)
    finally:
        os._exit(0)
