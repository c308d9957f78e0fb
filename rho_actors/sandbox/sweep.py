"""Sweeping what a host killed from outside left behind (internal; DESIGN §5).

A host removes its children's private folders and cgroups when they end; a host killed
with ``SIGKILL`` cannot (its clean fork server still kills every child, see
:mod:`rho_actors.sandbox.zygote`). Both carry the pid of the host that made them
(``rho-actors-<pid>-...``: :func:`rho_actors.sandbox.confine.confinement.make_private_dir`,
:class:`rho_actors.sandbox.confine.cgroups.Cgroup`), so :func:`sweep_leftovers` (run once by each
:class:`rho_actors.ActorSystem` start) removes those whose host is no longer running:
private folders in the temporary folder, and cgroups in this process's hierarchy (any
process still in one is killed first). A pid reused since by another process keeps its
leftovers until a later start finds it gone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import Final

from loguru import logger

from rho_actors.sandbox.confine import cgroups

__all__ = ["remove_tree", "sweep_leftovers"]

_LEFTOVER: Final = re.compile(r"rho-actors-(\d+)-")


def _dead(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _leftovers(folder: str) -> list[str]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        match = _LEFTOVER.match(name)
        if match and _dead(int(match.group(1))):
            out.append(os.path.join(folder, name))
    return out


_RM_TIMEOUT_S: Final = 120.0  # what ``rm`` may take for a tree too deep for shutil


def remove_tree(path: str) -> None:
    """Remove the folder tree at ``path`` (a worker's private folder, a dead host's
    leftover), following no symlink. Never raises: what cannot be removed is logged and
    left. A tool can nest folders deeper than Python's recursion limit in its private
    folder (``mkdir`` relative to a descriptor: no path grows long), and
    ``shutil.rmtree`` recurses once a level on 3.11 (``RecursionError``, which its
    ``ignore_errors`` does not cover): such a tree is removed by ``rm -rf
    --one-file-system``, which walks it without recursing."""
    try:
        shutil.rmtree(path, ignore_errors=True)
        return
    except RecursionError:
        pass
    except Exception as exc:
        logger.warning("could not remove {}: {}", path, exc)
        return
    try:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", path], check=True, timeout=_RM_TIMEOUT_S,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("could not remove {} (nested past the recursion limit): {}", path, exc)


def sweep_leftovers() -> dict[str, int]:
    """Remove the private folders and cgroups of hosts no longer running; how many of
    each: ``{"folders": n, "cgroups": m}``. Never raises: what cannot be removed is
    logged and left."""
    folders = 0
    for path in _leftovers(tempfile.gettempdir()):
        if os.path.isdir(path) and not os.path.islink(path):
            remove_tree(path)
            folders += not os.path.exists(path)
    removed = 0
    hierarchy = cgroups.find_hierarchy()
    if not isinstance(hierarchy, str):
        leaves = {os.path.basename(path) for parent in set(hierarchy.dirs.values()) for path in _leftovers(parent)}
        for leaf in sorted(leaves):
            group = cgroups.Cgroup.existing(hierarchy, leaf)
            try:
                group.kill()
                group.remove()
                removed += 1
            except cgroups.CgroupError as exc:
                logger.warning("confinement: a leftover cgroup {} could not be removed: {}", leaf, exc)
    if folders or removed:
        logger.info("confinement: swept {} private folders and {} cgroups of hosts no longer running", folders, removed)
    return {"folders": folders, "cgroups": removed}
