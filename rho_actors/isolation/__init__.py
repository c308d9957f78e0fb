"""Isolations: where a call runs, and who keeps its deadline (DESIGN §5).

:data:`ISOLATIONS` maps each name users pass as ``isolation=`` to its
:class:`Isolation` class. A new kind is one module with an :class:`Isolation`
subclass and one line here.
"""

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from rho_actors.isolation.base import Isolation, IsolationServices, RunningCall
from rho_actors.isolation.owner import IsolationOwner
from rho_actors.isolation.process import ProcessIsolation
from rho_actors.isolation.ray import RayIsolation
from rho_actors.isolation.thread import AbandonedThreads, ThreadIsolation

__all__ = [
    "ISOLATIONS",
    "AbandonedThreads",
    "Isolation",
    "IsolationOwner",
    "IsolationServices",
    "ProcessIsolation",
    "RayIsolation",
    "RunningCall",
    "ThreadIsolation",
    "start_isolations",
]

ISOLATIONS: Final[Mapping[str, type[Isolation]]] = MappingProxyType({
    "thread": ThreadIsolation,
    "process": ProcessIsolation,
    "ray": RayIsolation,
})
"""Isolation name -> class."""


def start_isolations(services: IsolationServices) -> dict[str, Isolation]:
    """One instance of every isolation of :data:`ISOLATIONS`, by name."""
    return {name: cls(services) for name, cls in ISOLATIONS.items()}
