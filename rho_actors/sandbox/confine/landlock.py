"""Landlock: the kernel's unprivileged filesystem (and signal) sandbox, by three syscalls.

A process calls :func:`restrict_self` once, before any untrusted code runs; from then
on it, and every process it starts, may open only beneath the paths it was given
(read-only or read-write), and, from ABI 6 (Linux 6.12), may neither signal nor connect
to an abstract Unix socket of a process outside its Landlock domain. Rules never widen:
a later ruleset only narrows. See ``Documentation/userspace-api/landlock.rst`` in the
Linux tree, whose constants and struct layouts this module copies.

The syscalls are called with :mod:`ctypes` (444 ``landlock_create_ruleset``, 445
``landlock_add_rule``, 446 ``landlock_restrict_self``: the same numbers on x86_64 and
aarch64, the only architectures supported here). The ``landlock`` package on PyPI is a
pre-release; three syscalls do not need it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterable
from typing import Final

from rho_actors.sandbox.confine.libc import LIBC, checked

__all__ = ["LandlockError", "abi_version", "restrict_self"]

_SYSCALLS: Final = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_NAMES: Final = ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")
_CREATE_RULESET_VERSION: Final = 1
_RULE_PATH_BENEATH: Final = 1

# LANDLOCK_ACCESS_FS_* bits, and the ABI that introduced each group.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_FS: Final = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_ONLY: Final = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class LandlockError(OSError):
    """Landlock is absent, disabled, or refused a rule; ``errno`` and the message say which."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]




def _syscall(index: int, *args: object) -> int:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise LandlockError(errno.ENOSYS, f"Landlock syscall numbers unknown on {platform.machine()}")
    return checked(int(LIBC.syscall(ctypes.c_long(numbers[index]), *args)), LandlockError, _NAMES[index])


def abi_version() -> int:
    """The kernel's Landlock ABI version (1 = Linux 5.13; 6 adds signal scoping, Linux 6.12).

    Raises :class:`LandlockError`: ``ENOSYS`` when the kernel lacks Landlock,
    ``EOPNOTSUPP`` when it is built in but not enabled at boot (``lsm=``)."""
    return _syscall(0, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))


def _handled(abi: int) -> tuple[int, int]:
    fs = _ABI1_FS
    if abi >= 2:
        fs |= _REFER
    if abi >= 3:
        fs |= _TRUNCATE
    if abi >= 5:
        fs |= _IOCTL_DEV
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    return fs, scoped


def restrict_self(read_only: Iterable[str], read_write: Iterable[str], list_only: Iterable[str] = ()) -> int:
    """Confine this thread (and every process it starts) to ``read_only`` paths (read,
    list, execute), ``read_write`` paths (every filesystem right) and ``list_only``
    folders (their entries listed, no file read), recursively beneath each; from ABI 6
    also scope signals and abstract Unix sockets to the domain.

    Call it in a single-threaded process after ``PR_SET_NO_NEW_PRIVS`` (or with
    ``CAP_SYS_ADMIN``): Landlock binds the calling thread only. A path that does not
    exist is skipped. Returns the ABI version enforced. Raises :class:`LandlockError`
    when Landlock is unavailable or a syscall fails (the process is then unchanged)."""
    abi = abi_version()
    fs, scoped = _handled(abi)
    attr = _RulesetAttr(fs, 0, scoped)
    ruleset = _syscall(0, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    try:
        reading = _EXECUTE | _READ_FILE | _READ_DIR
        for paths, access in ((read_only, reading), (read_write, fs), (list_only, _READ_DIR)):
            for path in paths:
                _add_path(ruleset, path, access)
        _syscall(2, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return abi


def _add_path(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_ONLY
        rule = _PathBeneathAttr(access, fd)
        try:
            _syscall(1, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0))
        except LandlockError as exc:
            raise LandlockError(exc.errno, f"Landlock refused the rule for {path!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
