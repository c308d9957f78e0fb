"""What of the host's ``sys.path`` a confined child may read (DESIGN §5 "Confinement").

A confined child must import what the host imports, so Landlock lets it read the
``sys.path`` folders. Inside the Python installation (``sys.prefix``,
``sys.base_prefix``, ``sys.exec_prefix``: the standard library, site-packages) a folder
is readable whole. Any other ``sys.path`` folder, such as the host script's own folder
or a project root, is where ``.env`` files, ``credentials.json`` or a ``.git`` sit: of
such a folder the child may list the entries and read its code only, each entry Python
can import from: a file with an import suffix (``.py``, ``.pyc``, extension modules),
a folder whose name is an identifier (a package, a namespace package, ``__pycache__``)
and ``*.dist-info``/``*.egg-info`` metadata; never a hidden entry (a name starting
with ``.``) nor any other file.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys
from collections.abc import Iterable
from typing import Final

__all__ = ["code_entries", "installation_prefixes", "split_sys_path"]

_SUFFIXES: Final = tuple(dict.fromkeys(importlib.machinery.all_suffixes()))
_METADATA: Final = (".dist-info", ".egg-info")


@functools.cache
def installation_prefixes() -> tuple[str, ...]:
    """The real paths of this interpreter's prefixes (resolved once per process)."""
    return tuple(dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)))


def _beneath(path: str, folders: Iterable[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def code_entries(folder: str) -> tuple[str, ...]:
    """The entries of ``folder`` Python imports from (see the module doc), as paths; an
    unreadable folder has none."""
    try:
        with os.scandir(folder) as entries:
            found = []
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    continue
                if (is_dir and (name.isidentifier() or name.endswith(_METADATA))) or (
                    not is_dir and name.endswith(_SUFFIXES)
                ):
                    found.append(entry.path)
    except OSError:
        return ()
    return tuple(sorted(found))


def split_sys_path(exclude: Iterable[str] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(read, listed)``: the ``sys.path`` folders a confined child reads whole (inside
    the installation) or their code entries (any other folder), and the
    folders it may only list, all as real paths (a code entry that is a link, as the
    path it leads to). A folder that contains one of ``exclude`` (say ``data_dir``) is
    left out of both."""
    shut = [os.path.realpath(p) for p in exclude]
    prefixes = installation_prefixes()
    read: list[str] = []
    listed: list[str] = []
    for path in sys.path:
        if not path or not os.path.isdir(path):
            continue
        real = os.path.realpath(path)
        if any(_beneath(s, [real]) for s in shut):
            continue
        if _beneath(real, prefixes):
            read.append(real)
        else:
            listed.append(real)
            read.extend(os.path.realpath(e) if os.path.islink(e) else e for e in code_entries(real))
    return tuple(dict.fromkeys(read)), tuple(dict.fromkeys(listed))
