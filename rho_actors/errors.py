"""The root of rho_actors' own exceptions."""

from __future__ import annotations

__all__ = ["RhoError"]


class RhoError(Exception):
    """Base of the exceptions rho_actors raises for its own reasons (a bad registration,
    a failed isolated read, a source that cannot load...), so a host can catch them all.
    Errors of Python's own kinds (``TypeError``, ``ValueError`` for a bad argument) stay
    those."""
