"""A session's call budgets and its repeated-call breaker (DESIGN §4 "The governor"):
what :meth:`~rho_actors.governor.Governor.start` counts first.

:class:`SessionCounts` holds one session's calls, per tool, and per (tool, arguments);
:meth:`SessionCounts.admit` counts a call or says why it is refused
(``budget_exhausted``: ``max_calls_per_session`` or the tool's ``max_calls``;
``repeated_call``: ``max_repeats``). :func:`checked_bounds` checks the bounds a session
sets for itself against the system's, the host's ceiling. Not thread-safe: the governor
holds its lock around :meth:`SessionCounts.admit`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["SessionCounts", "arguments_key", "checked_bounds"]

MAX_REPEAT_KEYS: Final = 4096
"""Distinct (tool, arguments) remembered per session (then forgotten at once)."""


class SessionCounts:
    """A session's counts: its calls, per tool, and per (tool, arguments)."""

    __slots__ = ("calls", "per_tool", "repeats")

    def __init__(self) -> None:
        self.calls = 0
        self.per_tool: dict[str, int] = {}
        self.repeats: dict[tuple[str, str], int] = {}

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
        if key is not None and max_repeats is not None and self.repeats.get(key, 0) >= max_repeats:
            return "repeated_call", dict(count=max_repeats)
        self.calls += 1
        self.per_tool[name] = self.per_tool.get(name, 0) + 1
        if key is not None:
            if len(self.repeats) >= MAX_REPEAT_KEYS:
                self.repeats.clear()
            self.repeats[key] = self.repeats.get(key, 0) + 1
        return None


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


def arguments_key(args: Mapping[str, Any]) -> str:
    """The arguments as canonical JSON text (keys sorted): equal arguments, equal keys."""
    try:
        return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(sorted(args.items(), key=lambda kv: kv[0]))
