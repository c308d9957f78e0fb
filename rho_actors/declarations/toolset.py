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
import itertools
import json
import marshal
import os
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, final

from jsonschema import Draft202012Validator

from rho_actors.tool import SCHEMA_SLOT, PendingSchema, ToolInfo, lazy_copies, schema_lock

__all__ = [
    "WORKER_SCOPES",
    "IsolationName",
    "MarshalledSchema",
    "Placement",
    "ToolEntry",
    "ToolSet",
    "ToolSetView",
    "copied_infos",
    "make_placement",
    "offer_chunks",
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


@final
class MarshalledSchema(PendingSchema):
    """A plain JSON schema (exact ``dict``/``list``/``str``/numbers/``bool``/``None``)
    marshalled once: immutable bytes, shared by every :class:`ToolInfo` that
    :func:`~rho_actors.tool.lazy_copies` makes of it, each of which decodes its own
    copy on the first read of its ``parameter_schema``. Raises ``ValueError`` for a value ``marshal``
    cannot copy exactly (a ``dict`` or ``list`` subclass, an object)."""

    __slots__ = ("data",)

    def __init__(self, schema: dict[str, Any]) -> None:
        self.data: Final = marshal.dumps(schema)

    def take(self, info: ToolInfo) -> dict[str, Any]:
        schema: dict[str, Any] = marshal.loads(self.data)
        return schema

    def __reduce__(self) -> tuple[Any, ...]:  # by value: marshal's format is per Python version
        return (MarshalledSchema, (marshal.loads(self.data),))


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
    async_run: bool | None = field(default=None, init=False, repr=False, compare=False)
    """Whether the tool's ``run`` is ``async``: found on the first call awaited on an event
    loop (:func:`rho_actors.loop.inline.runs_inline`), kept for every later one."""

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


_PAUSE_FROM = 256  # entries
_CHUNK = 512  # schemas of one offer decoded together
_SAMPLE = 8  # one copy in 8 of a chunk tells it when dropped
_DROPS = threading.Lock()  # every chunk's count of its dropped copies (held for one decrement, nothing else)


def offer_chunks(entries: Sequence[ToolEntry]) -> tuple[bytes, ...] | None:
    """The schemas of ``entries`` marshalled as lists of 512, for :func:`copied_infos`
    (``None`` for an offer under 256 entries, or when a schema is not plain JSON data:
    a dict or list subclass)."""
    if len(entries) < _PAUSE_FROM:
        return None
    try:
        return tuple(marshal.dumps([entry.info.parameter_schema for entry in entries[start:start + _CHUNK]])
                     for start in range(0, len(entries), _CHUNK))
    except ValueError:
        return None


class _Chunk(PendingSchema):
    """The schemas of up to 512 consecutive copies of one offer (``copies``: weak
    references to them, in order), decoded together on the first read of any of them:
    one ``marshal.loads`` with the collector paused, each copy still alive and pending
    given its own (far fewer collections and calls than 512 decodes in the caller's
    code). ``own``: each copy's entry's :class:`MarshalledSchema`, in the same order.

    Once nearly all of its copies are gone unread (all but an eighth of one in 8 of
    them, which tell it), the survivors are handed their entries' own schemas (shared
    with the registry) and the chunk lets go of its bytes: a caller keeping one copy of
    a large offer keeps no other 511 schemas alive."""

    __slots__ = ("__weakref__", "_blob", "_floor", "_left", "_taking", "copies", "own")

    def __init__(self, blob: bytes, own: list[MarshalledSchema]) -> None:
        self._blob: bytes | None = blob
        self.own = own
        self.copies: list[weakref.ref[ToolInfo]] = []
        self._left = 0  # watched copies not dropped yet (watch)
        self._floor = 0  # at most this many of them left: the survivors take their own schemas
        self._taking = False

    def watch(self, copies: list[ToolInfo]) -> None:
        """Keep weak references to ``copies`` (this chunk's, in order), one in 8 telling
        the chunk when its copy is dropped (through a weak reference: no cycle keeps it)."""
        chunk = weakref.ref(self)

        def gone(_ref: object) -> None:
            held = chunk()
            if held is not None:
                with _DROPS:  # copies are dropped in any thread: no drop is lost to another's
                    held._left -= 1
                    left = held._left
                if left <= held._floor and held.copies and not held._taking:
                    held._let_go()

        # one copy in _SAMPLE tells (its drop costs a call): enough to see nearly all gone
        self.copies = list(map(weakref.ref, copies, itertools.cycle((gone, *(None,) * (_SAMPLE - 1)))))
        self._left = len(self.copies[::_SAMPLE])
        self._floor = self._left // 8

    def _let_go(self) -> None:
        """Hand each copy still pending its entry's own schema, and drop the bytes."""
        peek, put = SCHEMA_SLOT.__get__, SCHEMA_SLOT.__set__
        with schema_lock():  # not while another thread's read of a copy decodes it
            if self._taking or not self.copies:
                return
            for ref, own in zip(self.copies, self.own, strict=True):
                made = ref()
                if made is not None and peek(made, ToolInfo) is self:
                    put(made, own)
            self.copies, self.own, self._blob = [], [], None

    def take(self, info: ToolInfo) -> dict[str, Any]:
        peek, put = SCHEMA_SLOT.__get__, SCHEMA_SLOT.__set__
        self._taking = True
        try:
            with no_collection():
                values = marshal.loads(self._blob) if self._blob is not None else ()
                for ref, value in zip(self.copies, values, strict=True):
                    made = ref()
                    if made is not None and peek(made, ToolInfo) is self:
                        put(made, value)
            self.copies, self.own, self._blob = [], [], None
        finally:
            self._taking = False
        schema = peek(info, ToolInfo)
        if isinstance(schema, PendingSchema):  # handed its own schema meanwhile, not this decode's
            schema = schema.take(info)
        taken: dict[str, Any] = schema
        return taken


def copied_infos(entries: Sequence[ToolEntry], chunks: tuple[bytes, ...] | None = None) -> list[ToolInfo]:
    """:meth:`ToolEntry.offered_info` of each entry, in order: light copies, each
    schema copied on its first read (:func:`~rho_actors.tool.lazy_copies`): from the
    entry's own marshalled schema, or with ``chunks`` (:func:`offer_chunks` of the same
    entries) with the 511 next to it in one decode. A large offer is made with the
    cyclic garbage collector paused (:func:`no_collection`)."""
    with paused_for(len(entries)):
        infos = [entry.info for entry in entries]
        if chunks is None:
            return lazy_copies(infos, [entry._schema for entry in entries])
        own = [entry._schema for entry in entries]
        if None in own:  # a schema marshal cannot copy: no chunks of them were made either
            return lazy_copies(infos, own)
        pending = [_Chunk(blob, own[i * _CHUNK:(i + 1) * _CHUNK]) for i, blob in enumerate(chunks)]  # type: ignore[arg-type]
        copies = lazy_copies(infos, [pending[i // _CHUNK] for i in range(len(infos))])
        for number, chunk in enumerate(pending):
            chunk.watch(copies[number * _CHUNK:(number + 1) * _CHUNK])
        return copies


def paused_for(entries: int) -> contextlib.AbstractContextManager[None]:
    """:func:`no_collection` for a burst of work over ``entries`` offered tools from
    256 of them (copies, declarations), else a block that changes nothing."""
    return no_collection() if entries >= _PAUSE_FROM else contextlib.nullcontext()


class _Pauses:
    """How many :func:`no_collection` blocks run now, in all threads and in each (by
    thread id), and whether the first disabled the collector (under ``lock``)."""

    lock = threading.Lock()
    running = 0
    by_thread: ClassVar[dict[int, int]] = {}
    disabled_here = False


def _before_fork() -> None:
    _Pauses.lock.acquire()  # no block is half entered or left in the child


def _after_fork_in_parent() -> None:
    _Pauses.lock.release()


def _after_fork_in_child() -> None:
    """The child has one thread: the blocks of the others never end there, so only the
    forking thread's count; the collector enabled again when none of its blocks runs
    and a block had disabled it (else the child would run without one for good)."""
    _Pauses.lock = threading.Lock()
    me = threading.get_ident()
    own = _Pauses.by_thread.get(me, 0)
    _Pauses.by_thread = {me: own} if own else {}
    _Pauses.running = own
    if own == 0 and _Pauses.disabled_here:
        _Pauses.disabled_here = False
        gc.enable()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Run the block with Python's cyclic garbage collector disabled, then enabled again
    if it was enabled on entry (nested and concurrent blocks count: the last to leave
    restores it). For a bounded burst of new containers that are all alive when it ends
    (a copy of a large offer: tens of thousands of dicts), which would otherwise trigger
    collections that walk the whole heap and promote the copies to the oldest
    generation, only for them to be freed by reference counting soon after. Reference
    counting frees garbage as usual meanwhile. A host that calls ``gc.disable()``
    inside such a block gets the collector enabled again at its end. A child forked
    meanwhile counts only its forking thread's blocks: it gets the collector back as
    soon as none of those runs (at once when that thread ran none)."""
    me = threading.get_ident()
    with _Pauses.lock:
        if _Pauses.running == 0:
            _Pauses.disabled_here = gc.isenabled()
            gc.disable()
        _Pauses.running += 1
        _Pauses.by_thread[me] = _Pauses.by_thread.get(me, 0) + 1
    try:
        yield
    finally:
        with _Pauses.lock:
            _Pauses.running -= 1
            left = _Pauses.by_thread.pop(me, 1) - 1
            if left:
                _Pauses.by_thread[me] = left
            if _Pauses.running == 0 and _Pauses.disabled_here:
                _Pauses.disabled_here = False
                gc.enable()
