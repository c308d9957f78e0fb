"""The two sources that come with the runtime (DESIGN §1 "source"; re-exported by
:mod:`rho_actors.sources`, which describes what a source is and how it is served):
:class:`PluginFolder`, a folder of tool files, and :class:`EntryPointGroup`, an
entry-point group of the installed distributions; and :class:`Broken`, what a source
serves for a key it could not turn into a tool.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rho_actors.encoding import describe_exception
from rho_actors.sandbox.enclosure import ConfinePolicy
from rho_actors.sandbox.plugins import (
    DEFAULT_DISCOVERY_TIMEOUT_S,
    PluginLoadError,
    discover_plugin,
    load_module_file,
    tools_in_module,
)
from rho_actors.tool import missing_callbacks

__all__ = ["DEFAULT_GROUP", "Broken", "EntryPointGroup", "PluginFolder"]

DEFAULT_GROUP = "rho_actors.tools"
"""The entry-point group :class:`EntryPointGroup` reads by default."""


@dataclass(frozen=True, slots=True)
class Broken:
    """Stands in for a tool a source could not load: ``reason`` says why (shown in
    :meth:`rho_actors.sources.SourceHandle.status`, logged once per version)."""

    reason: str


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def _the_tool(file: Path, module: types.ModuleType) -> Any:
    """A plugin file's one tool: the module itself, or the one tool defined in it (an
    ``@tool`` function, say); a :class:`Broken` otherwise."""
    found = tools_in_module(module)
    if len(found) == 1:
        return found[0]
    if not found:
        missing = ", ".join(missing_callbacks(module))
        return Broken(f"{file}: not a tool: it lacks {missing} at module level, and defines no tool either")
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


def _discover(file: Path, data: bytes, timeout_s: float, confine: ConfinePolicy | None) -> Any:
    """An untrusted plugin file's one tool as a :class:`~rho_actors.sandbox.plugins.PluginRef`
    (found in a child process: the file is not imported here); a :class:`Broken`
    otherwise."""
    try:
        found = discover_plugin(file, data, timeout_s=timeout_s, confine=confine)
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
    missing = missing_callbacks(tool)
    return Broken(f"{where}: not a tool: it lacks {', '.join(missing)}") if missing else tool


class PluginFolder:
    """A folder of tool modules: each ``*.py`` file directly in ``path`` (not starting
    with ``.`` or ``_``) is one tool, the module itself or the one tool defined in it
    (see the module doc).

    Untrusted (``trusted=False``, the default): a file is never imported in this
    process. Which tool it holds is found in a throwaway child process (bounded by
    ``discovery_timeout_s`` seconds; its process tree is killed at the end), and the
    tool in the scan is a :class:`~rho_actors.sandbox.plugins.PluginRef` (the path, the
    tool's name in the file and the file's bytes), registered untrusted: its
    declaration read, selftest and calls load the file in child processes. The
    discovery child is confined as the system's declaration reads are (the system's
    policy, taken when the folder is added with :func:`rho_actors.sources.add_source`; before that, no OS
    confinement but a scrubbed environment). Trusted: the file is imported here (its
    top-level code runs in this process).

    ``scan()`` returns ``{str(file path): (tool or Broken, content hash)}``; it
    raises ``OSError`` (``FileNotFoundError``, ``NotADirectoryError``...) when the folder
    cannot be listed. Unchanged files are not loaded again. ``name`` defaults to
    ``"plugins:<path>"``.
    """

    def __init__(
        self, path: str | Path, *, name: str | None = None, trusted: bool = False,
        discovery_timeout_s: float = DEFAULT_DISCOVERY_TIMEOUT_S,
    ) -> None:
        self.path = Path(path)
        self.name = name if name is not None else f"plugins:{self.path}"
        self.trusted = trusted
        self.discovery_timeout_s = discovery_timeout_s
        self.confine: ConfinePolicy | None = None
        self._loaded = _Loaded()  # by file path: the tool or Broken of its current version

    def attach(self, system: Any) -> None:
        """Take ``system``'s confinement policy for discovery children (called by
        :func:`add_source`)."""
        self.confine = getattr(system, "confine_policy", None)

    def scan(self) -> dict[str, tuple[Any, object]]:
        """``{str(path): (module or Broken, content hash)}`` for the folder's files now.
        Raises ``OSError`` when the folder cannot be listed."""
        files = sorted(
            p for p in self.path.iterdir() if p.suffix == ".py" and not p.name.startswith((".", "_")) and p.is_file()
        )
        found: dict[str, tuple[Any, object]] = {}
        for file in files:
            key = str(file)
            try:
                data = file.read_bytes()
            except FileNotFoundError:  # removed since the listing
                continue
            except OSError as exc:
                found[key] = (Broken(f"{file}: cannot be read: {describe_exception(exc)}"), ("unreadable", str(exc)))
                continue
            version = _digest(data)
            load = (functools.partial(_load_plugin, file, data) if self.trusted
                    else functools.partial(_discover, file, data, self.discovery_timeout_s, self.confine))
            tool = self._loaded.get(key, version, load)
            found[key] = (tool, version)
        self._loaded.keep_only(found)
        return found

    def __repr__(self) -> str:
        return f"PluginFolder({str(self.path)!r})"


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
