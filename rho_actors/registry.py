"""The ToolRegistry actor: registered tools, and the tool set loops read (DESIGN §6: permanent).

Its state lives in a :class:`RegistryState` the system keeps (as an OTP process keeps
an ETS table with an heir), so a registry restarted by its supervisor loses no tool.

Registration asks the DeclarationActor for the tool's checked declaration, refuses a
second tool with a name already taken (both origins named: no last-writer-wins), and
publishes a new immutable :class:`ToolSet` (announced as a
:class:`~rho_actors.events.ToolSetChanged` event). Loops read the current set without a
message round trip, the way Erlang code reads ``persistent_term``: the registry is the
only writer and every published set is frozen.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from loguru import logger

from rho_actors.arguments import make_validator
from rho_actors.declaration_actor import DECLARATIONS, Checked, ReadUntrusted
from rho_actors.declarations import Rejected, describe_origin
from rho_actors.errors import RhoError
from rho_actors.events import ToolSetChanged
from rho_actors.otp.actor import Actor
from rho_actors.results import text
from rho_actors.tool import ToolInfo

if TYPE_CHECKING:
    import pykka

    from rho_actors.runtime import Runtime

__all__ = [
    "DuplicateToolError",
    "WORKER_SCOPES",
    "IsolationName",
    "Placement",
    "Registration",
    "RegistryState",
    "ToolEntry",
    "ToolRegistry",
    "ToolSet",
    "ToolSetView",
]

_ASK_TIMEOUT_S = 60.0
_EMPTY: Mapping[str, Any] = MappingProxyType({})


class DuplicateToolError(RhoError, ValueError):
    """A registration refused because another registered tool has the same name."""


@dataclass(frozen=True, slots=True)
class Registration:
    """What :meth:`ActorSystem.register` did: ``info`` is the checked declaration, or
    ``None`` when the tool is left out (``reason`` says why)."""

    origin: str
    info: ToolInfo | None
    reason: str | None = None

    @property
    def offered(self) -> bool:
        """Whether the tool passed its checks (loops may offer it)."""
        return self.info is not None


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


@dataclass(slots=True)
class _Slot:
    tool: Any
    origin: str
    outcome: ToolInfo | Rejected
    validator: Draft202012Validator | None
    isolation: IsolationName
    placement: Placement = field(default_factory=Placement)
    serial: int = 0


@dataclass(frozen=True, slots=True)
class _Untrusted:
    tool: Any
    origin: str
    isolation: IsolationName
    placement: Placement = field(default_factory=Placement)


@dataclass(slots=True)
class RegistryState:
    """The registry's durable state: ``slots`` by name (a valid name, offered or not),
    ``nameless`` rejected tools whose name is unreadable, ``removed`` names with why,
    ``untrusted`` registered untrusted tools by id, and ``waiting``, the hosts waiting
    for the first read of an untrusted tool."""

    slots: dict[str, _Slot] = field(default_factory=dict)
    nameless: dict[int, _Slot] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)
    untrusted: dict[int, _Untrusted] = field(default_factory=dict)
    waiting: dict[int, concurrent.futures.Future[Registration]] = field(default_factory=dict)
    serials: int = 0  # the last registration's serial (see ToolEntry.serial)


class ToolRegistry(Actor):
    """Registered tools by name; publishes a :class:`ToolSet` to ``view`` on each change.
    It reaches the DeclarationActor by its name ``"declarations"`` in the runtime's names."""

    def __init__(self, runtime: Runtime, state: RegistryState) -> None:
        super().__init__()
        self._names = runtime.names
        self._view = runtime.tools
        self._events = runtime.events
        self._state = state
        self._slots = state.slots
        self._nameless = state.nameless
        self._removed = state.removed
        self._max_timeout_ms = runtime.limits.max_timeout_ms
        self._declarations_proxy: tuple[pykka.ActorRef[Any], Any] | None = None

    def _declarations(self) -> Any:
        """A proxy of the DeclarationActor, built once per actor (anew after a restart)."""
        ref = self._names.whereis(DECLARATIONS)
        if ref is None:
            raise RuntimeError("the DeclarationActor is not running (it is being restarted); try again")
        if self._declarations_proxy is None or self._declarations_proxy[0] is not ref:
            self._declarations_proxy = (ref, ref.proxy())
        return self._declarations_proxy[1]

    def register(
        self, tool: Any, origin: str | None = None, untrusted: bool = False, isolation: IsolationName | None = None,
        placement: Placement | None = None,
    ) -> Registration | concurrent.futures.Future[Registration]:
        """Check and add ``tool``; registering the same object again re-reads it.

        A trusted tool is read now and its :class:`Registration` returned; raises
        :class:`DuplicateToolError` when another tool holds its name. An untrusted tool
        is read in a throwaway process by the DeclarationActor: this returns a future of
        its Registration (or of the DuplicateToolError). ``isolation`` defaults to
        ``"process"`` for an untrusted tool, else ``"thread"``; ``placement`` is kept with
        the tool's entry (see :func:`make_placement`).
        """
        origin = origin or describe_origin(tool, trusted=not untrusted)
        isolation = isolation or ("process" if untrusted else "thread")
        if not untrusted:
            outcome = self._declarations().check(tool, fresh=True).get(timeout=_ASK_TIMEOUT_S)
            return self._apply(tool, origin, outcome, isolation, placement)
        self._state.untrusted[id(tool)] = _Untrusted(tool, origin, isolation, placement or Placement(True))
        waiting = self._state.waiting.get(id(tool))
        if waiting is None or waiting.done():
            waiting = concurrent.futures.Future()
            self._state.waiting[id(tool)] = waiting
        if not self._names.deliver(DECLARATIONS, ReadUntrusted(tool), patience_s=_ASK_TIMEOUT_S):
            self._state.waiting.pop(id(tool), None)
            self._state.untrusted.pop(id(tool), None)
            raise RuntimeError("the DeclarationActor did not take the read (the system is stopping?)")
        return waiting

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Checked):
            entry = self._state.untrusted.get(id(message.tool))
            if entry is None or entry.tool is not message.tool:
                return None  # unregistered while it was read
            waiting = self._state.waiting.pop(id(message.tool), None)
            try:
                registration = self._apply(entry.tool, entry.origin, message.outcome, entry.isolation, entry.placement)
            except DuplicateToolError as err:
                del self._state.untrusted[id(message.tool)]
                if waiting is not None:
                    waiting.set_exception(err)
                else:
                    logger.warning("{}", err)
                return None
            if waiting is not None:
                waiting.set_result(registration)
            return None
        return super().on_receive(message)

    def _apply(
        self, tool: Any, origin: str, outcome: ToolInfo | Rejected, isolation: IsolationName,
        placement: Placement | None = None,
    ) -> Registration:
        placement = placement or Placement()
        name = outcome.name
        if name is None:
            assert isinstance(outcome, Rejected)
            self._nameless[id(tool)] = _Slot(tool, origin, outcome, None, isolation, placement)
            return Registration(origin, None, outcome.reason)
        held = self._slots.get(name)
        if held is not None and held.tool is not tool:
            raise DuplicateToolError(
                f"tool name {name!r} is already registered by {held.origin}; refused {origin} "
                f"(unregister the first to replace it)"
            )
        self._nameless.pop(id(tool), None)
        bound = self._max_timeout_ms
        if isinstance(outcome, ToolInfo) and outcome.timeout_ms > bound:
            logger.warning("tool {!r} ({}) declares timeout_ms={}, above this system's max_timeout_ms={}: its calls "
                           "get {} ms", name, origin, outcome.timeout_ms, bound, bound)
            outcome = dataclasses.replace(outcome, timeout_ms=bound)
        validator = make_validator(copy.deepcopy(outcome.parameter_schema)) if isinstance(outcome, ToolInfo) else None
        renamed = [n for n, s in self._slots.items() if s.tool is tool and n != name]
        for old in renamed:  # the same tool re-registered under a new name: one name only
            del self._slots[old]
            self._removed[old] = text("unavailable_renamed", tool=old, new=name)
        self._state.serials += 1
        self._slots[name] = _Slot(tool, origin, outcome, validator, isolation, placement, self._state.serials)
        self._removed.pop(name, None)
        self._publish()
        if isinstance(outcome, ToolInfo):
            return Registration(origin, outcome)
        return Registration(origin, None, outcome.reason)

    def unregister(self, name_or_tool: Any) -> bool:
        """Remove a tool by name or by object. Returns whether anything was removed."""
        if isinstance(name_or_tool, str):
            slot = self._slots.pop(name_or_tool, None)
            name = name_or_tool
        else:
            name = next((n for n, s in self._slots.items() if s.tool is name_or_tool), "")
            slot = self._slots.pop(name, None) or self._nameless.pop(id(name_or_tool), None)
        tool = slot.tool if slot is not None else name_or_tool
        pending = self._state.untrusted.pop(id(tool), None)
        waiting = self._state.waiting.pop(id(tool), None)
        if waiting is not None:
            waiting.set_result(Registration(pending.origin if pending else "?", None, "unregistered while being read"))
        if slot is None:
            return pending is not None
        self._declarations().forget(slot.tool)
        if name:
            self._removed[name] = text("unavailable_removed", tool=name)
        self._publish()
        return True

    def registrations(self) -> list[Registration]:
        """Every registered tool, offered or not, in registration order."""
        return [
            Registration(s.origin, s.outcome, None)
            if isinstance(s.outcome, ToolInfo)
            else Registration(s.origin, None, s.outcome.reason)
            for s in [*self._slots.values(), *self._nameless.values()]
        ]

    def _publish(self) -> None:
        entries: dict[str, ToolEntry] = {}
        unavailable = dict(self._removed)
        for name, slot in self._slots.items():
            if isinstance(slot.outcome, ToolInfo) and slot.validator is not None:
                entries[name] = ToolEntry(
                    slot.tool, slot.outcome, slot.validator, slot.origin, slot.isolation, slot.placement, slot.serial
                )
            else:
                assert isinstance(slot.outcome, Rejected)
                reason = slot.outcome.reason
                unavailable[name] = text("unavailable_rejected", tool=name, reason=reason)
        published = ToolSet(self._view.current.version + 1, MappingProxyType(entries), MappingProxyType(unavailable))
        self._view.current = published
        self._events.emit(ToolSetChanged(published.version))
