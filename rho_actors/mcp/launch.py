"""How a stdio MCP server is started: its program found first (a clear error naming it),
then run through ``env -i`` with a scrubbed environment (:data:`ENV_ALLOWLIST` and
``LC_*`` of this process, then the server's own ``env``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence

__all__ = ["ENV_ALLOWLIST", "env_command", "find_program", "scrubbed_environment"]

ENV_ALLOWLIST = ("PATH", "LANG", "TZ", "HOME")
"""Variables a stdio server inherits from this process (with every ``LC_*``)."""


def scrubbed_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a stdio MCP server: :data:`ENV_ALLOWLIST` and ``LC_*`` from
    ``os.environ``, then ``env`` over them."""
    kept = {k: v for k, v in os.environ.items() if k in ENV_ALLOWLIST or k.startswith("LC_")}
    return kept | dict(env or {})


def find_program(program: str, path: str, cwd: str | None, name: str) -> None:
    """Raise ``FileNotFoundError`` when ``env`` would not find ``program`` (on ``path``,
    or as a path from ``cwd``) or it is not executable."""
    where = program if os.path.isabs(program) or not cwd else os.path.join(cwd, program)
    found = shutil.which(where, path=path) if "/" in program else shutil.which(program, path=path)
    if found is None:
        place = f"on PATH={path!r}" if "/" not in program else f"at {where!r}"
        raise FileNotFoundError(f"the MCP server {name!r} cannot start: its program {program!r} is not found "
                                f"{place} (or is not executable)")


def _env_program() -> str:
    found = shutil.which("env")
    if found is None:
        raise FileNotFoundError("the env program is not on PATH (it starts stdio MCP servers, scrubbed)")
    return found


def _assignments(env: Mapping[str, str]) -> list[str]:
    bad = [k for k in env if not k or "=" in k or "\0" in k or "\0" in env[k]]
    if bad:
        raise ValueError(f"environment variable names or values not allowed: {bad}")
    return [f"{k}={v}" for k, v in env.items()]


def env_command(env: Mapping[str, str] | None, command: Sequence[str]) -> tuple[str, list[str]]:
    """The program and arguments that start ``command`` through ``env -i`` in the scrubbed
    environment with ``env`` over it. Raises ``FileNotFoundError`` without ``env`` on PATH
    and ``ValueError`` for a variable that cannot be passed."""
    return _env_program(), ["-i", *_assignments(scrubbed_environment(env)), *command]
