"""What the registry publishes (DESIGN §3, §5): each registered tool's :class:`ToolEntry`
(its checked declaration, compiled validator, isolation and :class:`Placement`), a
:class:`ToolSet` of them, and the :class:`ToolSetView` through which loops and isolations
read the latest one. Plain frozen data: a published set is replaced whole, never
mutated, so any thread may read it without a lock.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import marshal
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator

from rho_actors.tool import MarshalledSchema, ToolInfo, lazy_copies

__all__ = [
    "WORKER_SCOPES",
    "IsolationName",
    "Placement",
    "ToolEntry",
    "ToolSet",
    "ToolSetView",
    "copied_infos",
    "make_placement",
    "paused_for",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


IsolationName = str
"""The name of an isolation (a key of :data:`rho_actors.isolation.ISOLATIONS`:
``"thread"``, ``"process"``)."""


WORKER_SCOPES = ("session", "call")
"""``worker_scope`` values for untrusted tools: one worker per (tool, session) pair, or
a fresh worker per call."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where and with what a tool's calls run (DESIGN §5). For an untrusted tool:
    ``worker_scope`` (:data:`WORKER_SCOPES`), ``env`` added to its workers' scrubbed
    environment and ``deps``, its calls' ``ctx["deps"]`` (plain JSON data); for a
    trusted tool ``untrusted`` is False and those are unused. ``options``: what its
    isolation was given at registration, checked by it (``resources`` of ``ray``)."""

    untrusted: bool = False
    worker_scope: str = "session"
    env: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    deps: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    options: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)


def make_placement(
    untrusted: bool, worker_scope: str | None, env: Mapping[str, str] | None, deps: Mapping[str, Any] | None
) -> Placement:
    """Check and freeze what ``register`` was given. Raises ``ValueError`` naming the
    bad argument: an unknown scope, a non-``str`` env name or value, deps that are not a
    JSON object, or any of them for a trusted tool (whose calls get the session's deps)."""
    if not untrusted:
        given = [n for n, v in (("worker_scope", worker_scope), ("env", env), ("deps", deps)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to untrusted tools only (register(..., untrusted=True))")
        return Placement()
    scope = worker_scope or "session"
    if scope not in WORKER_SCOPES:
        raise ValueError(f"worker_scope must be one of {', '.join(WORKER_SCOPES)}, not {scope!r}")
    env = dict(env or {})
    bad = [k for k, v in env.items() if type(k) is not str or type(v) is not str or not k or "=" in k or "\0" in k + v]
    if bad:
        raise ValueError(f"env must map variable names to str values; bad entries: {bad!r}")
    try:
        plain = json.loads(json.dumps(dict(deps or {}), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"deps of an untrusted tool must be plain JSON data: {exc}") from None
    return Placement(True, scope, MappingProxyType(env), MappingProxyType(plain))


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """A registered tool with a checked declaration and its compiled argument validator."""

    tool: Any
    info: ToolInfo
    validator: Draft202012Validator
    origin: str
    isolation: IsolationName = "thread"
    placement: Placement = field(default_factory=Placement)
    serial: int = 0
    """The registration this entry comes from: a number no other registration of this
    system had, so a tool registered again (the same name, new code) has a new one. An
    untrusted tool's workers are scoped by it (DESIGN §5)."""
    _schema: MarshalledSchema | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:  # a checked schema is JSON data: marshal copies it exactly, and fast
            object.__setattr__(self, "_schema", MarshalledSchema(self.info.parameter_schema))
        except ValueError:  # a dict or list subclass: offered_info copies it with deepcopy
            pass

    def offered_info(self) -> ToolInfo:
        """A copy of ``info`` to hand out, equal to it, whose schema is its own deep
        copy, decoded from the entry's marshalled schema on its first read
        (:func:`~rho_actors.tool.lazy_copies`)."""
        [info] = lazy_copies((self.info,), (self._schema,))
        return info

    @property
    def untrusted(self) -> bool:
        """Whether the tool was registered untrusted."""
        return self.placement.untrusted

    @property
    def worker_scope(self) -> str:
        """See :class:`Placement`."""
        return self.placement.worker_scope

    @property
    def env(self) -> Mapping[str, str]:
        """See :class:`Placement`."""
        return self.placement.env

    @property
    def deps(self) -> Mapping[str, Any]:
        """See :class:`Placement`."""
        return self.placement.deps


@dataclass(frozen=True, slots=True)
class ToolSet:
    """One published state of the registry.

    ``entries``: name -> :class:`ToolEntry` of every tool that may be offered, in
    registration order; ``unavailable``: name -> why a known name is not offered
    (its declaration failed its checks, or it was unregistered).
    """

    version: int = 0
    entries: Mapping[str, ToolEntry] = field(default_factory=lambda: _EMPTY)
    unavailable: Mapping[str, str] = field(default_factory=lambda: _EMPTY)


class ToolSetView:
    """The registry's latest :class:`ToolSet`; ``current`` is replaced whole, never mutated."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current = ToolSet()


def plain_copy(value: Any) -> Any:
    """A deep copy of ``value``: one ``marshal`` round trip for plain JSON data (exact
    ``dict``/``list``/``str``/numbers), ``copy.deepcopy`` for anything else."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return copy.deepcopy(value)


def copied_infos(entries: Sequence[ToolEntry]) -> list[ToolInfo]:
    """:meth:`ToolEntry.offered_info` of each entry, in order: light copies, each
    schema decoded on its first read (:func:`~rho_actors.tool.lazy_copies`). A large
    offer is made with the cyclic garbage collector paused (:func:`no_collection`)."""
    with paused_for(len(entries)):
        return lazy_copies([entry.info for entry in entries], [entry._schema for entry in entries])


_PAUSE_FROM = 256  # entries


def paused_for(entries: int) -> contextlib.AbstractContextManager[None]:
    """:func:`no_collection` for a burst of work over ``entries`` offered tools from
    256 of them (copies, declarations), else a block that changes nothing."""
    return no_collection() if entries >= _PAUSE_FROM else contextlib.nullcontext()


class _Pauses:
    """How many :func:`no_collection` blocks run now, and whether the first disabled
    the collector (under ``lock``)."""

    lock = threading.Lock()
    running = 0
    disabled_here = False


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Run the block with Python's cyclic garbage collector disabled, then enabled again
    if it was enabled on entry (nested and concurrent blocks count: the last to leave
    restores it). For a bounded burst of new containers that are all alive when it ends
    (a copy of a large offer: tens of thousands of dicts), which would otherwise trigger
    collections that walk the whole heap and promote the copies to the oldest
    generation, only for them to be freed by reference counting soon after. Reference
    counting frees garbage as usual meanwhile. A host that calls ``gc.disable()``
    inside such a block gets the collector enabled again at its end."""
    with _Pauses.lock:
        if _Pauses.running == 0:
            _Pauses.disabled_here = gc.isenabled()
            gc.disable()
        _Pauses.running += 1
    try:
        yield
    finally:
        with _Pauses.lock:
            _Pauses.running -= 1
            if _Pauses.running == 0 and _Pauses.disabled_here:
                _Pauses.disabled_here = False
                gc.enable()
