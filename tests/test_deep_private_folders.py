"""A folder tree nested deeper than Python's recursion limit (a tool can make one in its
private folder: ``mkdir`` relative to a descriptor, no path ever long) is removed like any
other: ``shutil.rmtree`` recursed once a level and raised ``RecursionError``, which its
``ignore_errors`` does not cover: a worker's close raised in the pool's keeper thread,
and a dead host's leftover made every later ``ActorSystem`` on the machine fail to start
(``sweep_leftovers``, documented never to raise, raised)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from rho_actors.sandbox.sweep import remove_tree, sweep_leftovers

pytestmark = pytest.mark.timeout(120)

DEPTH = sys.getrecursionlimit() * 3


def _deep(root: Path) -> None:
    """``root``/d/d/... ``DEPTH`` levels, made as a tool would (relative to descriptors)."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(DEPTH):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


def _dead_pid() -> int:
    pid = 2**22 - 1
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    _deep(tmp_path / "private")
    remove_tree(str(tmp_path / "private"))
    assert not (tmp_path / "private").exists()


def test_a_dead_hosts_deep_leftover_is_swept_and_never_raises(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    leftover = tmp_path / f"rho-actors-{_dead_pid()}-deep"
    _deep(leftover)
    assert sweep_leftovers()["folders"] == 1
    assert not leftover.exists()
