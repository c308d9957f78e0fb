"""The :class:`Isolation` interface: where and how a call runs (DESIGN §5).

An isolation starts a call with its deadline and owns that deadline: whatever the tool
does, the call's ``reply`` gets a result by the deadline (a ``timeout`` error at the
latest), and a result that comes later is still handed to ``reply`` (the loop reports
it as ``late``). The isolation can cancel a running call, report counters, and is
opened and shut down with its system.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from rho_actors.call import CallSpec
    from rho_actors.otp.supervisor import ChildStarter
    from rho_actors.otp.timers import Timers

__all__ = ["Isolation", "IsolationServices", "RunningCall"]


@dataclass(frozen=True, slots=True)
class IsolationServices:
    """What an isolation gets from its system: ``calls`` starts the supervised CallActor
    a call runs in (its waiting thread); ``timers``, the system's timer service; the bounds of
    worker processes: ``warm_workers`` idle workers, ``heap_bytes`` of address space each
    (bytes) and the ``start_method`` (``"forkserver"`` or ``"spawn"``)."""

    calls: ChildStarter
    timers: Timers
    warm_workers: int = 2
    heap_bytes: int = 256 * 2**20
    start_method: str = "forkserver"


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
    """The name users pass as ``isolation=`` (``"thread"``, ``"process"``)."""

    def __init__(self, services: IsolationServices) -> None:
        self.services = services

    @abstractmethod
    def start(self, call: CallSpec) -> RunningCall:
        """Start ``call`` (from the loop's thread: never block). ``call.reply`` gets
        exactly one on-time result, a ``timeout`` error at ``call.deadline`` at the latest.
        Raises ``pykka.ActorDeadError`` or ``pykka.Timeout`` when the call cannot start
        (the system is stopping)."""

    def open(self) -> None:  # noqa: B027 (optional hook)
        """Make the isolation ready (its system started it). Default: nothing."""

    def shutdown(self, timeout_s: float) -> None:  # noqa: B027 (optional hook)
        """Stop every call and release every resource within ``timeout_s`` seconds.
        Default: nothing."""

    def stats(self) -> dict[str, int]:
        """Counters for :meth:`rho_actors.ActorSystem.stats` (names unique across
        isolations). Default: none."""
        return {}
