"""The caller's ``contextvars`` in a worker process (internal).

A ``ContextVar`` lives in one process and cannot be pickled, so it travels by name: a
tool shipped by value carries its module's ``request_id = ContextVar("request_id")`` as
:func:`named_context_var` (the worker's variable of that name), and the caller's plain
values (``str``, numbers, ``bool``, ``None``) are set on every variable of that name
the worker holds (:func:`context_vars`) for the call.
"""

from __future__ import annotations

import contextvars
import io
import pickle
import sys
from typing import Any, Final

import cloudpickle

__all__ = ["PLAIN", "context_vars", "dumps", "named_context_var", "plain_values"]

PLAIN: Final = (str, int, float, bool, type(None))
"""The types of values that travel."""

_NAMED: dict[str, contextvars.ContextVar[Any]] = {}
_FOUND: dict[str, list[contextvars.ContextVar[Any]]] = {}
_SCANNED = [0]  # how many modules were loaded at the last scan


def named_context_var(name: str, default: Any = None, has_default: bool = False) -> contextvars.ContextVar[Any]:
    """The worker's ``ContextVar`` called ``name`` (one per name, made on first use):
    what a shipped tool's variable of that name becomes in the worker."""
    var = _NAMED.get(name)
    if var is None:
        var = contextvars.ContextVar(name, default=default) if has_default else contextvars.ContextVar(name)
        _NAMED[name] = var
    return var


def context_vars(name: str) -> list[contextvars.ContextVar[Any]]:
    """Every ``ContextVar`` called ``name`` here: those made by :func:`named_context_var`
    and those at the top level of loaded modules (a tool imported by reference). The
    modules are scanned again only when some were loaded since."""
    if name not in _FOUND and len(sys.modules) != _SCANNED[0]:
        _SCANNED[0] = len(sys.modules)
        _FOUND.clear()
        for module in list(sys.modules.values()):
            for value in list(getattr(module, "__dict__", {}).values()):
                if isinstance(value, contextvars.ContextVar):
                    _FOUND.setdefault(value.name, []).append(value)
    found = list(_FOUND.get(name, []))
    named = _NAMED.get(name)
    if named is not None and named not in found:
        found.append(named)
    return found


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no type hints
    """cloudpickle's pickler, with a ``ContextVar`` pickled by name."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, contextvars.ContextVar):
            try:
                default = contextvars.Context().run(obj.get)  # its default, in an empty context
            except LookupError:
                return named_context_var, (obj.name,)
            if type(default) in PLAIN:
                return named_context_var, (obj.name, default, True)
            return named_context_var, (obj.name,)
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, with each ``ContextVar`` in it pickled by name."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def plain_values(context: contextvars.Context | None) -> dict[str, Any]:
    """The caller's ``contextvars`` whose values are plain data (``str``, numbers,
    ``bool``, ``None``), by name, for a trusted tool's worker or Ray task. A name two variables share
    is left out (it would be ambiguous there); so is anything else (objects do not
    travel). Untrusted tools get none: the host's context is not theirs to see."""
    if context is None:
        return {}
    values: dict[str, Any] = {}
    seen: set[str] = set()
    for var, value in context.items():
        if var.name in seen:
            values.pop(var.name, None)
            continue
        seen.add(var.name)
        if type(value) in PLAIN:
            values[var.name] = value
    return values
