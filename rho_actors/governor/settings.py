"""The system's bounds on calls that the governor keeps (DESIGN §4 "The governor"):
:class:`GovernorSettings`, given to ``ActorSystem(governor=...)``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["GovernorSettings", "default_max_thread_calls"]


def default_max_thread_calls() -> int:
    """The default ``max_thread_calls``: 32 per core (as ``os.cpu_count()`` counts
    them), at least 256 (a thread call mostly waits on I/O; each holds a thread)."""
    return max(256, 32 * (os.cpu_count() or 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class GovernorSettings:
    """The system's bounds on calls: ``max_thread_calls`` (calls running on threads at
    once, the whole system; default :func:`default_max_thread_calls`),
    ``max_calls_per_session`` (calls a session may make, ``None``: no bound) and
    ``max_repeats`` (how many times one session may call the same tool with the same
    arguments, ``None``: off); the last two are the host's ceiling, which a session may
    tighten (``start_loop(max_calls_per_session=..., max_repeats=...)``). Raises
    ``ValueError`` for a bound that is not an ``int`` >= 1."""

    max_thread_calls: int = field(default_factory=default_max_thread_calls)
    max_calls_per_session: int | None = None
    max_repeats: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_thread_calls", "max_calls_per_session", "max_repeats"):
            value = getattr(self, name)
            if (value is not None or name == "max_thread_calls") and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1{'' if name == 'max_thread_calls' else ' or None'}, "
                                 f"got {value!r}")
