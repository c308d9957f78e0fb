"""The supervised owner of a system's isolations (DESIGN §6: ``workers``, permanent).

It opens every isolation when it starts and shuts them down when it stops (within
``timeout_s`` seconds): no worker process, and no descendant of one, outlives it.
Restarted by its supervisor, it starts from empty isolations (no worker process).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rho_actors.isolation.base import Isolation
from rho_actors.otp.actor import Actor

__all__ = ["IsolationOwner"]


class IsolationOwner(Actor):
    """Opens the ``isolations`` on start and shuts them down on stop or failure."""

    def __init__(self, isolations: Mapping[str, Isolation], timeout_s: float = 5.0) -> None:
        super().__init__()
        self._isolations = isolations
        self._timeout_s = timeout_s

    def on_start(self) -> None:
        for isolation in self._isolations.values():
            isolation.open()

    def on_stop(self) -> None:
        self._shutdown()

    def on_failure(self, *exc_info: Any) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        # ``thread`` last: it may wait for call threads, and no worker process waits meanwhile
        for isolation in sorted(self._isolations.values(), key=lambda isolation: isolation.name == "thread"):
            isolation.shutdown(self._timeout_s)

    def stats(self) -> dict[str, int]:
        """Every isolation's counters."""
        return {k: v for isolation in self._isolations.values() for k, v in isolation.stats().items()}
