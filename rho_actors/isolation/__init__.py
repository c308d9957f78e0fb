"""Isolations: where a call runs, and who keeps its deadline (DESIGN §5).

:data:`ISOLATIONS` maps each name users pass as ``isolation=`` to its
:class:`Isolation` class. A new kind is one module with an :class:`Isolation`
subclass and one line here.
"""

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from rho_actors.declarations.toolset import Placement
from rho_actors.isolation.base import DEFAULT_START_TIMEOUT_MS, Isolation, IsolationServices, RunningCall
from rho_actors.isolation.owner import IsolationOwner
from rho_actors.isolation.process import ProcessIsolation
from rho_actors.isolation.ray import RayIsolation
from rho_actors.isolation.thread import AbandonedThreads, ThreadIsolation

__all__ = [
    "DEFAULT_START_TIMEOUT_MS",
    "ISOLATIONS",
    "AbandonedThreads",
    "Isolation",
    "IsolationOwner",
    "IsolationServices",
    "ProcessIsolation",
    "RayIsolation",
    "RunningCall",
    "ThreadIsolation",
    "place",
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


def place(
    isolations: Mapping[str, Isolation], isolation: str | None, placement: Placement,
    resources: Mapping[str, Any] | None,
) -> Placement:
    """``placement`` with the ``options`` its chosen ``isolation`` (``None``: the
    default) checked from ``resources``. Raises ``ValueError`` for an unknown isolation,
    an untrusted tool on one that refuses them (saying why), bad ``resources``, or
    ``resources`` without an isolation that takes them; ``ImportError`` as the isolation's
    ``check_options`` does."""
    if isolation is not None and isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if isolation is None:
        if resources is not None:
            raise ValueError("resources need an isolation that takes them: register(..., isolation='ray', ...)")
        return placement
    chosen = isolations[isolation]
    if placement.untrusted and chosen.untrusted_refused:
        raise ValueError(f"untrusted tools cannot use isolation={isolation!r}: {chosen.untrusted_refused}")
    return dataclasses.replace(placement, options=chosen.check_options(resources or {}))
