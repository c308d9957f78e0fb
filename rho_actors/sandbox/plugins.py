"""Plugin files: loading one as a module, finding its tools, and the stand-in the host
holds for a tool of an untrusted plugin file (DESIGN §3; internal, used by
:mod:`rho_actors.sources` and :mod:`rho_actors.selftest`).

An untrusted plugin file is never imported in the host. :func:`discover_plugin` loads
it in a throwaway child process (bounded in time and heap; its whole process tree is
killed at the end) and answers, as JSON data, which tools it holds: the module itself,
or the names of the tools defined in it. The host then holds a :class:`PluginRef` per
tool: the file's path, the tool's attribute name and the file's bytes. A ``PluginRef``
has none of a tool's callbacks; it travels to a child process *by reference*
(``__reduce__`` names :func:`load_plugin_tool`), so the child loads those same bytes
itself and gets the real tool: the declaration read, the selftest and every call run
the plugin's code there, never in the host.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
import threading
import traceback
import types
from pathlib import Path
from typing import Any, Final

from rho_actors.declarations.checks import not_a_tool
from rho_actors.encoding import describe_exception
from rho_actors.errors import RhoError
from rho_actors.sandbox import wire
from rho_actors.sandbox.channel import Channel
from rho_actors.sandbox.confine.enclosure import ConfinePolicy, Enclosure, default_policy
from rho_actors.sandbox.processes import close, context, spawn
from rho_actors.sandbox.reads import (
    DEFAULT_HEAP_BYTES,
    IsolatedReadError,
    await_answer,
    become_subreaper,
    linger,
)
from rho_actors.tool import is_tool

__all__ = [
    "DEFAULT_DISCOVERY_TIMEOUT_S",
    "NoTools",
    "PluginLoadError",
    "PluginRef",
    "discover_plugin",
    "load_module_file",
    "load_plugin_tool",
    "tools_in_module",
]

DEFAULT_DISCOVERY_TIMEOUT_S: Final = 5.0
"""Default time bound of finding the tools of an untrusted plugin file, in seconds."""
_MAX_DISCOVERY_BYTES: Final = 64 * 1024
_MAX_TOOLS: Final = 256
_IDENTIFIER: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,199}")


class PluginLoadError(RhoError):
    """A plugin file could not be loaded: ``str(err)`` says why (with the line, when
    the error is in the file)."""


_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def load_module_file(path: str | Path, data: bytes | None = None) -> types.ModuleType:
    """Load a ``.py`` file as a new module object, without leaving it in ``sys.modules``.

    ``data`` is the file's bytes (read now when ``None``), so the module is exactly the
    bytes that were hashed. The module is named ``_rho_plugin_<stem>_<hash>``, the hash
    of the resolved path and the bytes: a changed file gives a new module object. It is
    in ``sys.modules`` only while its top-level code runs (``dataclasses`` and the like
    need that), so cloudpickle ships its functions and classes by value to worker
    processes, which could not import it.

    Raises :class:`PluginLoadError` naming the file, the error and its line for a file
    that cannot be read, compiled or run (any ``BaseException`` of its top-level code,
    ``SystemExit`` included; a ``KeyboardInterrupt`` too, except in the main thread,
    where it is a real Ctrl-C).
    """
    path = Path(path)
    try:
        if data is None:
            data = path.read_bytes()
        resolved = path.resolve()
    except OSError as exc:
        raise PluginLoadError(f"{path}: cannot be read: {describe_exception(exc)}") from None
    stem = _UNSAFE.sub("_", path.stem)[:40]
    identity = str(resolved).encode() + b"\0" + data
    module_name = f"_rho_plugin_{stem}_{_digest(identity)}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None:
        raise PluginLoadError(f"{path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    try:
        code = compile(data, str(resolved), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PluginLoadError(f"{path}: line {exc.lineno}: SyntaxError: {exc.msg}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # null bytes, a bad encoding
        raise PluginLoadError(f"{path}: cannot be compiled: {describe_exception(exc)}") from None
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except KeyboardInterrupt:
        if threading.current_thread() is threading.main_thread():
            raise  # a real Ctrl-C (signals reach only the main thread)
        raise PluginLoadError(f"{path}: importing it raised KeyboardInterrupt") from None
    except BaseException as exc:  # a plugin's SystemExit must not end the scan
        line = next(
            (f.lineno for f in reversed(traceback.extract_tb(exc.__traceback__)) if f.filename == str(resolved)), None
        )
        where = f"line {line}: " if line else ""
        raise PluginLoadError(f"{path}: {where}importing it raised {describe_exception(exc)}") from None
    finally:
        sys.modules.pop(module_name, None)
    return module


def tools_in_module(module: types.ModuleType) -> list[Any]:
    """The tools of ``module``: the module itself when it is a tool, else each of its
    public attributes (not starting with ``_``) that is a tool and was defined in it
    (``__module__`` is the module's name, which ``@tool`` functions also have), in
    definition order. A class is left out when an instance of it is also there (the
    instance is the tool)."""
    if is_tool(module):
        return [module]
    found: list[Any] = []
    seen: set[int] = set()
    for attr, obj in list(vars(module).items()):
        if attr.startswith("_") or isinstance(obj, types.ModuleType) or id(obj) in seen:
            continue
        try:
            if getattr(obj, "__module__", None) != module.__name__ or not is_tool(obj):
                continue
        except BaseException:
            continue
        seen.add(id(obj))
        found.append(obj)
    instance_types = {type(obj) for obj in found if not isinstance(obj, type)}
    return [obj for obj in found if not (isinstance(obj, type) and obj in instance_types)]


class NoTools(PluginLoadError):
    """A plugin file loaded fine but holds no tool (``str(err)`` says what it lacks)."""


def tool_attributes(module: types.ModuleType) -> list[str | None]:
    """The tools of ``module`` by attribute name, as :func:`tools_in_module` finds them
    (``None`` for the module itself)."""
    found = tools_in_module(module)
    if found == [module]:
        return [None]
    names: list[str | None] = []
    for tool in found:
        attr = next((k for k, v in vars(module).items() if v is tool and not k.startswith("_")), None)
        if attr is not None:
            names.append(attr)
    return names


class PluginRef:
    """The host's stand-in for one tool of an untrusted plugin file: ``path`` (the file),
    ``attr`` (the tool's attribute name in it, ``None`` when the module itself is the
    tool) and ``data`` (the file's bytes when it was scanned). It is marked untrusted, has
    none of a tool's callbacks, and is shipped by reference: a child process unpickles
    it as :func:`load_plugin_tool` ``(path, attr, data)``, the real tool."""

    __slots__ = ("attr", "data", "path")
    __rho_untrusted__ = True

    def __init__(self, path: str, attr: str | None, data: bytes) -> None:
        self.path = path
        self.attr = attr
        self.data = data

    @property
    def label(self) -> str:
        """``"file.py"`` or ``"file.py:attr"``, for messages."""
        name = Path(self.path).name
        return name if self.attr is None else f"{name}:{self.attr}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (load_plugin_tool, (self.path, self.attr, self.data))

    def __repr__(self) -> str:
        return f"<PluginRef {self.path}{'' if self.attr is None else ':' + self.attr}>"


def load_plugin_tool(path: str, attr: str | None, data: bytes) -> Any:
    """In a child process: the tool ``attr`` of the plugin file ``path`` loaded from
    ``data`` (the module itself when ``attr`` is ``None``). Raises
    :class:`PluginLoadError` when it cannot be loaded or holds no such tool."""
    module = load_module_file(path, data)
    tool: Any = module if attr is None else getattr(module, attr, None)
    if tool is None or not is_tool(tool):
        raise PluginLoadError(f"{path}: {attr or 'the module'} is not a tool")
    return tool


def discovery_child(channel: Channel, payload: tuple[str, bytes]) -> None:
    """Entry point of a discovery child: one ``DISCOVERY`` answer, JSON
    ``{"tools": [attr or null, ...]}`` or ``{"error": message}``, then it waits to be
    ended with whatever it started."""
    become_subreaper()
    path, data = payload
    try:
        module = load_module_file(path, data)
        answer: dict[str, Any] = {"tools": tool_attributes(module)}
        if not answer["tools"]:
            answer = {"error": f"{path}: not a tool: {not_a_tool(module)}", "no_tools": True}
    except PluginLoadError as exc:
        answer = {"error": str(exc)[:2000]}
    except KeyboardInterrupt:  # raised by the file itself: this child has no terminal
        answer = {"error": f"{path}: importing it raised KeyboardInterrupt"}
    except BaseException as exc:
        answer = {"error": f"{path}: finding its tools failed: {describe_exception(exc)}"[:2000]}
    channel.send(wire.DISCOVERY, json.dumps(answer, ensure_ascii=True).encode("ascii"))
    linger(channel)


def discover_plugin(
    path: str | Path, data: bytes, *, timeout_s: float = DEFAULT_DISCOVERY_TIMEOUT_S,
    heap_bytes: int = DEFAULT_HEAP_BYTES, start_method: str = "forkserver", confine: ConfinePolicy | None = None,
    cancel: threading.Event | None = None,
) -> list[PluginRef]:
    """The tools of the plugin file ``path`` (its bytes ``data``), found in a throwaway
    child process (never imported here): one :class:`PluginRef` per tool, in definition
    order (an empty list: no tool in it). ``timeout_s`` (seconds) and ``heap_bytes``
    (``RLIMIT_AS``) bound the child; it is confined by ``confine`` as a declaration read
    is (``None``: :func:`~rho_actors.sandbox.confine.enclosure.default_policy`, the confinement a
    default system gives; running it unconfined takes an explicit
    :data:`~rho_actors.sandbox.confine.enclosure.UNCONFINED`);
    its whole process tree is killed at the end (:func:`~rho_actors.sandbox.reads.end_child`),
    or as soon as ``cancel`` is set (then it raises :class:`PluginLoadError` saying so).

    Raises :class:`NoTools` (a :class:`PluginLoadError`) when it holds no tool, and
    :class:`PluginLoadError` naming the file and why when it cannot be loaded
    there (a syntax error, its top-level code raised: the message as the child saw it),
    or when the child timed out, crashed or answered something malformed."""
    path = str(path)
    ctx = context(start_method)
    enclosure = Enclosure(confine or default_policy(), heap_bytes or None)
    try:
        try:
            child = spawn(ctx, discovery_child, (path, data), enclosure.setup, name="rho-plugin-discovery",
                          label=f"discovery of {path}")
        except Exception as exc:
            raise PluginLoadError(
                f"{path}: could not start a process to find its tools: {describe_exception(exc)}"
            ) from None
        enclosure.started(child.pid)
        try:
            frame = await_answer(child, lambda: f"finding the tools of {path}", wire.DISCOVERY,
                                 _MAX_DISCOVERY_BYTES, timeout_s, heap_bytes, cancel, enclosure)
        except IsolatedReadError as exc:
            raise PluginLoadError(str(exc)) from None
        finally:
            close(child.proc, child.channel.conn)
    finally:
        enclosure.remove()  # what is left of its tree (its cgroup), its private folder
    try:
        answer = wire.decode_json(frame)
    except wire.WireError as exc:
        raise PluginLoadError(f"{path}: finding its tools: a malformed answer ({exc})") from None
    if type(answer) is dict and set(answer) == {"error", "no_tools"} and type(answer["error"]) is str:
        raise NoTools(answer["error"][:2000])
    if type(answer) is dict and set(answer) == {"error"} and type(answer["error"]) is str:
        raise PluginLoadError(answer["error"][:2000])
    tools = answer.get("tools") if type(answer) is dict and set(answer) == {"tools"} else None
    if (type(tools) is not list or len(tools) > _MAX_TOOLS
            or not all(t is None or (type(t) is str and _IDENTIFIER.fullmatch(t)) for t in tools)
            or (None in tools and len(tools) != 1)):
        raise PluginLoadError(f"{path}: finding its tools: a malformed answer")
    return [PluginRef(path, attr, data) for attr in tools]
