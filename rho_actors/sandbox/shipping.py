"""Shipping tools to child processes with cloudpickle (internal).

A tool whose module a fresh process could not import (a plugin loaded from a file path
that is not on ``sys.path``, ``__main__``...) is shipped by value
(:func:`cloudpickle.register_pickle_by_value`); every other module by reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import sysconfig
import threading
import types
import weakref
from collections import OrderedDict
from typing import Any, Final

import cloudpickle

from rho_actors.declarations.checks import DECLARATION_CALLBACKS, describe_origin
from rho_actors.encoding import describe_exception
from rho_actors.function_tool import FunctionTool
from rho_actors.sandbox import context_values

__all__ = [
    "CALLBACKS", "ShippedTools", "Unshippable", "label", "local_modules", "register_by_value", "ship",
]

CALLBACKS: Final = DECLARATION_CALLBACKS
"""The declaration callbacks of a tool (DESIGN §2): the one list the checks read."""


class Unshippable(Exception):
    """The tool could not be pickled; ``str(err)`` says why."""


_by_value_lock = threading.Lock()
_by_value_checked: dict[tuple[str, int], bool] = {}
_registered_for: weakref.WeakKeyDictionary[Any, None] = weakref.WeakKeyDictionary()
_shipped: weakref.WeakKeyDictionary[Any, tuple[bytes, bytes]] = weakref.WeakKeyDictionary()


def _find_spec_fresh(name: str, path: Any) -> Any:
    """The spec the import system would find for ``name`` in a process that has not
    imported it yet: ``sys.meta_path`` asked in order (``importlib.util.find_spec``
    would answer from ``sys.modules``)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(name, path)
        if spec is not None:
            return spec
    return None


def _importable_elsewhere(module: types.ModuleType) -> bool:
    """Whether a fresh process with this ``sys.path`` would import ``module`` by its name
    and get the same file (so cloudpickle may ship its objects by reference)."""
    name = getattr(module, "__name__", None)
    if not isinstance(name, str) or name in ("__main__", "__mp_main__"):
        return False
    if name in sys.builtin_module_names or name == "rho_actors" or name.startswith("rho_actors."):
        return True  # every child imports rho_actors (this module is its entry point)
    spec = getattr(module, "__spec__", None)
    if spec is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    path: Any = None
    found: Any = None
    parts = name.split(".")
    try:
        for i in range(len(parts)):
            found = _find_spec_fresh(".".join(parts[: i + 1]), path)
            if found is None:
                return False
            path = found.submodule_search_locations
            if path is None and i < len(parts) - 1:
                return False
    except Exception:  # a broken finder or path entry: do not trust it
        return False
    if found.origin is None:  # a namespace package: found by name is enough
        return spec.origin is None
    ours = getattr(module, "__file__", None) or spec.origin
    try:
        return os.path.samefile(found.origin, ours)
    except (OSError, TypeError):
        return False


def _candidate_modules(tool: Any) -> list[types.ModuleType]:
    """The modules a tool's code comes from (its own, its classes', its callbacks')."""
    names: list[Any] = []
    if isinstance(tool, types.ModuleType):
        names.append(tool.__name__)
    else:
        cls = tool if isinstance(tool, type) else type(tool)
        names.extend(getattr(k, "__module__", None) for k in cls.__mro__)
        names.append(getattr(tool, "__module__", None))
        wrapped = getattr(tool, "__wrapped__", None)
        names.append(getattr(wrapped, "__module__", None))
        for cb in (*CALLBACKS, "run", "selftest"):
            try:
                fn = getattr(tool, cb, None)
            except Exception:
                continue
            names.append(getattr(fn, "__module__", None))
            names.append(getattr(getattr(fn, "__func__", None), "__module__", None))
    modules: list[types.ModuleType] = []
    for name in dict.fromkeys(n for n in names if isinstance(n, str) and n != "builtins"):
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType):
            modules.append(module)
    return modules


def _installed(module: types.ModuleType) -> bool:
    """Whether ``module`` comes from an installed location (the standard library or a
    site-packages folder), so that another machine with the same packages has it."""
    name = module.__name__
    if name in sys.builtin_module_names or name == "rho_actors" or name.startswith("rho_actors."):
        return True
    origin = getattr(module, "__file__", None)
    if not isinstance(origin, str):
        return True  # built-in, frozen, or a namespace package found by name
    roots = {os.path.realpath(p) for key, p in sysconfig.get_paths().items()
             if key in ("stdlib", "platstdlib", "purelib", "platlib")}
    real = os.path.realpath(origin)
    return any(real.startswith(root + os.sep) for root in roots)


def local_modules(obj: Any, *, installed_only: bool = False) -> list[types.ModuleType]:
    """The modules ``obj``'s code comes from that a fresh process could not import (a
    file not on ``sys.path``): those a pickler must ship by value. With
    ``installed_only``, also every module not installed (a local file on ``sys.path``):
    for processes on other machines, as Ray's workers. ``__main__`` is left out
    (cloudpickle ships it by value anyway)."""
    return [m for m in _candidate_modules(obj) if m.__name__ not in ("__main__", "__mp_main__")
            and (not _importable_elsewhere(m) or (installed_only and not _installed(m)))]


def register_by_value(tool: Any) -> None:
    """Ship the tool's modules by value when a fresh process could not import them
    (checked once per tool object, or per type for an instance without weakrefs)."""
    try:
        if tool in _registered_for:
            return
        key: Any = tool
    except TypeError:  # not weakly referenceable, or not hashable
        key = type(tool)
        if key in _registered_for:
            return
    for module in _candidate_modules(tool):
        module_key = (module.__name__, id(module))
        if module_key in _by_value_checked:
            continue
        importable = _importable_elsewhere(module)
        with _by_value_lock:
            if not importable and module.__name__ not in ("__main__", "__mp_main__"):
                with contextlib.suppress(ValueError):
                    cloudpickle.register_pickle_by_value(module)
            _by_value_checked[module_key] = importable
    with contextlib.suppress(TypeError):
        _registered_for[key] = None


def _pickled(tool: Any) -> tuple[bytes, bytes]:
    """``(digest, bytes)`` of ``tool`` pickled now; raises :class:`Unshippable`."""
    try:
        register_by_value(tool)
        data = context_values.dumps(tool)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a __reduce__ may raise anything, SystemExit included
        raise Unshippable(describe_exception(exc)) from None
    return hashlib.blake2b(data, digest_size=16).digest(), data


def ship(tool: Any) -> tuple[bytes, bytes]:
    """``(digest, pickled bytes)`` of ``tool``. Raises :class:`Unshippable` naming why.

    A module, class or function is pickled once per object (its code is not expected to
    change in place: a changed tool is a new object); an instance is pickled on every
    call, so its current state travels."""
    cacheable = isinstance(tool, (type, types.ModuleType, types.FunctionType))
    if cacheable:
        with contextlib.suppress(TypeError):
            shipped = _shipped.get(tool)
            if shipped is not None:
                return shipped
    shipped = _pickled(tool)
    if cacheable:
        with contextlib.suppress(TypeError):
            _shipped[tool] = shipped
    return shipped


class ShippedTools:
    """The host's cache of pickled tools, one per tool version (thread-safe; DESIGN §5).

    :meth:`ship` pickles an ``@tool`` of a plain function (a :class:`FunctionTool`, whose
    state is its function and declaration) once per (tool object, ``version``) and keeps
    the ``size`` most recently used; a module, class or function goes to :func:`ship`
    (pickled once per object); any other instance, an ``@tool`` method bound to an
    instance included, is pickled on every call, so its current state travels.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._lock = threading.Lock()
        # id(tool) -> (tool, version, function, code, digest, bytes); the tool is held, so its id stays its own
        self._by_tool: OrderedDict[int, tuple[Any, object, Any, Any, bytes, bytes]] = OrderedDict()

    def ship(self, tool: Any, version: object = None) -> tuple[bytes, bytes]:
        """``(digest, pickled bytes)`` of ``tool``; raises :class:`Unshippable` naming why.

        ``version`` is compared by identity (``ProcessIsolation`` passes the registry's
        entry of the tool, made anew by each registration): another version, or the
        function's code replaced in place (a reload that patches ``__code__``), pickles
        the tool anew."""
        if type(tool) is not FunctionTool or not isinstance(tool.func, types.FunctionType):
            return ship(tool)
        func = tool.func
        code = func.__code__
        key = id(tool)
        with self._lock:
            cached = self._by_tool.get(key)
            if cached is not None and cached[1] is version and cached[2] is func and cached[3] is code:
                self._by_tool.move_to_end(key)
                return cached[4], cached[5]
        digest, data = _pickled(tool)
        with self._lock:
            self._by_tool[key] = (tool, version, func, code, digest, data)
            self._by_tool.move_to_end(key)
            while len(self._by_tool) > self._size:
                self._by_tool.popitem(last=False)
        return digest, data


def label(tool: Any) -> str:
    """An untrusted tool's origin for messages (never raises), read without running any
    of its code: a plugin file's stand-in is named by its file, not by its own class."""
    try:
        return describe_origin(tool, trusted=False)
    except BaseException:
        return f"a {type(tool).__qualname__}"
