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
import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from loguru import logger

from rho_actors.declarations.arguments import make_validator
from rho_actors.declarations.checks import Rejected, describe_origin
from rho_actors.declarations.toolset import IsolationName, Placement, ToolEntry, ToolSet
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
            return self._apply(tool, origin, outcome, isolation, placement, source)
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

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Checked):
            entry = self._state.untrusted.get(id(message.tool))
            if entry is None or entry.tool is not message.tool:
                return None  # unregistered while it was read
            waiting = self._state.waiting.pop(id(message.tool), None)
            try:
                registration = self._apply(entry.tool, entry.origin, message.outcome, entry.isolation, entry.placement,
                                           entry.source)
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
        placement = placement or Placement()
        name = outcome.name
        if name is None:
            assert isinstance(outcome, Rejected)
            self._nameless[id(tool)] = _Slot(tool, origin, outcome, None, isolation, placement, source)
            return Registration(origin, None, outcome.reason)
        held = self._slots.get(name)
        if held is not None and held.tool is not tool and held.source is not None and source is None:
            self._evict(name, held, origin)
        elif held is not None and held.tool is not tool:
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
        self._slots[name] = _Slot(tool, origin, outcome, validator, isolation, placement, source, self._state.serials)
        self._removed.pop(name, None)
        self._publish()
        if isinstance(outcome, ToolInfo):
            return Registration(origin, outcome)
        return Registration(origin, None, outcome.reason)

    def _evict(self, name: str, held: _Slot, origin: str) -> None:
        """The host's registration (``origin``) takes ``name`` from a source's tool."""
        del self._slots[name]
        self._declarations().forget(held.tool)
        reason = (f"tool name {name!r} is taken by the host's own registration of {origin}: "
                  f"{held.origin} gave it up (a source's tool yields its name to the host's)")
        logger.warning("{}", reason)
        self._events.emit(DeclarationEvent("evicted", held.origin, name, reason))

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
