"""The locks of a session's transcript (DESIGN §4 "Approvals").

Two exclusive ``flock`` s, each released with its descriptor (so by a ``kill -9`` too:
the descriptors are close-on-exec, and rho's fork servers are started by exec, never
forked from a host): a prompt (or an MCP session) first takes :data:`PROMPT_LOCK_NAME`
beside the transcript, refused at once when another prompt holds it, then the
transcript's own; a brief writer (a decision, an approved call's result) takes only
the transcript's own, for a record or two, and a prompt waits for it at most
:data:`RECORD_WAIT_S`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from typing import Final

from rho_actors.files import open_regular

__all__ = ["PROMPT_LOCK_NAME", "RECORD_WAIT_S", "lock"]

PROMPT_LOCK_NAME: Final = "prompt.lock"
"""The file beside the transcript whose lock a prompt holds (one prompt per session)."""
RECORD_WAIT_S: Final = 30.0
"""How long (seconds) a prompt waits for a brief writer of the transcript."""


def lock(path: Path, wait_s: float, flags: int = 0) -> int | None:
    """The regular file at ``path`` opened read-write (created, mode 0600; ``flags``
    added: ``os.O_APPEND``) under an exclusive ``flock``, waiting up to ``wait_s``
    seconds for another holder; ``None`` when it still holds it. Raises
    :class:`~rho_actors.files.UnsafePathError` for a symlink or a file that is not
    regular, and ``OSError``."""
    fd = open_regular(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
    until, delay = time.monotonic() + wait_s, 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK) or time.monotonic() >= until:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                return None
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
