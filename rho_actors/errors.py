"""The root of rho_actors' own exceptions, and the one error a missing optional extra gets."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["EXTRAS", "RhoError", "missing_extra", "needs_extra"]


class RhoError(Exception):
    """Base of the exceptions rho_actors raises for its own reasons (a bad registration,
    a failed isolated read, a source that cannot load...), so a host can catch them all.
    Errors of Python's own kinds (``TypeError``, ``ValueError`` for a bad argument) stay
    those."""


EXTRAS: dict[str, tuple[str, ...]] = {
    "mcp": ("mcp", "mcp_types"),
    "ray": ("ray",),
    "openai": ("openai",),
    "anthropic": ("anthropic",),
    "otel": ("opentelemetry",),
    "langgraph": ("langgraph", "langchain_core"),
    "openai-agents": ("agents",),
    "pydantic-ai": ("pydantic_ai",),
    "fastapi": ("fastapi", "uvicorn"),
}
"""Each optional extra of setup.cfg and the top-level modules it installs."""


def missing_extra(extra: str, needed_by: str, err: ImportError) -> ImportError:
    """The ``ImportError`` for ``needed_by`` (a module or a feature: ``"rho_actors.mcp"``,
    ``'isolation="ray"'``) when the optional ``extra`` it needs is not installed:
    names the module found missing and the command that installs it. The same text for
    every extra."""
    missing = (err.name or "").split(".")[0] or str(err)  # the top-level module the extra installs
    return ImportError(f"{needed_by} needs the optional extra {extra!r}, which is not installed (no module "
                       f"{missing!r}): install it with pip install 'rho_actors[{extra}]'", name=missing)


@contextlib.contextmanager
def needs_extra(extra: str, needed_by: str) -> Iterator[None]:
    """Around the imports of ``needed_by``: a module of ``extra`` (see :data:`EXTRAS`)
    found missing raises :func:`missing_extra`'s error instead of a bare ``No module
    named ...``; any other import error goes through unchanged."""
    try:
        yield
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in EXTRAS[extra]:
            raise
        raise missing_extra(extra, needed_by, err) from err
