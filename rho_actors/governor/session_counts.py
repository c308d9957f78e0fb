"""A session's call budgets and its repeated-call breaker (DESIGN §4 "The governor"):
what :meth:`~rho_actors.governor.Governor.start` counts first.

:class:`SessionCounts` holds one session's calls, per tool, and per (tool, arguments);
:meth:`SessionCounts.admit` counts a call or says why it is refused
(``budget_exhausted``: ``max_calls_per_session`` or the tool's ``max_calls``;
``repeated_call``: ``max_repeats``). :class:`SessionBudgets` keeps every session's
counts and bounds: :func:`checked_bounds` checks the bounds a session sets for itself
against the system's, the host's ceiling.

The budgets count the calls that were started (handed to their isolation): a call is
counted as it is admitted, which reserves its place under the cap (calls racing never
pass it), and a call answered before it started (``rate_limited``, ``unavailable``,
cancelled while it waited, ``not_started`` as the system stops) gives it back
(:meth:`SessionBudgets.give_back`), so the breaker's "it already ran N times" holds too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol, TypeAlias

from loguru import logger

__all__ = ["Reserved", "Reserving", "SessionBudgets", "SessionCounts", "arguments_key", "checked_bounds",
           "with_defaults"]

MAX_REPEAT_KEYS: Final = 4096
"""Distinct (tool, arguments) below ``max_repeats`` remembered per session: past it, the
least recently used of them is forgotten (a key at ``max_repeats`` never is)."""

MAX_SATURATED_KEYS: Final = 65_536
"""Distinct (tool, arguments) at ``max_repeats`` remembered per session (each refuses its
next call for the session's life): once this many are held, a call that would make
another is refused (``budget_exhausted``, nothing forgotten). Keys are sha256 digests, so
each costs about 200 bytes whatever its arguments' size."""


class SessionCounts:
    """A session's counts: its calls, per tool, and per (tool, arguments).

    The repeat breaker's keys: ``saturated`` holds those that reached ``max_repeats``
    (they refuse every next call and are never forgotten), ``repeats`` the others, least
    recently used first, at most :data:`MAX_REPEAT_KEYS` (the oldest is forgotten: a call
    that ran fewer than ``max_repeats`` times may run that many times again once
    forgotten, never more often in a row). Once :data:`MAX_SATURATED_KEYS` keys are
    saturated, a call that would saturate another is refused, ``budget_exhausted``
    (``setting="max_repeats"``), so memory stays bounded and no saturated key is dropped."""

    __slots__ = ("calls", "per_tool", "repeats", "saturated")

    def __init__(self) -> None:
        self.calls = 0
        self.per_tool: dict[str, int] = {}
        self.repeats: OrderedDict[tuple[str, str], int] = OrderedDict()
        self.saturated: dict[tuple[str, str], int] = {}

    def admit(self, name: str, key: tuple[str, str] | None, max_calls: int | None, tool_max_calls: int | None,
              max_repeats: int | None) -> tuple[str, dict[str, Any]] | None:
        """Count a call of tool ``name`` (``key``: its (tool, arguments), when repeats are
        counted), or its refusal: ``(error_kind, fields)``, nothing counted."""
        if max_calls is not None and self.calls >= max_calls:
            return "budget_exhausted", dict(scope="this session", budget=max_calls, what="tool calls",
                                            setting="max_calls_per_session")
        if tool_max_calls is not None and self.per_tool.get(name, 0) >= tool_max_calls:
            return "budget_exhausted", dict(scope="this session", budget=tool_max_calls,
                                            what=f"calls of tool {name!r}", setting="max_calls")
        count = 0
        if key is not None:
            count = self.saturated.get(key) or self.repeats.get(key, 0)
            if max_repeats is not None and count >= max_repeats:
                return "repeated_call", dict(count=max_repeats)
            if max_repeats is not None and count + 1 >= max_repeats and len(self.saturated) >= MAX_SATURATED_KEYS:
                logger.warning("a session holds {} calls at max_repeats={}: tool {!r} refused a new one",
                               len(self.saturated), max_repeats, name)
                return "budget_exhausted", dict(scope="this session", budget=MAX_SATURATED_KEYS,
                                                what="distinct calls at max_repeats the breaker remembers",
                                                setting="max_repeats")
        self.calls += 1
        self.per_tool[name] = self.per_tool.get(name, 0) + 1
        if key is not None:
            self._count(key, count + 1, max_repeats)
        return None

    def ran(self, name: str, key: tuple[str, str] | None, max_repeats: int | None) -> None:
        """Count a call that ran before these counts were made (read back), past any bound."""
        self.calls += 1
        self.per_tool[name] = self.per_tool.get(name, 0) + 1
        if key is not None:
            self._count(key, (self.saturated.get(key) or self.repeats.get(key, 0)) + 1, max_repeats)

    def _count(self, key: tuple[str, str], count: int, max_repeats: int | None) -> None:
        """Set ``key``'s count: saturated at ``max_repeats``, else the most recently used."""
        if max_repeats is not None and count >= max_repeats:
            self.repeats.pop(key, None)
            self.saturated[key] = count
            return
        self.saturated.pop(key, None)
        self.repeats[key] = count
        self.repeats.move_to_end(key)
        if len(self.repeats) > MAX_REPEAT_KEYS:
            self.repeats.popitem(last=False)

    def give_back(self, name: str, key: tuple[str, str] | None) -> None:
        """Uncount a call :meth:`admit` counted that never started."""
        self.calls -= 1
        self.per_tool[name] -= 1
        if key is not None:
            count = self.saturated.pop(key, None) or self.repeats.pop(key, 0)  # (0: forgotten since)
            if count > 1:
                self.repeats[key] = count - 1  # below max_repeats now; most recently used
                if len(self.repeats) > MAX_REPEAT_KEYS:
                    self.repeats.popitem(last=False)


Reserved: TypeAlias = "tuple[SessionCounts, str, tuple[str, str] | None]"
"""A call's counts, reserved as it was admitted: its session's, its tool and its (tool,
arguments) key."""


class Reserving(Protocol):
    """What holds a call's :data:`Reserved` counts until it starts (it drops them then)
    or :meth:`SessionBudgets.give_back` gives them back (once)."""

    counted: Reserved | None


class SessionBudgets:
    """Every session's counts and bounds (``max_calls_per_session``, ``max_repeats``):
    the system's, the host's ceiling, or a session's own (:meth:`bound`). Thread-safe
    (its own lock, taken inside the governor's or alone, never around it)."""

    def __init__(self, max_calls_per_session: int | None, max_repeats: int | None) -> None:
        self.lock = threading.Lock()
        self.system = (max_calls_per_session, max_repeats)
        # every session's calls counted (else those of a session in bounds: Governor.start looks)
        self.everyone = max_calls_per_session is not None or max_repeats is not None
        self.bounds: dict[str, tuple[int | None, int | None]] = {}  # a session's own (max_calls, max_repeats)
        self.sessions: dict[str, SessionCounts] = {}

    def admit(self, session: str, name: str, args: Mapping[str, Any], tool_max_calls: int | None,
              schema: Mapping[str, Any] | None = None) -> tuple[tuple[str, dict[str, Any]] | None, Reserved | None]:
        """Count a call of tool ``name`` with ``args`` in ``session``: ``(None, reserved)``,
        or its refusal, nothing counted: ``((error_kind, fields), None)``. ``schema``: the
        tool's parameters' JSON Schema, whose ``default`` values fill the arguments
        left out, nested objects' too (:func:`with_defaults`), before a repeat is looked
        for (a call that writes a default out repeats the one that left it to its default)."""
        max_calls, max_repeats = self.bounds.get(session) or self.system
        key = (name, _digest(arguments_key(with_defaults(args, schema)))) if max_repeats is not None else None
        with self.lock:
            counts = self.sessions.get(session)
            if counts is None:
                counts = self.sessions[session] = SessionCounts()
            refusal = counts.admit(name, key, max_calls, tool_max_calls, max_repeats)
        return (None, (counts, name, key)) if refusal is None else (refusal, None)

    def counts(self, session: str) -> bool:
        """Whether ``session``'s calls are counted by its bounds (the system's or its own)."""
        return self.everyone or session in self.bounds

    def has_counts(self, session: str) -> bool:
        """Whether ``session`` has counts (its loop counted calls, or was given them)."""
        return session in self.sessions

    def restore(self, session: str, calls: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any] | None]]) -> None:
        """Give ``session`` (without counts yet) the counts of ``calls`` that started
        before its loop did: ``(tool, arguments, its schema)`` each (:mod:`.recount`),
        counted past any bound (they ran)."""
        max_repeats = (self.bounds.get(session) or self.system)[1]
        counts = SessionCounts()
        for name, args, schema in calls:
            key = (name, _digest(arguments_key(with_defaults(args, schema)))) if max_repeats is not None else None
            counts.ran(name, key, max_repeats)
        with self.lock:
            self.sessions.setdefault(session, counts)

    def give_back(self, holder: Reserving) -> None:
        """Give back the counts ``holder`` holds of a call that never started (nothing
        if given back already)."""
        with self.lock:
            reserved, holder.counted = holder.counted, None
            if reserved is not None:
                reserved[0].give_back(reserved[1], reserved[2])

    def session_bounds(self, max_calls_per_session: Any = None, max_repeats: Any = None,
                       ) -> tuple[int | None, int | None] | None:
        """A session's own ``max_calls_per_session`` and ``max_repeats`` checked against the
        system's, the host's ceiling: each an ``int`` >= 1 or ``None`` (the system's), at
        most the system's where it has one. Returns the bounds in force for the session
        (``None`` when it sets neither). Raises ``TypeError``/``ValueError`` naming the bad one."""
        if max_calls_per_session is None and max_repeats is None:
            return None
        return checked_bounds({"max_calls_per_session": self.system[0], "max_repeats": self.system[1]},
                              max_calls_per_session, max_repeats)

    def bound(self, session: str, bounds: tuple[int | None, int | None] | None) -> None:
        """Give ``session`` its own bounds (from :meth:`session_bounds`; ``None``: the
        system's) until :meth:`forget`."""
        with self.lock:
            if bounds is None:
                self.bounds.pop(session, None)
            else:
                self.bounds[session] = bounds

    def bounded(self, session: str, bounds: tuple[int | None, int | None] | None,
                start: Callable[[], Any]) -> Callable[[], Any]:
        """``start`` (a session's loop's, at each start and restart) giving ``session`` its
        ``bounds`` first (:meth:`bound`; a loop's stop forgets them); ``start`` for ``None``."""
        return start if bounds is None else functools.partial(self._start_bounded, session, bounds, start)

    def _start_bounded(self, session: str, bounds: tuple[int | None, int | None], start: Callable[[], Any]) -> Any:
        self.bound(session, bounds)
        return start()

    def forget(self, session: str) -> None:
        """The session ended: drop its counts and its own bounds."""
        with self.lock:
            self.sessions.pop(session, None)
            self.bounds.pop(session, None)


def checked_bounds(system: Mapping[str, int | None], max_calls_per_session: Any, max_repeats: Any,
                   ) -> tuple[int | None, int | None]:
    """A session's own ``max_calls_per_session`` and ``max_repeats`` checked against
    ``system``'s (the host's ceiling, by name): each an ``int`` >= 1 or ``None`` (the
    system's), at most the system's where it has one. Returns the bounds in force.
    Raises ``TypeError``/``ValueError`` naming the bad one."""
    bounds = []
    for name, value in (("max_calls_per_session", max_calls_per_session), ("max_repeats", max_repeats)):
        ceiling = system[name]
        if value is None:
            bounds.append(ceiling)
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int >= 1 or None, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be an int >= 1 or None, got {value}")
        if ceiling is not None and value > ceiling:
            raise ValueError(f"{name}={value} is looser than the system's {name}={ceiling} (GovernorSettings): "
                             "a session may only tighten the host's bounds")
        bounds.append(value)
    return bounds[0], bounds[1]


MAX_DEFAULTS_DEPTH: Final = 64
"""How deep :func:`with_defaults` fills nested objects' defaults (arguments' JSON is
parsed to a bounded depth too): deeper objects are keyed as written."""
MAX_DEFAULTS_NODES: Final = 4096
"""How many objects one call's default filling visits at most (past it, the rest is keyed as written)."""


def with_defaults(args: Mapping[str, Any], schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``args`` with each property ``schema`` gives a ``default`` for and ``args`` leaves
    out set to it (JSON Schema's ``default``, as the tool's own signature fills it), at
    the top level and in each object value ``args`` holds whose schema has
    ``properties`` (to :data:`MAX_DEFAULTS_DEPTH`): ``{"options": {}}`` and
    ``{"options": {"currency": "EUR"}}`` are one call when ``currency`` defaults to
    ``"EUR"``. A local ``$ref`` (``#/$defs/...``, ``#/definitions/...``: pydantic's
    nested models) is followed; any other leaves only the keywords beside it (a
    ``default`` there). At most :data:`MAX_DEFAULTS_NODES` objects are visited in all
    (the rest keyed as written). ``args`` itself when nothing is
    left out (no copy)."""
    if schema is None:
        return args
    filled = _filled(args, schema, schema, MAX_DEFAULTS_DEPTH, [MAX_DEFAULTS_NODES])
    return filled if isinstance(filled, Mapping) else args


def _filled(value: Any, spec: Any, root: Mapping[str, Any], depth: int, nodes: list[int]) -> Any:
    """``value`` (an object) with the defaults of ``spec``'s properties it leaves out,
    and its object values filled the same way; ``value`` itself when nothing changed.
    ``nodes``: the objects the whole fill may still visit (a schema whose defaults refer
    to itself twice would otherwise make 2**depth of them)."""
    spec = _resolved(spec, root)
    nodes[0] -= 1
    if depth <= 0 or nodes[0] < 0 or not isinstance(value, Mapping) or spec is None:
        return value
    properties = spec.get("properties")
    if not isinstance(properties, Mapping):
        return value
    out: dict[str, Any] | None = None
    for name, given in properties.items():
        prop = _resolved(given, root)
        if prop is None:
            continue
        if name in value:
            item = value[name]
            inner = _filled(item, prop, root, depth - 1, nodes) if isinstance(item, Mapping) else item
        elif "default" in prop:
            inner = _filled(prop["default"], prop, root, depth - 1, nodes)
        else:
            continue
        if name not in value or inner is not value[name]:
            if out is None:
                out = dict(value)
            out[name] = inner
    return value if out is None else out


def _resolved(spec: Any, root: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``spec`` (a schema) with its local ``$ref`` followed (a few hops at most); a
    ``$ref`` that cannot be followed (another document's, OpenAPI's, a cycle) leaves the
    keywords beside it (a ``default`` there still fills); ``None`` when nothing is left."""
    beside: dict[str, Any] = {}  # a $ref's siblings (pydantic's "default" beside it) win over its target's
    for _ in range(8):
        if not isinstance(spec, Mapping):
            return beside or None
        ref = spec.get("$ref")
        if not isinstance(ref, str):
            return {**spec, **beside} if beside else spec
        beside = {**{k: v for k, v in spec.items() if k != "$ref"}, **beside}
        parts = ref.split("/")
        if len(parts) != 3 or parts[0] != "#" or parts[1] not in ("$defs", "definitions"):
            return beside or None
        defs = root.get(parts[1])
        spec = defs.get(parts[2]) if isinstance(defs, Mapping) else None
    return beside or None


def _digest(text: str) -> str:
    """A repeat key's arguments, kept as their sha256 (its size bounded)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def arguments_key(args: Mapping[str, Any]) -> str:
    """The arguments as canonical JSON text (keys sorted, each integral number written as
    an integer): arguments JSON holds equal, equal keys. ``1`` and ``1.0`` are one number
    in JSON (and JSON Schema), at any depth; ``true`` is not ``1`` (JSON's booleans are no
    numbers, whatever Python's ``True == 1`` says: ``json.dumps`` writes them apart)."""
    try:
        text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(sorted(_numbers(dict(args)).items(), key=lambda kv: kv[0]))
    if ".0" not in text and "e+" not in text:  # an integral float is written "1.0" or "1e+16": none here
        return text
    canonical = _numbers(args)
    return text if canonical is args else json.dumps(canonical, sort_keys=True, separators=(",", ":"),
                                                      ensure_ascii=False)


def _numbers(value: Any) -> Any:
    """``value`` with each integral float (not ``inf``, ``nan``) as the ``int`` it equals,
    at any depth of its dicts and lists; ``value`` itself when it has none (no copy)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        out: Any = None
        for name, item in value.items():
            canonical = _numbers(item)
            if canonical is not item:
                if out is None:
                    out = dict(value)
                out[name] = canonical
        return value if out is None else out
    if isinstance(value, (list, tuple)):
        items = [_numbers(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
