"""The C library as the confinement steps call it (internal; DESIGN §5): one handle with
``errno`` kept per thread, and one rule for a failed call.

Each step raises its own ``OSError`` subclass (``ConfinementError``, ``LandlockError``,
``NamespaceError``, ``SeccompError``), always with the failing call named and the
kernel's ``errno`` text, so a child that cannot confine itself says which step refused.
"""

from __future__ import annotations

import ctypes
import os
from typing import Final

__all__ = ["LIBC", "PR_SET_CHILD_SUBREAPER", "checked"]

LIBC: Final = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
PR_SET_CHILD_SUBREAPER: Final = 36


def checked(result: int, error: type[OSError], what: str) -> int:
    """``result`` of a libc call made just before (``prctl``, ``unshare``, ``mount``,
    ``syscall``): returned when not negative; else raises ``error(errno, "WHAT: STRERROR")``,
    ``errno`` read at once, before another call can change it."""
    if result < 0:
        err = ctypes.get_errno()
        raise error(err, f"{what}: {os.strerror(err)}")
    return result
