"""What every sandbox child runs first (internal).

:func:`child_main` is the one entry point of every child process (worker processes,
throwaway declaration reads, selftests). It calls :func:`enter_child` with the child's
:class:`ChildSetup` (plain data) before any tool code is unpickled or run, then the
child's own ``entry(channel, payload)``, and ends the process with ``os._exit`` whatever
happens. OS confinement of a child belongs in :func:`enter_child`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import resource
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rho_actors.sandbox.channel import Channel

__all__ = ["ChildSetup", "child_main", "enter_child"]


@dataclass(frozen=True, slots=True)
class ChildSetup:
    """How a child is set up before it runs anything (plain data only).

    ``heap_bytes``: the ``RLIMIT_AS`` bound in bytes (``None`` or ``0``: none).
    ``output_path``: a file that takes the child's standard output and error (its
    standard input is then ``/dev/null``, and Python's fault handler writes there);
    ``None``: standard output goes to standard error, so a tool cannot corrupt the
    host's stdout. ``workdir``: the child's working directory, ``HOME`` and temporary
    folder (``TMPDIR``, ``TMP``, ``TEMP``); ``None``: inherited.
    """

    heap_bytes: int | None = None
    output_path: str | None = None
    workdir: str | None = None


def enter_child(setup: ChildSetup) -> None:
    """First thing in every child: lead a new process group (so killing the group
    kills whatever the child starts), route its output, move into its working folder
    and bound its address space."""
    os.setsid()
    if setup.output_path is None:
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            os.dup2(2, 1)
    else:
        fd = os.open(setup.output_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        with contextlib.suppress(Exception):  # no usable stderr: no fault report
            faulthandler.enable(file=sys.stderr, all_threads=True)
    if setup.workdir is not None:
        for var in ("HOME", "TMPDIR", "TMP", "TEMP"):
            os.environ[var] = setup.workdir
        os.chdir(setup.workdir)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    heap = setup.heap_bytes
    if heap is not None and heap > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = heap if hard == resource.RLIM_INFINITY else min(heap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def child_main(conn: Any, setup: ChildSetup, entry: Callable[[Channel, Any], None], payload: Any) -> None:
    """The entry point of every sandbox child: :func:`enter_child`, then
    ``entry(channel, payload)`` on the child's end of its :class:`Channel`; the
    process then ends (``os._exit(0)``) whatever happened."""
    try:
        enter_child(setup)
        entry(Channel(conn), payload)
    finally:
        os._exit(0)
