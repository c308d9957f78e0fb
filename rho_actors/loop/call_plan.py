"""Per-tool call plans: what every call of one registered tool is started with, worked
out once per registration instead of on every call, and shared by a system's sessions
(internal; PROFILE §37, §40).

:class:`~rho_actors.loop.turns.Turns` reads the plan of a call's entry when it
dispatches the call (:meth:`CallPlans.of`). A plan is
the entry's isolation (and the time it may take to start a call), its timeout, whether
the tool ever runs in the background (``background=False``: no task questions asked),
whether a call awaited on an event loop runs on that loop, and whether it is
``exclusive``. It is kept by tool name and used only for the very entry it was made of
(``plan.entry is entry``): a tool registered again, withheld, or removed is looked up
first in the tool set a turn reads (:meth:`Turns.submit`), and a new registration is a
new entry, so a kept plan never starts a replaced tool. Nothing in a plan changes while
its entry is registered: the isolations are the runtime's, fixed at its start, so one
plan serves every session of the system (a session's first call of a tool makes none).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING

from rho_actors.declarations.toolset import ToolEntry
from rho_actors.loop.inline import runs_inline

if TYPE_CHECKING:
    from rho_actors.isolation import Isolation

__all__ = ["CallPlan", "CallPlans"]

_KEPT = 1_024  # plans kept per system (all dropped when full: a host registering tools without end)


class CallPlan:
    """What every call of ``entry`` is started with (see the module doc)."""

    __slots__ = ("entry", "exclusive", "inline", "isolation", "name", "plain", "start_bound_s",
                 "timeout_ms")

    def __init__(self, entry: ToolEntry, isolation: Isolation) -> None:
        self.entry = entry
        self.name = entry.info.name
        self.isolation = isolation
        self.start_bound_s = isolation.start_bound_s  # what the isolation may take to start it (a worker)
        self.timeout_ms = entry.info.timeout_ms
        self.plain = entry.info.policy.background is False  # never a task: no task questions asked
        self.inline = runs_inline(entry)  # awaited on an event loop: runs there (an async trusted thread tool)
        self.exclusive = entry.info.concurrency == "exclusive"


class CallPlans:
    """A session's view of the plans, by tool name (each for the entry it was made of):
    ``kept``, the system's (``Runtime.plans``: shared by its sessions; default: its own)."""

    __slots__ = ("_isolations", "_kept")

    def __init__(self, isolations: Mapping[str, Isolation], kept: MutableMapping[str, CallPlan] | None = None) -> None:
        self._isolations = isolations
        # by tool name (a plan is for its ``entry`` only: see :meth:`of`); sessions racing make one each, one kept
        self._kept: MutableMapping[str, CallPlan] = {} if kept is None else kept

    def of(self, entry: ToolEntry) -> CallPlan:
        """The plan of ``entry`` (a registered entry, looked up in the tool set now)."""
        plan = self._kept.get(entry.info.name)
        if plan is not None and plan.entry is entry:
            return plan
        plan = CallPlan(entry, self._isolations[entry.isolation])  # kept in place of its name's last one
        if len(self._kept) >= _KEPT:
            self._kept.clear()
        self._kept[plan.name] = plan
        return plan
