"""The checks of :class:`~rho_actors.ActorSystem`'s own settings, made before anything
of the system starts: a bad one raises naming it, and leaves no thread, actor or
process behind.

A count, a size or milliseconds that is not an ``int`` (a ``bool``, a float, ``NaN``) or below its
least value, a time in seconds that is not a finite number, and a ``governor`` or ``tasks`` that is
not a :class:`~rho_actors.GovernorSettings` or :class:`~rho_actors.TaskSettings` is
refused (before: ``max_output_chars=-5`` let every result through uncut, ``NaN`` failed
every call ``raised``, ``max_argument_depth=-1`` or ``abandoned_threads_per_tool=-1``
refused every call, a ``dict`` of task settings was accepted and failed at the first
background call and at ``stop()``).
"""

from __future__ import annotations

import math
from typing import Any, Final

from rho_actors.governor import GovernorSettings
from rho_actors.tasks import TaskSettings

__all__ = ["check_settings"]

_AT_LEAST_ONE: Final = (  # the result budgets and the fair shares are checked where they are made, first too
    "max_output_chars", "max_argument_depth", "max_schema_depth", "max_description_chars", "max_schema_bytes",
    "max_schema_nodes", "abandoned_threads_per_tool", "abandoned_threads",
)
_AT_LEAST_ZERO: Final = ("max_restarts", "warm_workers")
_MILLISECONDS: Final = ("start_timeout_ms",)  # None: its default
_SECONDS: Final = {"max_seconds": False, "worker_idle_s": True}  # whether 0 is allowed
_SETTINGS: Final = {"governor": GovernorSettings, "tasks": TaskSettings}


def check_settings(values: dict[str, Any]) -> None:
    """Check ``values`` (``ActorSystem``'s arguments by name; those not given here are
    checked where they are used). Raises ``TypeError`` for a settings object of another
    type and ``ValueError`` for a bad number, naming the argument and what it must be."""
    for name in _AT_LEAST_ONE + _AT_LEAST_ZERO:
        if name in values:
            value, least = values[name], 1 if name in _AT_LEAST_ONE else 0
            if type(value) is not int or value < least:
                raise ValueError(f"ActorSystem({name}=...) must be an int >= {least}, not {value!r}")
    for name in _MILLISECONDS:
        value = values.get(name)
        if value is not None and (type(value) is not int or value <= 0):
            raise ValueError(f"ActorSystem({name}=...) must be whole milliseconds > 0 or None, not {value!r}")
    for name, zero in _SECONDS.items():
        if name in values:
            value = values[name]
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
                raise ValueError(f"ActorSystem({name}=...) must be a finite number of seconds "
                                 f"{'>= 0' if zero else '> 0'}, not {value!r}")
    for name, kind in _SETTINGS.items():
        value = values.get(name)
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"ActorSystem({name}=...) must be a {kind.__name__} or None, not {type(value).__name__} "
                            f"{value!r:.100}")
