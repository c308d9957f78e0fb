"""Safe files under a data folder: no symlink is followed, no open can block.

Every folder below a root (a system's ``data_dir``) is walked one component at a time
with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's descriptor (``openat``), so a
symlink anywhere on the path is refused, not followed, and nothing is created or written
outside the root. Each folder walked below the root is made (or tightened to) mode
``0o700``, whatever the umask: session folders hold transcripts, and confined workers run
as another user. A file is opened with
``O_NOFOLLOW | O_NONBLOCK`` after an ``lstat`` of its name, and must be a regular file
(checked again with ``fstat`` on the descriptor): a FIFO, a device, a socket or a folder
in its place is refused at once, never opened in a way that waits.

Example::

    folder = private_dir(data_dir, "sessions", "session-1")   # data_dir/sessions/session-1, 0700
    fd = open_regular(folder / "transcript.jsonl", os.O_RDWR | os.O_CREAT | os.O_APPEND)
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import cast

from rho_actors.errors import RhoError

__all__ = ["UnsafePathError", "child_path", "folder_identity", "fsync_dir", "is_same_folder", "open_regular",
           "private_dir"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class UnsafePathError(RhoError, OSError):
    """A path that is not what it must be: a symlink, or not a regular file or folder.
    ``str(err)`` names the path and what was found there."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _component(part: str) -> str:
    if type(part) is not str or part in ("", ".", "..") or "/" in part or "\0" in part:
        raise ValueError(f"{part!r} is not a single path component")
    return part


def _open_child_dir(parent_fd: int, part: str, where: Callable[[], Path], create: bool) -> tuple[int, os.stat_result]:
    try:  # opened first: a folder that exists (the usual case) costs no mkdir
        fd = os.open(part, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(part, 0o700, dir_fd=parent_fd)
        except FileExistsError:  # made meanwhile by another thread or process: opened and checked below
            pass
        fd = _open_made_dir(parent_fd, part, where)
    except OSError as exc:
        _raise_unsafe(exc, parent_fd, part, where)
        raise
    try:
        found = os.fstat(fd)
        if stat.S_IMODE(found.st_mode) != 0o700:
            os.fchmod(fd, 0o700)  # on the descriptor: no path, so no symlink, in between
    except BaseException:
        os.close(fd)
        raise
    return fd, found


def _open_made_dir(parent_fd: int, part: str, where: Callable[[], Path]) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        _raise_unsafe(exc, parent_fd, part, where)
        raise


def _raise_unsafe(exc: OSError, parent_fd: int, part: str, where: Callable[[], Path]) -> None:
    """Raise :class:`UnsafePathError` when opening ``part`` failed on a symlink or a non-folder."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        found = os.stat(part, dir_fd=parent_fd, follow_symlinks=False)
        raise UnsafePathError(f"{where()} is {_kind(found.st_mode)}, not a folder") from None


def private_dir(root: str | Path, *parts: str, create: bool = True) -> Path:
    """The folder ``root/parts[0]/parts[1]/...``, each part a real folder of mode
    ``0o700`` (created when missing and ``create``; tightened when looser). ``root`` itself is the caller's choice
    and is created (with its parents) when missing. Returns the path.

    Raises :class:`UnsafePathError` when a part is a symlink or not a folder,
    ``ValueError`` for a part that is not one path component, ``FileNotFoundError``
    when a part is missing and not ``create``, and ``OSError``."""
    root = Path(root)
    _walk(root, parts, create)
    return root.joinpath(*parts)


def folder_identity(root: str | Path, *parts: str, names: list[str] | None = None,
                    look_for: tuple[str, ...] = ()) -> tuple[int, int] | None:
    """Check the existing folder ``root/parts...`` as :func:`private_dir` does (each part
    a real folder reached without following a symlink, tightened to ``0o700``) and return
    its identity, ``(st_dev, st_ino)``; ``None`` when a part is missing (nothing made).
    ``names``, when given, is extended with those of ``look_for`` (single names) that
    the folder holds, each looked up with one ``lstat`` relative to the walk's own
    descriptor (no listing of the folder: what else it holds costs nothing); nothing is
    added when the folder is missing. Raises as :func:`private_dir`."""
    try:
        found = _walk(root if isinstance(root, Path) else Path(root), parts, False, names, look_for)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def child_path(parent: Path, name: str) -> Path:
    """``parent / name`` for a ``name`` known to be one path component (no separator, not
    ``.`` or ``..``): made from ``parent``'s parts without parsing ``name`` where pathlib
    can (its ``_make_child_relpath``, which its folder walks use; ~4k instructions against ~14k)."""
    make = getattr(parent, "_make_child_relpath", None)
    return parent / name if make is None else cast(Path, make(name))


def is_same_folder(path: str | Path, identity: tuple[int, int] | None) -> bool:
    """Whether ``path`` is, with one ``lstat``, the folder of ``identity`` (see
    :func:`folder_identity`) still: no symlink in its place, mode ``0o700``. Never raises."""
    if identity is None:
        return False
    try:
        found = os.lstat(path)
    except (OSError, ValueError):
        return False
    return (stat.S_ISDIR(found.st_mode) and stat.S_IMODE(found.st_mode) == 0o700
            and (found.st_dev, found.st_ino) == identity)


def _walk(root: Path, parts: tuple[str, ...], create: bool, names: list[str] | None = None,
          look_for: tuple[str, ...] = ()) -> os.stat_result:
    """Walk (and make, with ``create``) ``parts`` below ``root``; returns the last folder's
    ``fstat`` (and adds to ``names``, when given, those of ``look_for`` that folder holds)."""
    for part in parts:
        _component(part)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            raise
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        found = os.fstat(fd) if not parts else None
        for depth, part in enumerate(parts, 1):
            child, found = _open_child_dir(fd, part, functools.partial(root.joinpath, *parts[:depth]), create)
            os.close(fd)
            fd = child
        if names is not None:
            for name in look_for:
                try:
                    os.stat(_component(name), dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except OSError:  # not known to be missing: named, so that its reader looks (and says what is wrong)
                    pass
                names.append(name)
    finally:
        os.close(fd)
    assert found is not None
    return found


def open_regular(path: str | Path, flags: int, mode: int = 0o600) -> int:
    """Open the regular file at ``path`` (a descriptor, close-on-exec) without following
    a symlink at its last component and without blocking; its folder must be a real
    folder too (not a symlink). ``flags`` are ``os.open`` flags (``O_CREAT`` creates it
    with ``mode``). Raises :class:`UnsafePathError` when the file or its folder is a
    symlink, or the file is not a regular file (a FIFO, device, socket, folder), and
    ``OSError`` (``FileNotFoundError`` when missing without ``O_CREAT``)."""
    path = Path(path)
    parent = path.parent
    try:
        dir_fd = os.open(parent, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{parent} is a symlink or not a folder") from None
        raise
    try:
        try:
            found = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
        else:
            if not stat.S_ISREG(found.st_mode):
                raise UnsafePathError(f"{path} is {_kind(found.st_mode)}, not a regular file")
        try:
            fd = os.open(path.name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise UnsafePathError(f"{path} is a symlink or not a regular file") from None
            raise
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        kind = _kind(os.fstat(fd).st_mode)
        os.close(fd)
        raise UnsafePathError(f"{path} is {kind}, not a regular file")
    return fd


def fsync_dir(path: str | Path) -> None:
    """Make the entries of the folder at ``path`` durable (a file just made in it):
    ``fsync`` of the folder, best effort (an ``OSError`` is ignored)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
