"""The :class:`Isolation` interface: where and how a call runs (DESIGN §5).

An isolation starts a call with its deadline and owns that deadline: whatever the tool
does, the call's ``reply`` gets a result by the deadline (a ``timeout`` error at the
latest), and a result that comes later is still handed to ``reply`` (the loop reports
it as ``late``). A call whose deadline passed is ``timeout``, whoever answers first:
its :class:`rho_actors.isolation.call.Answer` replaces a result settled past the
deadline by the ``timeout`` result. The isolation can cancel a running call, report counters, and is
opened and shut down with its system.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rho_actors.sandbox import DEFAULT_START_TIMEOUT_MS, ConfinePolicy, WorkerCall

if TYPE_CHECKING:
    from rho_actors.declarations.toolset import ToolSetView
    from rho_actors.events import EventBus
    from rho_actors.isolation.call import CallSpec
    from rho_actors.otp.starters import ChildStarter
    from rho_actors.otp.threads import ThreadPool
    from rho_actors.otp.timers import Timers

__all__ = ["DEFAULT_START_TIMEOUT_MS", "Isolation", "IsolationServices", "RunningCall", "worker_call"]


def worker_call(
    call: CallSpec, version: object = None, deps: Mapping[str, Any] | None = None, start_by: float | None = None,
) -> WorkerCall:
    """``call`` as the one value another process's isolation takes (a worker pool's
    :meth:`~rho_actors.sandbox.WorkerPool.run_call`, a Ray task): its fields as they are,
    ``version`` the tool's (its registry entry: made anew by each registration, so a
    re-registered ``@tool`` is pickled anew), ``deps`` an untrusted tool's registered
    plain ``deps`` (``None``: a trusted tool, whose ctx's ``deps`` travel), ``start_by``
    when it must have reached a worker (see :class:`~rho_actors.sandbox.WorkerCall`). What
    of its ctx crosses is cut by :func:`rho_actors.sandbox.call_request`, the one place."""
    return WorkerCall(call.call_id, call.name, call.tool, call.args, call.ctx, call.dispatched, call.deadline,
                      call.timeout_ms, call.max_output_chars, call.cancel, call.context, version, deps, start_by)


@dataclass(frozen=True, slots=True)
class IsolationServices:
    """What an isolation gets from its system: ``calls`` starts the supervised CallActor
    a call runs in (its waiting thread); ``timers``, the system's timer service; the bounds of
    worker processes: ``warm_workers`` idle workers, ``heap_bytes`` of memory for each
    untrusted worker's tree and ``process_heap_bytes`` for each trusted one's (bytes),
    and the ``start_method`` (``"forkserver"`` or ``"spawn"``); ``max_workers``,
    the cap on worker processes of the whole system (running or idle),
    ``max_running_workers`` the most calls running in them at once (``None``:
    ``max_workers``), ``max_workers_per_session`` the most of those one session's calls
    hold at once (``None``: all of them);
    ``confine``, how untrusted workers
    are confined; ``worker_idle_s``, how long an idle scoped worker is kept (seconds);
    ``tools``, the published tool set (a call's tool entry says whether it is untrusted);
    ``events``, where isolations report; ``threads_per_tool`` (per tool and session),
    ``threads_per_session`` and ``threads_total``, the caps on abandoned threads of
    thread calls; ``ray``, how to reach Ray (``None``: a
    local Ray, started on the first ``ray`` call; see
    :class:`rho_actors.isolation.ray_tasks.RayRuntime`); ``threads``, the system's pool of
    reused threads that ``thread`` calls run on (``None``: the isolation keeps its own);
    ``start_timeout_ms``, how long a ``process`` call may wait for a worker."""

    calls: ChildStarter
    timers: Timers
    warm_workers: int = 2
    heap_bytes: int = 256 * 2**20
    process_heap_bytes: int = 256 * 2**20
    start_method: str = "forkserver"
    max_workers: int = 8
    confine: ConfinePolicy | None = None
    worker_idle_s: float = 30.0
    tools: ToolSetView | None = None
    events: EventBus | None = None
    threads_per_tool: int = 8
    threads_total: int = 64
    ray: Mapping[str, Any] | None = None
    max_workers_per_session: int | None = None
    max_running_workers: int | None = None
    threads_per_session: int = 16
    threads: ThreadPool | None = None
    start_timeout_ms: int = DEFAULT_START_TIMEOUT_MS


class RunningCall(Protocol):
    """A started call, as its isolation holds it."""

    def cancel(self, reason: str) -> None:
        """Signal the call to stop (``reason``: ``"stopping"``...); its result, if it
        still comes, is late."""


class Isolation(ABC):
    """Where calls run. A new kind is a subclass in its own module plus one line in
    :data:`rho_actors.isolation.ISOLATIONS`; it is built once per system with its
    :class:`IsolationServices`."""

    name: ClassVar[str]
    """The name users pass as ``isolation=`` (``"thread"``, ``"process"``, ``"ray"``)."""

    untrusted_refused: ClassVar[str | None] = None
    """Why untrusted tools may not use this isolation (``register`` raises
    ``ValueError`` with it), or ``None``: they may."""

    start_bound_s: float = 0.0
    """How long a call may wait to start before its tool's ``timeout_ms`` begins
    (seconds): the loop gives the call that much on top of it (``process``: the wait for
    a worker, ``start_timeout_ms``)."""

    def __init__(self, services: IsolationServices) -> None:
        self.services = services

    @abstractmethod
    def start(self, call: CallSpec) -> RunningCall:
        """Start ``call`` (from the loop's thread: never block). ``call.reply`` gets
        exactly one on-time result, a ``timeout`` error at ``call.deadline`` at the latest.
        Raises ``pykka.ActorDeadError`` or ``pykka.Timeout`` when the call cannot start
        (the system is stopping, or no thread could be started for it): then it has no
        result, and the loop answers it ``not_started``."""

    def check_options(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check what ``register(..., resources=...)`` gave a tool of this isolation and
        return it frozen (kept with the tool's entry). Default: no option is taken;
        raises ``ValueError`` naming them."""
        if options:
            raise ValueError(f"isolation {self.name!r} takes no resources, got {sorted(options)}")
        return options

    def open(self) -> None:  # noqa: B027 (optional hook)
        """Make the isolation ready (its system started it). Default: nothing."""

    def shutdown(self, timeout_s: float) -> None:  # noqa: B027 (optional hook)
        """Stop every call and release every resource within ``timeout_s`` seconds.
        Default: nothing."""

    def stopping_from_here(self) -> None:  # noqa: B027 (optional hook)
        """The system's stop was called in this thread (before it begins): if this is
        one of the isolation's call threads (a tool stopping the system), its
        :meth:`shutdown` must not wait for it, which waits for that stop. Default: nothing."""

    def running_calls(self) -> int:
        """How many of its calls run outside a CallActor now (counted with the ``calls``
        supervisor's in :meth:`rho_actors.ActorSystem.tree`). Default: 0."""
        return 0

    def describe(self) -> dict[str, Any]:
        """What an operator sees of this isolation in :meth:`rho_actors.ActorSystem.tree`
        (plain data; the ``workers`` node's ``isolations``). Default: nothing."""
        return {}

    def stats(self) -> dict[str, Any]:
        """Counters (and settings) for :meth:`rho_actors.ActorSystem.stats` (names unique across
        isolations). Default: none."""
        return {}

    def pids(self) -> list[int]:
        """The process ids of this isolation's worker processes alive now, for
        :meth:`rho_actors.ActorSystem.worker_pids`. Default: none."""
        return []
