"""Starting, killing and reaping the child processes of the sandbox (internal).

Untrusted children (``ChildSetup.clean``) are forked by rho's clean fork server
(:mod:`rho_actors.sandbox.clean`), which never imported the host's code. Trusted
children start with ``multiprocessing``'s ``forkserver`` start method (``spawn``
works too; a bare ``fork`` of this multi-threaded runtime is refused). The first
:func:`context` for ``forkserver`` asks the fork server to preload
``rho_actors.sandbox`` (and so the rho_actors package), which makes a child ready in a
few milliseconds; that only takes effect when the fork server is not running yet, and
it adds ``"__main__"`` and ``"rho_actors.sandbox"`` (and what
:func:`preload_trusted_modules` adds) to the host's preload list (``["__main__"]`` by
default), which the last :func:`release_servers` gives back. A fork server rho did not
start, or that the host's own processes use, is never stopped, nor a resource tracker
another process holds.
Nothing happens at import.

Every child is started by :func:`spawn` with one entry point,
:func:`rho_actors.sandbox.child.child_main`, which runs
:func:`rho_actors.sandbox.child.enter_child` before anything else.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.process
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from loguru import logger

from rho_actors.otp.pidfds import PidFd
from rho_actors.sandbox.channel import Channel
from rho_actors.sandbox.child import ChildSetup, child_main

__all__ = [
    "START_METHODS",
    "Child",
    "ServerWatch",
    "close",
    "context",
    "hold_servers",
    "kill_groups",
    "mib",
    "preload_trusted_modules",
    "reap",
    "release_servers",
    "signal_name",
    "spawn",
]

START_METHODS: Final = ("forkserver", "spawn")
_SERVER_END_WAIT_S: Final = 5.0
"""How long a child's start waits for a fork server it found ending to end (seconds)."""
_SERVER_STOP_S: Final = 5.0
"""How long the last :func:`release_servers` waits for the fork server or resource
tracker it ends to exit before it kills it (and again for the kill; seconds)."""

_preload_lock = threading.Lock()
_preload_asked: list[tuple[list[str], list[str], bool, bool]] = []
"""Once asked: (the host's preload list, rho's, whether rho starts the fork server, and the resource tracker)."""
_PRELOADS = ["__main__", "rho_actors.sandbox"]
_holders = [0]  # systems and pools using the fork server now
_spawned: list[int] = []  # the pids of the children rho started from the fork server since it was last given back


def hold_servers() -> None:
    """Count one more user of ``multiprocessing``'s fork server and resource tracker
    (a system, a worker pool, a selftest run); :func:`release_servers` when done. The first
    adds rho's modules to the fork server's preload list (:func:`_ask_preload`): while held
    only, so that the last release gives it back, whoever starts a child when."""
    with _preload_lock:
        _holders[0] += 1
        _ask_preload()


def release_servers() -> None:
    """One user fewer; the last one stops rho's clean fork server
    (:mod:`rho_actors.sandbox.clean`, which kills every process left in its tree) and
    gives back what rho took of the host's process-wide state (:func:`_give_back`).
    Each starts again on the next child."""
    with _preload_lock:
        _holders[0] -= 1
        if _holders[0] > 0:
            return
        _holders[0] = 0
        _give_back()
        from rho_actors.sandbox.clean import stop_zygote

        stop_zygote()


def _give_back() -> None:
    """The host's ``multiprocessing`` state as rho found it (holding the lock): the fork
    server's preload list back to the host's (unless the host changed it meanwhile),
    and the fork server stopped only when rho started it and no process of the host's
    own runs from it (it kills its tree when it ends: :func:`rho_actors.sandbox.confine.
    confinement.guard_fork_server`), with the resource tracker it started, unless
    another process holds that tracker's pipe (a host's own pool's workers: stopping it
    would wait for them to end)."""
    if not _preload_asked:
        return
    from multiprocessing import forkserver, resource_tracker

    server, tracker = forkserver._forkserver, resource_tracker._resource_tracker
    host_preload, ours, server_ours, tracker_ours = _preload_asked.pop()
    if list(getattr(server, "_preload_modules", ())) == ours:
        forkserver.set_forkserver_preload(host_preload)
    pid = getattr(server, "_forkserver_pid", None)
    if not server_ours or pid is None or _runs_host_children(pid):
        return
    _end_server(server, "_forkserver_pid", "_forkserver_alive_fd", "the fork server")
    if tracker_ours and not _shared_pipe(getattr(tracker, "_fd", None)):  # not the host's, nor another's pipe
        _end_server(tracker, "_pid", "_fd", "the resource tracker")


def _end_server(server: Any, pid_name: str, fd_name: str, what: str) -> None:
    """``multiprocessing``'s ``_stop`` of its fork server or resource tracker, bounded
    (its own waits with none): close the pipe whose end tells the server to exit, reap it
    within :data:`_SERVER_STOP_S`, else SIGKILL its tree and reap it. A process forked from
    the fork server holds a copy of that pipe until it closes it as it begins (a worker
    stopped before that point, by a tool's ``SIGSTOP``, held it for good): the server never
    sees the end while one lives, and the stop waited for it forever."""
    with server._lock:
        pid, fd = getattr(server, pid_name, None), getattr(server, fd_name, None)
        if not isinstance(pid, int) or not isinstance(fd, int):
            return  # not running
        with contextlib.suppress(OSError):
            os.close(fd)
        setattr(server, fd_name, None)
        if not _reaped(pid, _SERVER_STOP_S):
            from rho_actors.sandbox.confine.trees import kill_tree

            logger.warning("{} (pid {}) did not exit within {:g} s of its release: a process it forked still "
                           "holds its pipe; its tree is killed", what, pid, _SERVER_STOP_S)
            with contextlib.suppress(Exception):
                kill_tree(pid)
            if not _reaped(pid, _SERVER_STOP_S):
                logger.warning("{} (pid {}) was killed but not reaped within {:g} s", what, pid, _SERVER_STOP_S)
        setattr(server, pid_name, None)
        address = getattr(server, "_forkserver_address", None)
        if isinstance(address, str):
            from multiprocessing import util

            if not util.is_abstract_socket_namespace(address):
                with contextlib.suppress(OSError):
                    os.unlink(address)
            server._forkserver_address = None


def _reaped(pid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for this process's child ``pid`` to exit, and reap
    it; whether it was reaped (by this wait, or already by another)."""
    until, pause = time.monotonic() + timeout_s, 0.001
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:
            return True
        left = until - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, pause))
        pause = min(pause * 2, 0.05)


def _shared_pipe(fd: int | None) -> bool:
    """Whether a process other than this one holds the pipe whose end ``fd`` is
    (``/proc/*/fd``; a process it cannot read is taken to hold it)."""
    if fd is None:
        return False
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return True
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        except OSError:
            continue  # another user's process: never one of this host's children
        for name in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{name}") == target:
                    return True
    return False


def _runs_host_children(pid: int) -> bool:
    """Whether the fork server ``pid`` has a live child that rho did not start (rho's
    were all killed by now, though the fork server may not have reaped them yet)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            children = [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return True  # unknown: leave it running
    ours, _spawned[:] = set(_spawned), []
    for child in children:
        if child in ours:
            continue
        try:
            with open(f"/proc/{child}/stat", encoding="ascii") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue  # ended, not yet reaped
        except (OSError, IndexError):
            continue  # gone
        return True
    return False


def _ask_preload() -> None:
    """Add rho's modules to the fork server's preload list (the host's own choices
    kept), once until :func:`release_servers` (holding the lock); remember whether rho
    starts the fork server."""
    if not _preload_asked:
        from multiprocessing import forkserver, resource_tracker

        server = forkserver._forkserver
        host_preload = list(getattr(server, "_preload_modules", ["__main__"]))
        ours = host_preload + [name for name in _PRELOADS if name not in host_preload]
        forkserver.set_forkserver_preload(ours)
        _preload_asked.append((host_preload, ours, getattr(server, "_forkserver_pid", None) is None,
                               getattr(resource_tracker._resource_tracker, "_pid", None) is None))


def preload_trusted_modules(*names: str) -> None:
    """Have ``multiprocessing``'s fork server (trusted children's) import the modules
    ``names`` once, before it forks, so a trusted worker or server does not pay for
    importing them; from the fork server's next start on (the last holder's
    :func:`release_servers` stops it). Raises ``TypeError`` for a name that is not a
    ``str``. (Untrusted children: :func:`rho_actors.sandbox.clean.preload_modules`.)"""
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a module name must be a str, not {type(name).__name__}")
    with _preload_lock:
        _PRELOADS.extend(name for name in dict.fromkeys(names) if name not in _PRELOADS)
        if _preload_asked:
            from multiprocessing import forkserver

            host_preload, ours, server_ours, tracker_ours = _preload_asked[0]
            ours = ours + [name for name in _PRELOADS if name not in ours]
            forkserver.set_forkserver_preload(ours)
            _preload_asked[0] = (host_preload, ours, server_ours, tracker_ours)


def context(start_method: str) -> Any:
    """The multiprocessing context for ``start_method`` (``forkserver`` or ``spawn``).
    Raises ``ValueError`` otherwise."""
    if start_method not in START_METHODS:
        raise ValueError(
            f"start_method must be one of {', '.join(START_METHODS)}, not {start_method!r} "
            "(the runtime is multi-threaded: a bare fork is unsafe)"
        )
    return multiprocessing.get_context(start_method)


class ServerWatch:
    """Whether the fork server ``pid`` (``multiprocessing``'s, or rho's clean one) that
    forked a child has ended: :meth:`gone`, one ``poll`` of a pidfd opened while it ran
    (so a reused pid is never taken for it). One per fork server (:func:`watch_server`)."""

    __slots__ = ("_fd", "_gone", "pid")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._gone = False
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self._fd, self._gone = None, True
        except (OSError, AttributeError):  # no pidfd here: never said gone
            self._fd = None

    @property
    def fd(self) -> int | None:
        """The fork server's pidfd (readable once it has ended); ``None`` without one."""
        return self._fd

    def gone(self) -> bool:
        """Whether the fork server has ended (it may not be reaped yet)."""
        if self._gone or self._fd is None:
            return self._gone
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        self._gone = bool(poller.poll(0))
        return self._gone

    def wait_gone(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the fork server to end; whether it has."""
        if self._gone or self._fd is None:
            return self._gone
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        self._gone = bool(poller.poll(max(0, int(timeout_s * 1000))))
        return self._gone

    def __del__(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)


_watches: dict[int, ServerWatch] = {}


def watch_server(pid: int | None) -> ServerWatch | None:
    """The :class:`ServerWatch` of the fork server ``pid`` (``None``: none known)."""
    if pid is None:
        return None
    with _preload_lock:
        watch = _watches.get(pid)
        if watch is None or watch.gone():  # a new fork server (a reused pid too)
            for old in [p for p, w in _watches.items() if w.gone()]:
                del _watches[old]
            watch = _watches[pid] = ServerWatch(pid)
        return watch


def _forkserver_pid() -> int | None:
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


@dataclass(slots=True)
class Child:
    """A started child process, the parent's end of its channel, the watch of the
    fork server that forked it (``None``: ``spawn``, or unknown), and its pidfd
    (``held``, opened as it started: what kills its group, never a group given its pid
    since; :mod:`rho_actors.otp.pidfds`)."""

    proc: Any
    channel: Channel
    server: ServerWatch | None
    held: PidFd

    @property
    def pid(self) -> int:
        pid: int = self.proc.pid
        return pid

    def discard(self) -> None:
        """Kill the child's process group, reap it and close its channel: a child whose
        start was interrupted before anyone held it (never left running)."""
        self.held.kill(group=True)
        reap(self.proc, _SERVER_END_WAIT_S)
        close(self.proc, self.channel)
        self.held.close()


def spawn(
    ctx: Any, entry: Callable[[Channel, Any], None], payload: Any, setup: ChildSetup, *, name: str,
    label: str | None = None, keep_peer: bool = False,
) -> Child:
    """Start a child that runs ``entry(channel, payload)`` after
    :func:`~rho_actors.sandbox.child.enter_child` ``(setup)``; ``entry`` must be a
    module-level function (it travels by reference). A ``setup.clean`` child (every
    untrusted one) is forked by the clean fork server
    (:func:`~rho_actors.sandbox.clean.spawn_clean`; ``ctx`` is not used, ``label``, by
    default ``name``, names it in its logged output); any other by ``ctx``. Raises what
    starting a process raises (``OSError``...); nothing is left open then. ``keep_peer``
    (a worker): the channel keeps a copy of the child's end (:meth:`Channel.unread_by_child`)."""
    if setup.clean:
        from rho_actors.sandbox.clean import spawn_clean, zygote_pid

        proc, channel = spawn_clean(entry, payload, setup, label=label or name, keep_peer=keep_peer)
        return Child(proc, channel, watch_server(zygote_pid()), PidFd.open(proc.pid))
    forkserver = ctx.get_start_method() == "forkserver"
    for attempt in (1, 2):
        server = watch_server(_forkserver_pid()) if forkserver else None
        parent_end, child_end = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=child_main, args=(child_end, setup, entry, payload), name=name)
        peer = -1
        try:
            proc.start()
            peer = os.dup(child_end.fileno()) if keep_peer else -1
            break
        except (OSError, EOFError):
            close(proc, parent_end)
            # the fork server is ending (killed from outside): once it has, multiprocessing starts another
            if attempt == 2 or server is None or not server.wait_gone(_SERVER_END_WAIT_S):
                raise
        except BaseException:
            close(proc, parent_end)
            raise
        finally:
            child_end.close()
    try:
        # This module reaps its children itself: a second thread polling the same fork-server
        # child could read its exit status first (and leave 255 in its place), so the child
        # leaves multiprocessing's own bookkeeping (its one private name used here).
        children = getattr(multiprocessing.process, "_children", None)
        if children is not None:
            children.discard(proc)
        with _preload_lock:
            _spawned.append(proc.pid)
            if len(_spawned) > 1024:  # a long-lived system: only the ones still running matter
                _spawned[:] = [p for p in _spawned if os.path.exists(f"/proc/{p}")]
        return Child(proc, Channel(parent_end, proc.sentinel, peer),
                     watch_server(_forkserver_pid()) if forkserver else None, PidFd.open(proc.pid))
    except BaseException:  # interrupted once it ran (a signal handler's KeyboardInterrupt): no child left running
        held = PidFd.open(proc.pid)
        held.kill(group=True)
        held.close()
        reap(proc, _SERVER_END_WAIT_S)
        close(proc, parent_end)
        if peer >= 0:
            os.close(peer)
        raise


def kill_groups(held: set[PidFd]) -> None:
    """``SIGKILL`` the process group each of ``held`` leads (:meth:`PidFd.kill`: never a
    group given its pid since)."""
    for process in list(held):
        process.kill(group=True)


def reap(proc: Any, timeout_s: float) -> int | None:
    """Wait up to ``timeout_s`` seconds for ``proc`` to end; its exit code (``-N`` for
    signal ``N``) or ``None`` if it is still running."""
    proc.join(timeout_s)
    code = proc.exitcode
    return code if isinstance(code, int) else None


def close(proc: Any, *conns: Any) -> None:
    """Release ``conns`` and the process handle ``proc`` (once it has ended)."""
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.close()
    with contextlib.suppress(ValueError):
        proc.close()


def signal_name(signum: int) -> str:
    """``"SIGSEGV (Segmentation fault)"`` for ``signum``; ``"signal N"`` if unknown."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    description = signal.strsignal(signum)
    return f"{name} ({description})" if description else name


def mib(n: int | None) -> str:
    """A heap bound in MiB for messages (``"unbounded"`` for none)."""
    return "unbounded" if not n or n <= 0 else f"{n / 2**20:g} MiB"
