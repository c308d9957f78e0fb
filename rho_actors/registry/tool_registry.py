"""The ToolRegistry actor: registered tools, and the tool set loops read (DESIGN §6: permanent).

Its state lives in a :class:`RegistryState` the system keeps (as an OTP process keeps
an ETS table with an heir), so a registry restarted by its supervisor loses no tool.

Registration asks the DeclarationActor for the tool's checked declaration, refuses a
second tool with a name already taken (both origins named: no last-writer-wins) except
that the host's own registration takes a name from a tool a source serves (DESIGN §3
"Names": the source's tool is evicted, logged and announced), and
publishes a new immutable :class:`ToolSet` (announced as a
:class:`~rho_actors.events.ToolSetChanged` event). Loops read the current set without a
message round trip, the way Erlang code reads ``persistent_term``: the registry is the
only writer and every published set is frozen.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from loguru import logger

from rho_actors.declarations.arguments import make_validator
from rho_actors.declarations.checks import Rejected, describe_origin
from rho_actors.declarations.linear import prepare_quick
from rho_actors.declarations.toolset import IsolationName, Placement, ToolEntry, ToolSet, plain_copy
from rho_actors.errors import RhoError
from rho_actors.events import DeclarationEvent, ToolSetChanged
from rho_actors.otp.actor import Actor
from rho_actors.registry.declaration_actor import DECLARATIONS, Checked, ReadUntrusted
from rho_actors.results import text
from rho_actors.tool import ToolInfo

if TYPE_CHECKING:
    import pykka

    from rho_actors.runtime import Runtime

__all__ = [
    "DuplicateToolError",
    "Registration",
    "RegistryState",
    "ToolRegistry",
]

_ASK_TIMEOUT_S = 60.0
ASK_PER_TOOL_S = 0.01  # more time for a batch of register_many, per tool
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


@dataclass(slots=True)
class _Slot:
    tool: Any
    origin: str
    outcome: ToolInfo | Rejected
    validator: Draft202012Validator | None
    isolation: IsolationName
    placement: Placement = field(default_factory=Placement)
    source: str | None = None  # the source serving it; None: the host's own registration
    serial: int = 0


@dataclass(frozen=True, slots=True)
class _Untrusted:
    tool: Any
    origin: str
    isolation: IsolationName
    placement: Placement = field(default_factory=Placement)
    source: str | None = None


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
        # indexes derived from the slots (rebuilt here after a restart, so they never
        # disagree with the durable state): what is offered, why a slot is not, and
        # the name each registered tool holds (by id: the slot keeps the tool alive)
        self._entries: dict[str, ToolEntry] = {}
        self._rejected: dict[str, str] = {}
        self._names_of: dict[int, str] = {}
        self._reindex()

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
        placement: Placement | None = None, source: str | None = None,
    ) -> Registration | concurrent.futures.Future[Registration]:
        """Check and add ``tool``; registering the same object again re-reads it.

        ``source`` names the source serving the tool (``None``: the host's own
        registration). A host registration takes its name from a tool a source serves
        (that tool is evicted: unregistered, logged, a ``DeclarationEvent("evicted")``);
        any other clash is refused. A trusted tool is read now and its :class:`Registration` returned; raises
        :class:`DuplicateToolError` when another tool holds its name. An untrusted tool
        is read in a throwaway process by the DeclarationActor: this returns a future of
        its Registration (or of the DuplicateToolError). ``isolation`` defaults to
        ``"process"`` for an untrusted tool, else ``"thread"``; ``placement`` is kept with
        the tool's entry (see :func:`rho_actors.declarations.toolset.make_placement`).
        """
        origin = origin or describe_origin(tool, trusted=not untrusted)
        isolation = isolation or ("process" if untrusted else "thread")
        if not untrusted:
            outcome = self._declarations().check(tool, fresh=True).get(timeout=_ASK_TIMEOUT_S)
            registration = self._apply(tool, origin, outcome, isolation, placement, source)
            self._publish()
            return registration
        self._state.untrusted[id(tool)] = _Untrusted(tool, origin, isolation, placement or Placement(True), source)
        waiting = self._state.waiting.get(id(tool))
        if waiting is None or waiting.done():
            waiting = concurrent.futures.Future()
            self._state.waiting[id(tool)] = waiting
        if not self._names.deliver(DECLARATIONS, ReadUntrusted(tool), patience_s=_ASK_TIMEOUT_S):
            self._state.waiting.pop(id(tool), None)
            self._state.untrusted.pop(id(tool), None)
            raise RuntimeError("the DeclarationActor did not take the read (the system is stopping?)")
        return waiting

    def register_many(
        self, tools: list[Any], isolation: IsolationName | None = None, placement: Placement | None = None,
        source: str | None = None, origins: list[str] | None = None,
    ) -> list[Registration]:
        """Check and add the trusted ``tools`` (a list, in order) as one change: their
        declarations are read in one ask of the DeclarationActor, the name rules of
        :meth:`register` are applied to each in turn (a later tool of the batch sees the
        earlier ones), and one :class:`ToolSet` is published. All or nothing: raises
        :class:`DuplicateToolError` naming the first clash (with a registered tool or
        within the batch) before any tool is added. ``origins``: where each tool comes
        from in messages (default: its module, qualified name, file and line). Returns
        one :class:`Registration` per tool, in order."""
        isolation = isolation or "thread"
        origins = origins or [describe_origin(tool) for tool in tools]
        timeout_s = _ASK_TIMEOUT_S + len(tools) * ASK_PER_TOOL_S
        outcomes: list[ToolInfo | Rejected] = self._declarations().check_many(tools, fresh=True).get(
            timeout=timeout_s
        )
        # the names as the batch leaves them, so far: (tool, origin, source), or None once freed
        holders: dict[str, tuple[Any, str, str | None] | None] = {}
        taken: dict[int, str] = {}  # the name each tool of the batch takes, by id
        for index, (tool, origin, outcome) in enumerate(zip(tools, origins, outcomes, strict=True)):
            name = outcome.name
            if name is None:
                continue
            if name in holders:
                held = holders[name]
            else:
                slot = self._slots.get(name)
                held = (slot.tool, slot.origin, slot.source) if slot is not None else None
            if held is not None and _clash(held[0], held[2], tool, source) == "refuse":
                raise DuplicateToolError(
                    f"{_refusal(name, held[1], origin)} (tool {index} of the batch: none of it is registered)"
                )
            old = taken.get(id(tool), self._names_of.get(id(tool)))
            if old is not None and old != name:  # renamed: its old name is freed
                holders[old] = None
            holders[name] = (tool, origin, source)
            taken[id(tool)] = name
        registrations = [
            self._apply(tool, origin, outcome, isolation, placement, source)
            for tool, origin, outcome in zip(tools, origins, outcomes, strict=True)
        ]
        self._publish()
        return registrations

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Checked):
            entry = self._state.untrusted.get(id(message.tool))
            if entry is None or entry.tool is not message.tool:
                return None  # unregistered while it was read
            waiting = self._state.waiting.pop(id(message.tool), None)
            try:
                registration = self._apply(entry.tool, entry.origin, message.outcome, entry.isolation, entry.placement,
                                           entry.source)
                self._publish()
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
        placement: Placement | None = None, source: str | None = None,
    ) -> Registration:
        """Add one checked tool to the slots and indexes (the caller publishes). Raises
        :class:`DuplicateToolError` before changing anything."""
        placement = placement or Placement()
        name = outcome.name
        if name is None:
            assert isinstance(outcome, Rejected)
            self._nameless[id(tool)] = _Slot(tool, origin, outcome, None, isolation, placement, source)
            return Registration(origin, None, outcome.reason)
        held = self._slots.get(name)
        clash = _clash(held.tool, held.source, tool, source) if held is not None else None
        if clash == "refuse":
            assert held is not None
            raise DuplicateToolError(_refusal(name, held.origin, origin))
        if clash == "evict":
            assert held is not None
            self._evict(name, held, origin)
        self._nameless.pop(id(tool), None)
        bound = self._max_timeout_ms
        if isinstance(outcome, ToolInfo) and outcome.timeout_ms > bound:
            logger.warning("tool {!r} ({}) declares timeout_ms={}, above this system's max_timeout_ms={}: its calls "
                           "get {} ms", name, origin, outcome.timeout_ms, bound, bound)
            outcome = dataclasses.replace(outcome, timeout_ms=bound)
        validator = make_validator(plain_copy(outcome.parameter_schema)) if isinstance(outcome, ToolInfo) else None
        if validator is not None:
            prepare_quick(validator)  # here, not on the tool's first call
        old = self._names_of.get(id(tool))
        if old is not None and old != name:  # the same tool re-registered under a new name: one name only
            self._drop(old)
            self._removed[old] = text("unavailable_renamed", tool=old, new=name)
        self._state.serials += 1
        slot = _Slot(tool, origin, outcome, validator, isolation, placement, source, self._state.serials)
        was_offered = name in self._entries
        self._slots[name] = slot
        self._names_of[id(tool)] = name
        self._removed.pop(name, None)
        if held is not None and held.tool is tool and not was_offered and isinstance(outcome, ToolInfo):
            self._reindex()  # a left-out name now offered keeps its place in registration order
        else:
            self._index(name, slot)
        if isinstance(outcome, ToolInfo):
            return Registration(origin, outcome)
        return Registration(origin, None, outcome.reason)

    def _index(self, name: str, slot: _Slot) -> None:
        """Put ``slot`` (now held under ``name``) in the offered or left-out index."""
        if isinstance(slot.outcome, ToolInfo) and slot.validator is not None:
            self._rejected.pop(name, None)
            self._entries[name] = ToolEntry(slot.tool, slot.outcome, slot.validator, slot.origin, slot.isolation,
                                            slot.placement, slot.serial)
        else:
            assert isinstance(slot.outcome, Rejected)
            self._entries.pop(name, None)
            self._rejected[name] = text("unavailable_rejected", tool=name, reason=slot.outcome.reason)

    def _reindex(self) -> None:
        """Rebuild the indexes from the slots (at start, and when order must be kept)."""
        self._entries.clear()
        self._rejected.clear()
        self._names_of.clear()
        for name, slot in self._slots.items():
            self._names_of[id(slot.tool)] = name
            self._index(name, slot)

    def _drop(self, name: str) -> _Slot | None:
        """Remove the slot named ``name`` and its index entries; returns it (or None)."""
        slot = self._slots.pop(name, None)
        self._entries.pop(name, None)
        self._rejected.pop(name, None)
        if slot is not None and self._names_of.get(id(slot.tool)) == name:
            del self._names_of[id(slot.tool)]
        return slot

    def _evict(self, name: str, held: _Slot, origin: str) -> None:
        """The host's registration (``origin``) takes ``name`` from a source's tool."""
        self._drop(name)
        self._declarations().forget(held.tool).get(timeout=_ASK_TIMEOUT_S)
        reason = (f"tool name {name!r} is taken by the host's own registration of {origin}: "
                  f"{held.origin} gave it up (a source's tool yields its name to the host's)")
        logger.warning("{}", reason)
        self._events.emit(DeclarationEvent("evicted", held.origin, name, reason))

    def unregister(self, name_or_tool: Any, reason: str | None = None) -> bool:
        """Remove a tool by name or by object; a call naming it then gets ``reason`` (default:
        it was unregistered). Returns whether anything was removed."""
        if isinstance(name_or_tool, str):
            name = name_or_tool
            slot = self._drop(name)
        else:
            name = self._names_of.get(id(name_or_tool), "")
            held = self._slots.get(name)
            slot = self._drop(name) if held is not None and held.tool is name_or_tool else None
            if slot is None:
                name = ""
                slot = self._nameless.pop(id(name_or_tool), None)
        tool = slot.tool if slot is not None else name_or_tool
        pending = self._state.untrusted.pop(id(tool), None)
        waiting = self._state.waiting.pop(id(tool), None)
        if waiting is not None:
            waiting.set_result(Registration(pending.origin if pending else "?", None, "unregistered while being read"))
        if slot is None:
            return pending is not None
        # waited for: once unregister returns, no checked declaration of the tool is left in this system
        # (timeout_ms, concurrency and declaration of an untrusted tool answer from the live systems' caches)
        self._declarations().forget(slot.tool).get(timeout=_ASK_TIMEOUT_S)
        if name:
            self._removed[name] = reason or text("unavailable_removed", tool=name)
        self._publish()
        return True

    def set_removed_reason(self, name: str, reason: str) -> bool:
        """The text a call naming ``name`` gets, when it was removed and is not registered
        again; nothing is removed, a registered tool is left as it is. Returns whether the
        text was set."""
        if name not in self._removed or name in self._slots:
            return False
        self._removed[name] = reason
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
        """Publish the indexes as a new frozen :class:`ToolSet` (copies of two dicts:
        no per-tool work) and announce it."""
        unavailable = {**self._removed, **self._rejected}
        published = ToolSet(self._view.current.version + 1, MappingProxyType(dict(self._entries)),
                            MappingProxyType(unavailable))
        self._view.current = published
        self._events.emit(ToolSetChanged(published.version))


def _clash(held: Any, held_source: str | None, tool: Any, source: str | None) -> str | None:
    """What registering ``tool`` (served by ``source``; ``None``: the host's own) does to
    the tool holding its name (``held``, served by ``held_source``): ``None`` (the same
    tool: re-read), ``"evict"`` (the host takes a source's name) or ``"refuse"``."""
    if held is tool:
        return None
    return "evict" if held_source is not None and source is None else "refuse"


def _refusal(name: str, held_origin: str, origin: str) -> str:
    return (f"tool name {name!r} is already registered by {held_origin}; refused {origin} "
            f"(unregister the first to replace it)")
