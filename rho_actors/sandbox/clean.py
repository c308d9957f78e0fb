"""The host's side of the clean fork server (internal; DESIGN §5 "A clean start").

Every untrusted child (worker, declaration read, plugin discovery, selftest: a
:class:`~rho_actors.sandbox.child.ChildSetup` with ``clean=True``) is forked by rho's
own fork server, :mod:`rho_actors.sandbox.zygote`, never by ``multiprocessing``: that
one re-imports the host's main script in every child (its globals, the secrets its top
level read, the files it opened) and hands each child the host's authkey. The fork
server is started once per host process, on the first clean child, as
``python -I -c <boot>`` with an environment built from
:data:`~rho_actors.sandbox.confine.enclosure.ENV_ALLOWLIST` (not the host's, scrubbed),
``cwd=/``, no descriptor but its control socket, and the host's ``sys.path`` folders
named explicitly (it imports from the installation's folders only, and its children
get the others once confined); it is restarted when found dead, and stopped by :func:`stop_zygote`
(or when the host ends: it then kills its whole tree).

:func:`spawn_clean` forks one child there and returns a :class:`CleanProcess` (the
handle the rest of the sandbox already uses for a ``multiprocessing`` process: ``pid``,
``sentinel``, ``exitcode``, ``join``, ``close``) and the host's end of its channel. The
child's standard output and error go to :data:`~rho_actors.sandbox.output.PUMP`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from rho_actors.otp.pidfds import PidFd
from rho_actors.sandbox.channel import Channel
from rho_actors.sandbox.child import ChildSetup
from rho_actors.sandbox.confine.code_paths import installation_prefixes
from rho_actors.sandbox.confine.enclosure import scrubbed_env
from rho_actors.sandbox.output import PUMP, OutputStream
from rho_actors.sandbox.zygote import BOOT, FORK, FORK_PID_NAMESPACE, SPEC, SPEC_TIMEOUT_S, STATUS

__all__ = ["CleanProcess", "preload_modules", "spawn_clean", "stop_zygote", "zygote_pid"]

_START_TIMEOUT_S: Final = 30.0
"""How long the fork server may take to start and report a child's pid."""


def _paths() -> list[str]:
    """The host's ``sys.path`` as absolute folders (``""`` is the working directory)."""
    return list(dict.fromkeys(os.path.abspath(p or os.getcwd()) for p in sys.path if isinstance(p, str)))


def _kernel_paths(paths: list[str]) -> list[str]:
    """The folders the fork server itself imports from: those of ``paths`` inside the
    Python installation, then the folder rho_actors comes from when it is elsewhere (a
    checkout). Never the host script's folder or any other: a file there (an untrusted
    plugin beside the script, named as a module the fork server imports, or as an
    optional one nobody installed) would run with the host's uid. A folder is inside by
    its real path, as the prefixes are (a virtualenv reached through a symbolic link)."""
    prefixes = installation_prefixes()
    inside = [p for p in paths if any((real := os.path.realpath(p)) == f or real.startswith(f.rstrip(os.sep) + os.sep)
                                      for f in prefixes)]
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rho_actors' folder's
    return list(dict.fromkeys([*inside, package] if package in paths else inside))


class _Zygote:
    """The fork server of this host process (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._owner = 0

    def _start_locked(self) -> socket.socket:
        self._stop_locked()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            paths = _paths()
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOT, json.dumps(_kernel_paths(paths)), str(theirs.fileno()),
                 json.dumps(_PRELOADS), json.dumps(paths)],
                pass_fds=(theirs.fileno(),), env=scrubbed_env(), cwd="/", stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, close_fds=True, start_new_session=True,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self._control, self._owner = mine, os.getpid()
        return mine

    def _stop_locked(self) -> None:
        control, proc = self._control, self._proc
        self._control = self._proc = None
        if control is not None and self._owner == os.getpid():
            control.close()
        if proc is not None and self._owner == os.getpid():
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)

    def fork(self, fds: list[int], request: bytes = FORK) -> None:
        """Ask the fork server for one child with these three descriptors (``request``:
        :data:`~rho_actors.sandbox.zygote.FORK` or ``FORK_PID_NAMESPACE``); raises
        ``OSError`` when it cannot be reached even once restarted."""
        with self._lock:
            for attempt in (1, 2):
                control = self._control
                if control is None or self._owner != os.getpid() or (
                    self._proc is not None and self._proc.poll() is not None
                ):
                    control = self._start_locked()
                try:
                    socket.send_fds(control, [request], fds)
                    return
                except OSError:
                    if attempt == 2:
                        raise
                    self._stop_locked()

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def pid(self) -> int | None:
        with self._lock:
            proc = self._proc
            return proc.pid if proc is not None and proc.poll() is None else None


_ZYGOTE: Final = _Zygote()
_PRELOADS: list[str] = []


def preload_modules(*names: str) -> None:
    """Have the clean fork server import the modules ``names`` (installed libraries the
    tools' modules import, such as ``numpy``) once, before it forks, so a child does not
    pay for importing them; from the next start of the fork server on (:func:`stop_zygote`
    restarts it). They are imported in the clean interpreter (allowlisted environment, no
    host code), so name installed libraries only, never the host's own modules; a name
    that fails to import there is skipped. Raises ``TypeError`` for a name that is not a
    ``str``."""
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a module name must be a str, not {type(name).__name__}")
        if name not in _PRELOADS:
            _PRELOADS.append(name)


def stop_zygote() -> None:
    """Stop the fork server (it kills every process left in its tree); the next clean
    child starts another."""
    _ZYGOTE.stop()


def zygote_pid() -> int | None:
    """The fork server's pid while it runs (``None``: not running)."""
    return _ZYGOTE.pid()


class CleanProcess:
    """A child of the clean fork server: ``pid``; ``sentinel``, readable once it ended;
    ``exitcode`` (``-N`` for signal ``N``; ``None`` while it runs); ``output``, the
    stream its output is logged from. Thread-safe."""

    def __init__(self, pid: int, status_fd: int, output: OutputStream) -> None:
        self.pid = pid
        self.sentinel = status_fd
        self.output = output
        self._code: int | None = None
        self._closed = False
        self._lock = threading.Lock()

    def _poll(self, timeout_s: float | None) -> int | None:
        if self._code is not None or self._closed:
            return self._code
        ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        poller = select.poll()
        poller.register(self.sentinel, select.POLLIN)
        if not poller.poll(ms):  # waits without the lock: others may look meanwhile
            return None
        with self._lock:
            if self._code is not None or self._closed:
                return self._code
            if not poller.poll(0):
                return None
            data = os.read(self.sentinel, STATUS.size)
            if len(data) == STATUS.size:
                self._code = STATUS.unpack(data)[0]
            else:  # the fork server itself is gone: so is this child (its tree was killed)
                self._code = -9
            return self._code

    @property
    def exitcode(self) -> int | None:
        """The child's exit code (negative: the signal that ended it), ``None`` while it runs."""
        return self._poll(0)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the child to end, at most ``timeout`` seconds (``None``: no bound), as
        ``multiprocessing.Process.join``; it is reaped once it has."""
        self._poll(timeout)

    def is_alive(self) -> bool:
        """Whether the child still runs."""
        return self._poll(0) is None

    def close(self) -> None:
        """Release the sentinel; raises ``ValueError`` while the child runs."""
        if self._poll(0) is None:
            raise ValueError("the child process is still running")
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.sentinel)


def _read_pid(status_r: int) -> int:
    poller = select.poll()
    poller.register(status_r, select.POLLIN)
    if not poller.poll(int(_START_TIMEOUT_S * 1000)):
        raise OSError(f"the clean fork server did not start a child within {_START_TIMEOUT_S:g} s")
    data = os.read(status_r, STATUS.size)
    if len(data) != STATUS.size:
        raise OSError("the clean fork server ended before it started the child")
    pid: int = STATUS.unpack(data)[0]
    return pid


def spawn_clean(
    entry: Callable[[Channel, Any], None], payload: Any, setup: ChildSetup, *, label: str, keep_peer: bool = False
) -> tuple[CleanProcess, Channel]:
    """Fork a child in the clean fork server that runs
    :func:`~rho_actors.sandbox.child.child_main` ``(channel, setup, entry, payload)``
    (see :mod:`rho_actors.sandbox.zygote`);
    ``entry`` travels by reference, ``setup`` and ``payload`` pickled. ``label`` names
    the child in its logged output. Raises ``OSError`` when no child could be started
    (nothing is left open then)."""
    spec = pickle.dumps((entry, setup, payload), protocol=pickle.HIGHEST_PROTOCOL)
    peer = -1
    parent, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            confinement = setup.confinement
            own_pids = confinement is not None and confinement.namespaces and confinement.pid_namespace
            _ZYGOTE.fork([child_end.fileno(), status_w, out_w], FORK_PID_NAMESPACE if own_pids else FORK)
            peer = os.dup(child_end.fileno()) if keep_peer else -1  # (Channel.unread_by_child)
        finally:
            child_end.close()
            os.close(status_w)
            os.close(out_w)
        pid = _read_pid(status_r)
    except BaseException:
        parent.close()
        os.close(status_r)
        os.close(out_r)
        if peer >= 0:
            os.close(peer)
        raise
    proc = CleanProcess(pid, status_r, PUMP.add(out_r, f"{label} (pid {pid})"))
    channel = Channel(parent, status_r, peer)
    try:
        channel.send(SPEC, spec, time.monotonic() + SPEC_TIMEOUT_S)
    except BaseException:
        held = PidFd.open(pid)
        held.kill()
        held.close()
        proc.join(5.0)
        channel.close()
        with contextlib.suppress(ValueError):
            proc.close()
        raise OSError(f"could not send its setup to the child {pid}") from None
    return proc, channel
