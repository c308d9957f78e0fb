"""The services a system's actors share, as one object (internal).

An :class:`~rho_actors.ActorSystem` builds one :class:`Runtime` and hands it to its
DeclarationActor, registry and LoopActors, instead of each taking every service as its
own constructor argument.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tenacity

from rho_actors.budgets import ResultBudgets
from rho_actors.declarations.checks import (
    DEFAULT_MAX_DESCRIPTION_CHARS,
    DEFAULT_MAX_SCHEMA_BYTES,
    DEFAULT_MAX_SCHEMA_NODES,
)
from rho_actors.sandbox import policy_stats

if TYPE_CHECKING:
    from rho_actors.declarations.toolset import ToolSetView
    from rho_actors.events import EventBus
    from rho_actors.governor import Governor
    from rho_actors.isolation import Isolation
    from rho_actors.otp.lazy import LazyStarter
    from rho_actors.otp.names import Names
    from rho_actors.otp.starters import ChildStarter
    from rho_actors.otp.threads import ThreadPool
    from rho_actors.otp.timers import Timers
    from rho_actors.sandbox import ConfinePolicy
    from rho_actors.tasks import TaskRegistry
    from rho_actors.telemetry import Telemetry

__all__ = [
    "DEFAULT_MAX_TIMEOUT_MS", "IDLE_WORKER_BYTES", "Limits", "Runtime", "UntrustedReads", "default_running_cap",
    "default_worker_cap", "fair_shares", "host_memory_bytes",
]

DEFAULT_MAX_TIMEOUT_MS = 600_000
"""The default bound on a tool's declared timeout (milliseconds: 10 minutes): a tool
declaring more is registered with this (DESIGN §5 "Fair shares")."""


@dataclass(frozen=True, slots=True)
class UntrustedReads:
    """How untrusted declarations are read (DESIGN §3): in a throwaway process within
    ``timeout_s`` seconds and ``heap_bytes`` bytes; a read that runs over is tried again
    after each of ``retry_s`` (seconds; default 1, 5 and 30 minutes, as tenacity's
    ``wait_chain`` of ``wait_fixed`` waits), then the tool stays out. ``timeout_s``
    counts from the child's start (the tool's load and declaration code); the start
    itself, the machine's, is bounded by ``start_timeout_s`` (``None``: the start bound's
    default, 10 s or ``RHO_ACTORS_START_TIMEOUT_MS``)."""

    timeout_s: float = 2.0
    start_timeout_s: float | None = None
    heap_bytes: int = 256 * 2**20
    retry_s: tuple[float, ...] = (60.0, 300.0, 1800.0)
    start_method: str = "forkserver"

    def wait(self) -> tenacity.wait.wait_base:
        """The retry schedule as a tenacity wait strategy."""
        return tenacity.wait_chain(*(tenacity.wait_fixed(s) for s in self.retry_s))

    def retry_delay_s(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1-based), in seconds."""
        state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
        state.attempt_number = retry
        return float(self.wait()(state))


@dataclass(frozen=True, slots=True)
class Limits:
    """A system's limits: ``max_output_chars`` caps each result's text (characters);
    ``max_argument_depth`` and ``max_schema_depth`` bound the nesting of call arguments
    and parameter schemas; ``ask_timeout_s`` bounds the host's queries to a loop
    (seconds); ``max_description_chars``, ``max_schema_bytes`` and ``max_schema_nodes``
    bound a declaration's size (see :func:`rho_actors.declarations.checks.check_declaration`);
    ``log_tracebacks``: log a tool's traceback at error level when it raises;
    ``max_timeout_ms`` bounds every tool's declared timeout (milliseconds)."""

    max_output_chars: int
    max_argument_depth: int
    max_schema_depth: int
    ask_timeout_s: float = 10.0
    max_description_chars: int = DEFAULT_MAX_DESCRIPTION_CHARS
    max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES
    max_schema_nodes: int = DEFAULT_MAX_SCHEMA_NODES
    log_tracebacks: bool = True
    max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS

    def declaration_bounds(self) -> dict[str, int]:
        """The keyword arguments of :func:`rho_actors.declarations.checks.check_declaration`."""
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
    ``budgets`` (the result budgets of turns and sessions, :mod:`rho_actors.budgets`);
    ``governor``, the bounds on calls (:mod:`rho_actors.governor`); ``tasks``, the background
    calls (:mod:`rho_actors.tasks`);
    ``loop_turns``, each running LoopActor's :class:`~rho_actors.loop.turns.Turns` by the
    actor's urn (weakly held: a host's :class:`~rho_actors.Loop` finds them there);
    ``sessions``, what starts and stops session subtrees under the system's ``sessions``
    supervisor (``None`` outside a system); ``plans``, each registered tool's call plan by
    tool name, shared by the system's sessions (:mod:`rho_actors.loop.call_plan`)."""

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
    governor: Governor
    tasks: TaskRegistry
    confine: ConfinePolicy | None = None
    budgets: ResultBudgets = field(default_factory=ResultBudgets)
    loop_turns: MutableMapping[str, Any] = field(default_factory=weakref.WeakValueDictionary)
    sessions: LazyStarter | None = None
    plans: MutableMapping[str, Any] = field(default_factory=dict)

    def stats(self) -> dict[str, Any]:
        """What :meth:`rho_actors.ActorSystem.stats` gives: each isolation's counters, the
        bounds, the budgets, the governor's, the background calls' and the confinement."""
        out: dict[str, Any] = {k: v for isolation in self.isolations.values() for k, v in isolation.stats().items()}
        out["max_timeout_ms"] = self.limits.max_timeout_ms
        out["confinement"] = policy_stats(self.confine) if self.confine is not None else {}
        out["bounds"] = self.limits.declaration_bounds()
        out["budgets"] = self.budgets.stats()
        out["governor"] = self.governor.stats()
        out["tasks"] = self.tasks.stats()
        return out


MIN_WORKER_CAP = 32
"""The least default cap on running workers: its half, one session's default share, holds
a turn of 16 parallel calls (the widest a model sends in one turn of the peers'
benchmarks) on a machine of any size."""

IDLE_WORKER_BYTES = 16 * 2**20
"""What one idle worker process costs the host's memory, rounded up (bytes): a confined
worker with its tool loaded measured 11-12 MiB of its own (USS 11.1, PSS 11.7 MiB of an
RSS of 36.5, benchmarks/PROFILE.md §28), plus its cgroup and kernel structures; it also
holds one pid, one thread and one cgroup (``pids_max`` bounds its tree)."""

IDLE_MEMORY_SHARE = 16
"""The default cap lets idle workers take at most 1/``IDLE_MEMORY_SHARE`` of the host's
memory, at :data:`IDLE_WORKER_BYTES` each."""


def host_memory_bytes() -> int:
    """The memory this process may use (bytes): the machine's physical memory, or the
    ``memory.max`` of the cgroup (v2) it runs in when that is lower (a container's bound)."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            bound = f.read().strip()
    except OSError:
        return physical
    return min(physical, int(bound)) if bound.isdigit() else physical


def default_running_cap() -> int:
    """The default ``max_running_workers`` of a system, the most calls running in worker
    processes at once: 4 per core (as ``os.cpu_count()`` counts them), at least
    :data:`MIN_WORKER_CAP`."""
    return max(MIN_WORKER_CAP, 4 * (os.cpu_count() or 1))


def default_worker_cap() -> int:
    """The default ``max_workers`` of a system, the most worker processes alive (running
    or idle): as many idle workers as fit in 1/:data:`IDLE_MEMORY_SHARE` of
    :func:`host_memory_bytes` at :data:`IDLE_WORKER_BYTES` each, and never fewer than
    :func:`default_running_cap` (e.g. 32 on a 2-core, 8 GiB host; 96 on 24 GiB)."""
    return max(default_running_cap(), host_memory_bytes() // (IDLE_MEMORY_SHARE * IDLE_WORKER_BYTES))


def fair_shares(
    cap: int | None, running: int | None, per_session: int | None, threads_per_session: int, max_timeout_ms: int,
) -> tuple[int, int, int]:
    """Check the worker-cap and fair-share settings (DESIGN §5 "Fair shares"); the cap on
    worker processes (``None``: :func:`default_worker_cap`, raised to the cap on running
    workers when that is given higher), the cap on running workers
    (``None``: the cap when it was given, else :func:`default_running_cap`, at most the
    cap) and the per-session share of the running cap (default: half, at least 1), as
    ``(cap, running, share)``. Raises ``ValueError`` naming the bad setting."""
    if cap is None:
        cap = default_worker_cap()
        if running is None:
            running = min(cap, default_running_cap())
        elif type(running) is int:
            cap = max(cap, running)
    elif type(cap) is not int or cap < 1:
        raise ValueError(f"max_workers must be an int >= 1, not {cap!r}")
    running = cap if running is None else running
    if type(running) is not int or not 1 <= running <= cap:
        raise ValueError(f"max_running_workers must be an int within 1..max_workers ({cap}), not {running!r}")
    share = max(1, running // 2) if per_session is None else per_session
    if type(share) is not int or not 1 <= share <= running:
        raise ValueError(
            f"max_workers_per_session must be an int within 1..max_running_workers ({running}), not {share!r}")
    if type(threads_per_session) is not int or threads_per_session < 1:
        raise ValueError(f"abandoned_threads_per_session must be an int >= 1, not {threads_per_session!r}")
    if type(max_timeout_ms) is not int or max_timeout_ms < 1:
        raise ValueError(f"max_timeout_ms must be an int of milliseconds >= 1, not {max_timeout_ms!r}")
    return cap, running, share
