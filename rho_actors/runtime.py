"""The services a system's actors share, as one object (internal).

An :class:`~rho_actors.ActorSystem` builds one :class:`Runtime` and hands it to its
DeclarationActor, registry and LoopActors, instead of each taking every service as its
own constructor argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rho_actors.budgets import ResultBudgets
from rho_actors.declarations import DEFAULT_MAX_DESCRIPTION_CHARS, DEFAULT_MAX_SCHEMA_BYTES, DEFAULT_MAX_SCHEMA_NODES

if TYPE_CHECKING:
    from rho_actors.declaration_actor import UntrustedReads
    from rho_actors.events import EventBus
    from rho_actors.isolation import Isolation
    from rho_actors.otp.names import Names
    from rho_actors.otp.supervisor import ChildStarter
    from rho_actors.otp.threads import ThreadPool
    from rho_actors.otp.timers import Timers
    from rho_actors.registry import ToolSetView
    from rho_actors.sandbox.enclosure import ConfinePolicy
    from rho_actors.telemetry import Telemetry

__all__ = ["Limits", "Runtime"]


@dataclass(frozen=True, slots=True)
class Limits:
    """A system's limits: ``max_output_chars`` caps each result's text (characters);
    ``max_argument_depth`` and ``max_schema_depth`` bound the nesting of call arguments
    and parameter schemas; ``ask_timeout_s`` bounds the host's queries to a loop
    (seconds); ``max_description_chars``, ``max_schema_bytes`` and ``max_schema_nodes``
    bound a declaration's size (see :func:`rho_actors.declarations.check_declaration`)."""

    max_output_chars: int
    max_argument_depth: int
    max_schema_depth: int
    ask_timeout_s: float = 10.0
    max_description_chars: int = DEFAULT_MAX_DESCRIPTION_CHARS
    max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES
    max_schema_nodes: int = DEFAULT_MAX_SCHEMA_NODES

    def declaration_bounds(self) -> dict[str, int]:
        """The keyword arguments of :func:`rho_actors.declarations.check_declaration`."""
        return {"max_schema_depth": self.max_schema_depth, "max_description_chars": self.max_description_chars,
                "max_schema_bytes": self.max_schema_bytes, "max_schema_nodes": self.max_schema_nodes}


@dataclass(frozen=True, slots=True, eq=False)
class Runtime:
    """A system's shared services: ``names`` (the registry of named actors, which follows
    restarts), ``timers``, ``events`` (the event bus), ``tools`` (the published tool set),
    ``calls`` (starts supervised CallActors), ``threads`` (the pool the CallActors and
    LoopActors run on), ``isolations`` by name, ``limits``, ``untrusted``
    (how untrusted declarations are read), ``telemetry`` (OpenTelemetry spans and
    metrics, see :mod:`rho_actors.telemetry`) and ``confine`` (how children running
    untrusted code are confined; ``None``: not at all, only a scrubbed environment) and
    ``budgets`` (the result budgets of turns and sessions, :mod:`rho_actors.budgets`)."""

    names: Names
    timers: Timers
    events: EventBus
    tools: ToolSetView
    calls: ChildStarter
    threads: ThreadPool
    isolations: Mapping[str, Isolation]
    limits: Limits
    untrusted: UntrustedReads
    telemetry: Telemetry
    confine: ConfinePolicy | None = None
    budgets: ResultBudgets = field(default_factory=ResultBudgets)
