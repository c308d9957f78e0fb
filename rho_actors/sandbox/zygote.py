"""The clean fork server of untrusted children (internal; DESIGN §5 "A clean start").

This module is the main program of a separate interpreter the host starts with
``python -I`` (isolated mode: no ``PYTHONPATH``, no user site, no working directory on
``sys.path``), with an environment built from the allowlist
(:data:`rho_actors.sandbox.confine.enclosure.ENV_ALLOWLIST`), no descriptor but its control
socket, and ``sys.path`` the folders of the Python installation and of rho_actors only
(:func:`boot`: the host's other folders are its children's once they are confined,
:data:`HOST_PATHS`). It imports the sandbox kernel only (never the host's ``__main__``
nor any other host code, nor any file of the host's own folders) and forks
every untrusted child from there. The host's side is :mod:`rho_actors.sandbox.clean`.

Protocol, on the control socket (``SOCK_SEQPACKET``): the host sends one ``b"F"``
message (``b"P"``: the child is PID 1 of a new PID namespace, for a confined child with
``Confinement.pid_namespace``; when the kernel refuses one the child is forked as for
``F`` and refuses itself) carrying three descriptors: the child's end of its channel,
the write end of its status pipe and the write end of its output pipe. The fork server forks; it writes
the child's pid (``!i``) to the status pipe at once, and its exit code (``!i``, ``-N``
for signal ``N``) when it ends, then closes the pipe. The child first makes descriptor
0 ``/dev/null``, 1 and 2 its output pipe, 3 its channel, and closes every other
descriptor (the control socket, the other children's status pipes) before it reads
anything; then it reads one frame, the pickled ``(entry, setup, payload)`` the host
sends (host data, trusted), and runs :func:`rho_actors.sandbox.child.child_main`.

When the control socket closes (the host stopped it, or died: even by ``SIGKILL``),
the fork server kills every process left in its tree (it is a child subreaper), reaps them and
exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import pickle
import select
import signal
import socket
import struct
import sys
import time
from typing import Any, Final

__all__ = ["FORK", "FORK_PID_NAMESPACE", "SPEC", "SPEC_TIMEOUT_S", "STATUS", "boot", "main"]

FORK: Final = b"F"
"""The request on the control socket: fork a child (three descriptors attached)."""
FORK_PID_NAMESPACE: Final = b"P"
"""The request to fork a child as PID 1 of a new PID namespace (three descriptors attached)."""
STATUS: Final = struct.Struct("!i")
"""A pid, then an exit code, on a child's status pipe."""
SPEC: Final = b"S"
"""The tag of the first frame on a child's channel: its pickled ``(entry, setup, payload)``."""
CHANNEL_FD: Final = 3
SPEC_TIMEOUT_S: Final = 30.0
"""How long one side waits for a child's setup (``SPEC``) frame, in seconds."""
_PRELOAD: Final = (
    "rho_actors.sandbox.worker", "rho_actors.sandbox.reads", "rho_actors.sandbox.plugins", "rho_actors.selftest",
)


class _Fd:
    """A bare descriptor with the two methods :class:`~rho_actors.sandbox.channel.Channel` uses."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _high(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)


def _become_child(channel: int, output: int) -> None:
    """In the forked child, before anything else: descriptors 0-3 only, default signals,
    a fresh ``multiprocessing`` authkey."""
    channel, output = _high(channel), _high(output)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    os.dup2(null, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.dup2(channel, CHANNEL_FD, inheritable=False)
    os.closerange(CHANNEL_FD + 1, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 1 << 20)
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    process = sys.modules.get("multiprocessing.process")
    if process is not None:  # its own authkey: no two children (nor the fork server) share one
        process.current_process().authkey = os.urandom(32)


def _run_child() -> None:
    """The forked child's life: read its spec from the host, then the sandbox entry."""
    from rho_actors.sandbox.channel import Channel
    from rho_actors.sandbox.child import child_main

    channel = Channel(_Fd(CHANNEL_FD))  # one Channel: what the host sent after the spec stays in it
    try:
        tag, body = channel.recv(time.monotonic() + SPEC_TIMEOUT_S)
        if tag != SPEC:
            os._exit(3)
        entry, setup, payload = pickle.loads(body)
    except BaseException:
        os._exit(3)
    child_main(channel, setup, entry, payload)
    os._exit(0)


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def _serve(control: socket.socket) -> None:
    """The fork server's loop until its control socket closes."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    status: dict[int, int] = {}  # child pid -> the write end of its status pipe
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        with contextlib.suppress(InterruptedError):
            events = dict(poller.poll())
        if wake_r in events:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
        _reap(status)
        if control.fileno() not in events:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, 16, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            return
        if data not in (FORK, FORK_PID_NAMESPACE) or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        channel, report, output = fds
        pid = _fork(data == FORK_PID_NAMESPACE)
        if pid == 0:
            try:
                _become_child(channel, output)
                _run_child()
            finally:
                os._exit(4)
        os.close(channel)
        os.close(output)
        with contextlib.suppress(OSError):
            os.write(report, STATUS.pack(pid))
        status[pid] = report


def _fork(pid_namespace: bool) -> int:
    """``os.fork()``, the child PID 1 of a new PID namespace when asked and possible."""
    if pid_namespace:
        from rho_actors.sandbox.confine import namespaces

        with contextlib.suppress(namespaces.NamespaceError):
            return namespaces.fork_into_pid_namespace()
    return os.fork()


def _reap(status: dict[int, int]) -> None:
    """Report every ended child's exit code on its status pipe (orphans adopted as a
    subreaper are reaped too, unreported)."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        report = status.pop(pid, None)
        if report is not None:
            with contextlib.suppress(OSError):
                os.write(report, STATUS.pack(_exit_code(code)))
            os.close(report)


def main(control_fd: int, preload: tuple[str, ...] = ()) -> None:
    """The fork server's main: preload the sandbox kernel (and ``preload``: installed
    libraries the host named, see :func:`rho_actors.sandbox.clean.preload_modules`; one
    that fails to import is skipped), serve, then kill what is left."""
    from rho_actors.sandbox.confine import confinement, trees

    confinement.guard_zygote()
    for name in _PRELOAD:
        __import__(name)
    for name in preload:
        with contextlib.suppress(Exception):
            __import__(name)
    from rho_actors.sandbox.child import resolve_ahead

    resolve_ahead(HOST_PATHS)
    gc.collect()
    gc.freeze()  # a child's collector never scans (so never copies) the objects it shares with the fork server
    control = socket.socket(fileno=control_fd)
    os.set_blocking(control_fd, True)
    try:
        _serve(control)
    finally:
        with contextlib.suppress(Exception):
            trees.end_own_tree()  # killed and reaped: no zombie left for the host's init to reap later
        os._exit(0)


HOST_PATHS: Final[list[str]] = []
"""The host's ``sys.path`` (in the fork server and its children; empty elsewhere):
what a child's ``sys.path`` becomes once it is confined
(:func:`rho_actors.sandbox.child.enter_child`). Until then ``sys.path`` holds the
kernel's folders only (the installation's, and rho_actors' own), so no file in another
host folder (the script's, a plugin folder) is ever imported with the host's uid."""


def boot(argv: list[str]) -> None:
    """``python -I -c`` entry: ``argv`` is ``[kernel_paths_json, control_fd, preload_json,
    host_paths_json]``; ``sys.path`` is the kernel's folders before anything of
    rho_actors is imported (:data:`BOOT`), the host's are kept in :data:`HOST_PATHS`."""
    paths: Any = json.loads(argv[0])
    sys.path[:] = [p for p in paths if isinstance(p, str)]
    host: Any = json.loads(argv[3])
    HOST_PATHS[:] = [p for p in host if isinstance(p, str)]
    preload: Any = json.loads(argv[2])
    main(int(argv[1]), tuple(p for p in preload if isinstance(p, str)))


BOOT: Final = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from rho_actors.sandbox.zygote import boot; boot(sys.argv[1:])"
)
"""The ``-c`` program that starts the fork server."""
