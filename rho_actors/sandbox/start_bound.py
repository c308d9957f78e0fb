"""How long a ``process`` call may wait for a worker by default: ``start_timeout_ms``.

The bound is the product's (DESIGN §5 "Starting a worker"): past it a call that got no
worker is ``unavailable``. How long a worker takes to start is the machine's, though: a
quiet one starts a worker in a fraction of a second, a heavily loaded one (a busy CI
runner) can take tens of seconds. ``RHO_ACTORS_START_TIMEOUT_MS`` (milliseconds > 0)
sets the default of every :class:`~rho_actors.ActorSystem` and
:class:`~rho_actors.sandbox.WorkerPool` of the process, and of the processes it starts,
that is given no ``start_timeout_ms`` of its own; the test suite sets it to its hang bound.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_START_TIMEOUT_MS", "START_TIMEOUT_ENV", "default_start_timeout_ms"]

DEFAULT_START_TIMEOUT_MS = 10_000
"""How long a ``process`` call may wait for a worker to start or become free by
default (milliseconds), apart from its tool's own ``timeout_ms``."""

START_TIMEOUT_ENV = "RHO_ACTORS_START_TIMEOUT_MS"
"""The environment variable that replaces :data:`DEFAULT_START_TIMEOUT_MS`."""


def default_start_timeout_ms() -> int:
    """``start_timeout_ms`` when none is given: ``RHO_ACTORS_START_TIMEOUT_MS`` if set,
    else :data:`DEFAULT_START_TIMEOUT_MS`. Raises ``ValueError`` naming the variable
    when it is set to anything but whole milliseconds > 0."""
    text = os.environ.get(START_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_START_TIMEOUT_MS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{START_TIMEOUT_ENV} must be whole milliseconds > 0, not {text!r}")
    return value
