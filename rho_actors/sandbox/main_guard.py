"""Detecting a forgotten ``if __name__ == "__main__":`` guard.

Child processes (the fork server that starts workers, spawned children) import the
host's main script to find what it defines, as ``__mp_main__``. A script that starts an
:class:`~rho_actors.ActorSystem` at its top level, outside the guard, would then start
another system in every such child: its body runs again (three times and more), and
what the host sees is a confinement error, an ``unknown tool`` or an ``exited`` result.
:func:`refuse_unguarded_start` stops that child at once, with a message that says what
to do.
"""

from __future__ import annotations

import ast
import functools
import sys
from typing import Final

__all__ = ["GUARD_MESSAGE", "HOST_MESSAGE", "UnguardedStartError", "refuse_unguarded_children",
           "refuse_unguarded_start", "unguarded_main", "unguarded_script"]

GUARD_MESSAGE: Final = (
    "rho_actors: {file} starts an ActorSystem at its top level, and a child process (a worker or the fork "
    "server) that imports {file} to find your tools started it again. Put the code that starts and uses "
    "the system under  if __name__ == \"__main__\":  at the bottom of {file} (define tools at the top level, "
    "run them under the guard); this child does not go on."
)


HOST_MESSAGE: Final = (
    "rho_actors: {file} line {line} registers a tool that runs in child processes from its top level, "
    "outside  if __name__ == \"__main__\":  . Child processes import {file} to find your tools, so they would "
    "start its ActorSystem again (the body runs several times, and calls fail as 'unknown tool', a "
    "confinement error or 'exited'). Put the code that starts and uses the system under  "
    "if __name__ == \"__main__\":  at the bottom of {file}, and keep only definitions at its top level."
)


class UnguardedStartError(RuntimeError):
    """An ActorSystem started while a child process imported the main script."""


def unguarded_main() -> str | None:
    """The main script's file when this call is made while a child process imports it
    (a frame of the module ``__mp_main__`` running its top level), else ``None``."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return str(frame.f_globals.get("__file__") or frame.f_code.co_filename)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def unguarded_script() -> tuple[str, int] | None:
    """``(file, line)`` when this call is made by the top level of the main script
    (``__main__``, a ``.py`` file) at a line outside an ``if __name__ == "__main__":``
    block, else ``None``."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            file = frame.f_globals.get("__file__")
            if not isinstance(file, str) or not file.endswith(".py"):
                return None
            guarded = _guarded_lines(file)
            if guarded is None or frame.f_lineno in guarded:
                return None
            return file, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return None


@functools.lru_cache(maxsize=8)
def _guarded_lines(file: str) -> frozenset[int] | None:
    """The lines of ``file`` inside ``if __name__ == "__main__":`` blocks (``None`` when
    it cannot be read or parsed: no verdict)."""
    try:
        with open(file, encoding="utf-8") as f:
            tree = ast.parse(f.read(), file)
    except (OSError, SyntaxError, ValueError):
        return None
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return frozenset(lines)


def _is_main_test(test: ast.expr) -> bool:
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    texts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names) and bool(texts)


def refuse_unguarded_children() -> None:
    """Raise :class:`UnguardedStartError` with :data:`HOST_MESSAGE` when the host's main
    script, at its unguarded top level, is about to need child processes; else nothing."""
    found = unguarded_script()
    if found is not None:
        raise UnguardedStartError(HOST_MESSAGE.format(file=found[0], line=found[1]))


def refuse_unguarded_start() -> None:
    """Raise :class:`UnguardedStartError` (its message also written to standard error,
    which a fork server shares with the host) when an ActorSystem is being started by
    a child process's import of the main script; else nothing."""
    file = unguarded_main()
    if file is None:
        return
    message = GUARD_MESSAGE.format(file=file)
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    raise UnguardedStartError(message)
