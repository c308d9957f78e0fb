"""OS confinement of a child process that runs untrusted code (DESIGN §5, "Confinement").

A :class:`Confinement` is plain data the host builds and ships to the child; the child
calls :func:`apply` first, before any tool code runs, and from then on it (and all it
starts) runs as an unprivileged identity, under resource limits, inside a Landlock
filesystem sandbox, in a session of its own, and dies with its parent. On the host:

- :func:`probe` says which mechanisms this machine offers and why not (for
  ``system.stats()``); :func:`warn_if_unconfined` logs once when neither uid separation
  nor Landlock is available.
- :func:`kill_tree` kills a process and every descendant (``setsid`` escapes included);
  :class:`rho_actors.sandbox.confine.cgroups.Cgroup` bounds a worker's whole tree in the kernel, and
  :class:`RssSampler` is the fallback when no cgroup can be created.
- :func:`classify_ending` turns how a worker ended into the error kind that says so.
- :func:`make_private_dir` and :func:`make_session_dir` create folders with the right
  owner and mode ``0700``.

Importing this module in a ``multiprocessing`` fork server (``set_forkserver_preload``)
makes that fork server a child subreaper that kills its whole tree when it exits (it
exits when the host dies or stops): see :func:`guard_fork_server`.

Identity. When the host runs as root, a confined child drops to a uid (and gid) of its
own, leased from ``uid_range`` (:mod:`rho_actors.sandbox.confine.uids`; the host fills
in ``uid``/``gid`` per child), else to ``uid``/``gid`` (default :data:`DEFAULT_UID` =
65534, ``nobody``), with no supplementary groups, no capabilities and
``PR_SET_NO_NEW_PRIVS``; it can then neither signal the host nor read a ``0700`` folder
of the host, nor share a per-uid kernel counter with another child. A host that is not
root cannot change uid: its children keep the host's uid and rely on Landlock, which
(ABI 6, Linux 6.12) also forbids signals to any process outside the child's own domain.
A user namespace is reported by :func:`probe` but not used: a same-uid process in one
can still signal the host.
The Python installation must be readable by the dropped uid (not under ``/root``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import pwd
import resource
import signal
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

from loguru import logger

from rho_actors.sandbox.confine import cgroups, landlock, namespaces, seccomp, uids
from rho_actors.sandbox.confine.code_paths import installation_prefixes, split_sys_path
from rho_actors.sandbox.confine.libc import LIBC, PR_SET_CHILD_SUBREAPER, checked
from rho_actors.sandbox.confine.trees import end_own_tree

__all__ = [
    "DEFAULT_DISK_BYTES",
    "DEFAULT_UID",
    "SYSTEM_READ_PATHS",
    "Confinement",
    "ConfinementError",
    "Probe",
    "apply",
    "available",
    "binds_threads",
    "disk_bound",
    "guard_fork_server",
    "guard_zygote",
    "release_host_pipes",
    "make_private_dir",
    "make_session_dir",
    "probe",
    "python_read_paths",
    "warn_if_unconfined",
]

DEFAULT_UID: Final = 65534
"""The uid (and gid) a root host's confined children drop to by default: ``nobody``."""

DEFAULT_DISK_BYTES: Final = 64 * 2**20
"""The default size of a confined child's private folder (its tmpfs): 64 MiB."""

SYSTEM_READ_PATHS: Final = (
    "/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime", "/etc/ssl",
    "/etc/ca-certificates", "/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf",
    "/etc/passwd", "/etc/group", "/etc/mime.types", "/dev/urandom", "/dev/random",
    "/dev/zero", "/proc/self",
)  # fmt: skip
"""What any Python program reads besides its own installation (missing ones are skipped)."""

_PR_SET_PDEATHSIG: Final = 1
_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_GET_CHILD_SUBREAPER: Final = 37


class ConfinementError(OSError):
    """A confinement step failed in the child; the message names the step. The child
    must not run tool code after it."""


def _prctl(option: int, value: int, what: str) -> None:
    checked(LIBC.prctl(option, ctypes.c_ulong(value), 0, 0, 0), ConfinementError, what)


@dataclass(frozen=True)
class Confinement:
    """What :func:`apply` does in a child; plain, picklable data. Sizes are bytes,
    ``None`` leaves a limit as inherited.

    ``uid``/``gid``: identity to drop to (only when the child starts as root).
    ``read_only``/``read_write``: Landlock paths (see :func:`python_read_paths`),
    ``list_only``: folders whose entries may be listed, not read; the
    ``private_dir`` is added to ``read_write`` and becomes ``HOME``, ``TMPDIR`` and the
    working directory. ``landlock=False`` skips Landlock. ``nproc`` (``RLIMIT_NPROC``,
    processes of the dropped uid machine-wide), ``nofile``, ``fsize``, ``address_space``
    (``RLIMIT_AS``, per process), ``core`` (0: no core files). ``pdeathsig``: signal the
    child gets when its parent ends (0: none); ``parent_pid``: the parent it must still
    have once that is set (``None``: the guarded fork server, else unchecked).
    ``new_session``: ``setsid()`` (own session and process group, no controlling
    terminal). ``subreaper``: orphans of the tool's processes reparent to the child, so
    :func:`kill_tree` of the child finds them. ``cgroup_procs``: ``cgroup.procs`` files the
    child joins (:attr:`rho_actors.sandbox.confine.cgroups.Cgroup.procs_files`) before dropping root.
    ``host_tracker``: keep the pipe to the host's ``multiprocessing`` resource tracker,
    which every fork server child inherits (``False``: close it; that tracker runs as the
    host and unlinks every shared memory or semaphore name registered with it when it
    ends, and holds each in memory until then; a child that needs one starts its own,
    confined as it is).

    ``uid_range``: the :class:`~rho_actors.sandbox.confine.uids.UidRange` each child's own
    uid comes from (a root host leases one per child and sets ``uid``/``gid`` to it;
    ``None``: every child drops to ``uid``/``gid``).

    ``namespaces``: new IPC and mount namespaces, and a network namespace with only its
    own loopback unless ``network=True``, and with ``pid_namespace`` a PID namespace of
    which the child is PID 1, with its own ``/proc`` (the clean fork server forks it
    there; a child not forked so refuses to run)
    (:mod:`rho_actors.sandbox.confine.namespaces`; needs a root host).
    ``network=True`` is the opt-in for tools that need the host's network (they can then
    reach its loopback services too). ``disk_bytes``: the private folder is a tmpfs of
    this size (bytes, default 64 MiB; its pages count against the memory bound too;
    ``None``: the folder stays on the host's disk, bounded per file by ``fsize`` only).
    ``seccomp``: the syscall filter of :mod:`rho_actors.sandbox.confine.seccomp`, loaded last (needs
    ``no_new_privs``); ``seccomp_filter`` is its compiled program (``None``: compiled
    in the child).
    Raises ``ValueError`` for ``seccomp`` without ``no_new_privs`` or a ``disk_bytes``
    below 1 MiB."""

    uid: int | None = DEFAULT_UID
    gid: int | None = DEFAULT_UID
    no_new_privs: bool = True
    landlock: bool = True
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    list_only: tuple[str, ...] = ()
    private_dir: str | None = None
    nproc: int | None = 64
    nofile: int | None = 256
    fsize: int | None = 64 * 2**20
    address_space: int | None = 256 * 2**20
    core: int = 0
    pdeathsig: int = signal.SIGKILL
    parent_pid: int | None = None
    new_session: bool = True
    subreaper: bool = True
    cgroup_procs: tuple[str, ...] = ()
    host_tracker: bool = False
    namespaces: bool = True
    network: bool = False
    disk_bytes: int | None = DEFAULT_DISK_BYTES
    seccomp: bool = True
    seccomp_filter: bytes | None = None
    uid_range: uids.UidRange | None = uids.DEFAULT_UID_RANGE
    pid_namespace: bool = True

    def __post_init__(self) -> None:
        if self.seccomp and not self.no_new_privs:
            raise ValueError("Confinement(seccomp=True) needs no_new_privs=True (seccomp filters need it)")
        if self.disk_bytes is not None and (not isinstance(self.disk_bytes, int) or self.disk_bytes < 2**20):
            raise ValueError(f"Confinement(disk_bytes={self.disk_bytes!r}): give bytes, at least 1 MiB, or None")


_fork_server: list[int] = []  # this fork server's pid, once guard_fork_server() ran in it


def _threads() -> int:
    # read as bytes: a text file's first open in a fresh child costs 1 ms of CPU (PROFILE.md §33)
    with open("/proc/self/status", "rb") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(b"Threads:"))


def apply(spec: Confinement) -> tuple[str, ...]:
    """Confine this process as ``spec`` says; call it first in a fresh, single-threaded
    child, before any tool code. Returns the names of the mechanisms applied (a subset of
    ``pdeathsig``, ``session``, ``subreaper``, ``cgroup``, ``pid_namespace``, ``ipc_namespace``,
    ``mount_namespace``, ``no_atime``, ``network_namespace``, ``disk_bound``, ``rlimits``,
    ``no_new_privs``, ``landlock``, ``identity``, ``seccomp``, in that order): Landlock is
    skipped when the kernel lacks it, identity when the child is not root. Raises
    :class:`ConfinementError` naming the failed step
    (the caller must then exit without running tool code); if the parent already died,
    the child kills itself with ``pdeathsig``.

    A ``spec`` that binds threads (``no_new_privs``, ``landlock``, ``seccomp``,
    ``namespaces``, or a uid to drop to) needs a single-threaded process: a thread
    already running would escape them, so it is refused (:func:`binds_threads`). A
    spec that contains the tree only (a trusted worker's: session, subreaper, cgroup,
    rlimits) applies in any process, one whose import started threads included."""
    if binds_threads(spec) and _threads() != 1:
        raise ConfinementError(0, "apply() needs a single-threaded process (Landlock and no_new_privs bind one thread)")
    done = []
    if spec.pdeathsig:
        _prctl(_PR_SET_PDEATHSIG, spec.pdeathsig, "PR_SET_PDEATHSIG")
        forked_from = [pid for pid in _fork_server if pid != os.getpid()]
        expected = spec.parent_pid or (forked_from[0] if forked_from else None)
        if expected is not None and _parent_pid() != expected:  # it died before the signal was armed
            os.kill(os.getpid(), spec.pdeathsig)
            os._exit(1)  # PID 1 of a PID namespace ignores a signal it sends itself
        done.append("pdeathsig")
    _release_fork_server()
    if not spec.host_tracker:
        _release_resource_tracker()
    if spec.new_session:
        with contextlib.suppress(PermissionError):  # already a group leader
            os.setsid()
        done.append("session")
    if spec.subreaper:
        _prctl(PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")
        done.append("subreaper")
    if spec.cgroup_procs:
        done.append(_join_cgroup(spec.cgroup_procs))
    if spec.namespaces:  # as root, before the mounts they allow, Landlock and the uid drop
        done += _enter_namespaces(spec)
    _set_limits(spec)
    done.append("rlimits")
    if spec.private_dir is not None:
        os.chdir(spec.private_dir)
        os.environ.update(HOME=spec.private_dir, TMPDIR=spec.private_dir)
        tempfile.tempdir = None
    if spec.no_new_privs:
        _prctl(_PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
        done.append("no_new_privs")
    if spec.landlock:
        writable = (*spec.read_write, "/dev/null", *(() if spec.private_dir is None else (spec.private_dir,)))
        try:
            landlock.restrict_self(spec.read_only, writable, spec.list_only)
            done.append("landlock")
        except landlock.LandlockError as exc:
            if exc.errno not in (38, 95):  # ENOSYS, EOPNOTSUPP: no Landlock here (probe() said so)
                raise ConfinementError(exc.errno, f"Landlock: {exc.strerror}") from None
    if spec.uid is not None and os.geteuid() == 0:
        _drop_identity(spec.uid, DEFAULT_UID if spec.gid is None else spec.gid)
        done.append("identity")
    if spec.seccomp:  # last: nothing after it needs a denied call
        done.append(_load_seccomp(spec))
    return tuple(done)


def binds_threads(spec: Confinement) -> bool:
    """Whether ``spec`` asks for a mechanism that binds only the threads it is applied in
    (or that the kernel refuses in a multi-threaded process): ``no_new_privs``,
    Landlock, seccomp, namespaces, a uid to drop to."""
    return spec.no_new_privs or spec.landlock or spec.seccomp or spec.namespaces or spec.uid is not None
def _parent_pid() -> int:
    """This process's parent's pid; as PID 1 of a PID namespace (whose ``getppid()`` is
    0) the one the host's ``/proc`` shows, read before the namespace's own is mounted."""
    parent = os.getppid()
    if parent:
        return parent
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def release_host_pipes() -> None:
    """Close this child's copies of ``multiprocessing``'s fork-server "alive" pipe and
    resource-tracker pipe (every child of that fork server inherits both; a child that
    wrote into or closed them could stop the fork server or make the tracker unlink the
    host's names). :func:`apply` does it for a confined child."""
    _release_fork_server()
    _release_resource_tracker()


def _join_cgroup(procs_files: tuple[str, ...]) -> str:
    for path in procs_files:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise ConfinementError(exc.errno, f"joining cgroup {path}: {exc.strerror}") from None
    return "cgroup"


def _load_seccomp(spec: Confinement) -> str:
    try:
        seccomp.load(spec.seccomp_filter or seccomp.program(spec.network))
    except seccomp.SeccompError as exc:
        raise ConfinementError(exc.errno, f"seccomp: {exc.strerror}") from None
    return "seccomp"


def _enter_namespaces(spec: Confinement) -> tuple[str, ...]:
    uid = os.geteuid() if spec.uid is None else spec.uid
    gid = os.getegid() if spec.uid is None else DEFAULT_UID if spec.gid is None else spec.gid
    try:
        done = namespaces.enter(
            network=spec.network, private_dir=spec.private_dir, disk_bytes=spec.disk_bytes, uid=uid, gid=gid,
            pid=spec.pid_namespace,
        )
    except namespaces.NamespaceError as exc:
        raise ConfinementError(exc.errno, str(exc.strerror)) from None
    _disk_bound[:] = [spec.disk_bytes] if "disk_bound" in done and spec.disk_bytes else []
    return done


_disk_bound: list[int] = []


def disk_bound() -> int | None:
    """In a confined child: the size of its private folder's tmpfs (bytes), else None."""
    return _disk_bound[0] if _disk_bound else None


def _release_fork_server() -> None:
    """Close this child's copy of the fork server's "alive" pipe. multiprocessing gives
    every forkserver child one, and the fork server only exits (and, guarded, kills its
    tree) once every copy is closed: a busy worker holding one keeps the fork server, and
    so itself, alive after the host died."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]


def _release_resource_tracker() -> None:
    """Close this child's pipe to the host's resource tracker (see
    ``Confinement.host_tracker``); ``multiprocessing`` starts another on first need."""
    module = sys.modules.get("multiprocessing.resource_tracker")
    tracker = getattr(module, "_resource_tracker", None)
    fd = getattr(tracker, "_fd", None)
    if isinstance(fd, int):
        with contextlib.suppress(OSError):
            os.close(fd)
        tracker._fd = tracker._pid = None  # type: ignore[union-attr]


def _set_limits(spec: Confinement) -> None:
    limits = [
        (resource.RLIMIT_CORE, spec.core, "RLIMIT_CORE"),
        (resource.RLIMIT_NOFILE, spec.nofile, "RLIMIT_NOFILE"),
        (resource.RLIMIT_FSIZE, spec.fsize, "RLIMIT_FSIZE"),
        (resource.RLIMIT_AS, spec.address_space, "RLIMIT_AS"),
        (resource.RLIMIT_NPROC, spec.nproc, "RLIMIT_NPROC"),
    ]
    for which, value, name in limits:
        if value is None:
            continue
        _, hard = resource.getrlimit(which)
        limit = value if hard == resource.RLIM_INFINITY or os.geteuid() == 0 else min(value, hard)
        try:
            resource.setrlimit(which, (limit, limit))
        except (OSError, ValueError) as exc:
            raise ConfinementError(0, f"{name}={limit}: {exc}") from None


def _drop_identity(uid: int, gid: int) -> None:
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise ConfinementError(exc.errno, f"dropping to uid {uid} gid {gid}: {exc.strerror}") from None
    with open("/proc/self/status", "rb") as f:
        caps = [line.split()[1] for line in f if line.startswith((b"CapPrm:", b"CapEff:", b"CapAmb:"))]
    if any(int(c, 16) for c in caps) or os.getresuid() != (uid, uid, uid):
        raise ConfinementError(0, f"capabilities or root remain after dropping to uid {uid}")


# --- host side: what this machine offers ------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """Which confinement mechanisms this host offers: each field is ``None`` when
    available, else the reason it is not (a sentence). ``detail`` says what is in use."""

    identity: str | None
    landlock: str | None
    user_namespaces: str | None
    cgroup: str | None
    subreaper: str | None
    python_readable: str | None
    namespaces: str | None
    seccomp: str | None
    detail: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        """``{mechanism: {"available": bool, "reason" or "detail": str}}`` for ``system.stats()``."""
        out: dict[str, Any] = {}
        for name, reason in asdict(self).items():
            if name != "detail":
                out[name] = {"available": reason is None, "reason": reason or self.detail.get(name, "")}
        return out

    def warning(self) -> str | None:
        """The warning to give once when untrusted code would run without uid separation
        and without Landlock; else None. (A Python installed in a folder closed to the
        dropped uid is no reason: a confined child opens its import folders while still
        root and imports through them, :func:`rho_actors.sandbox.child.pin_imports`, so
        it runs as that uid all the same; :attr:`python_readable` is then ``None`` and
        ``detail`` says so.)"""
        if self.identity is not None and self.landlock is not None:
            return f"untrusted tools run unconfined: {self.identity}; {self.landlock}"
        return None


def _readable_by(path: str, uid: int, gid: int) -> str | None:
    """Why ``uid``/``gid`` cannot list and read ``path`` (by its mode bits), or None."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(1, len(parts) + 1):
        current = os.sep.join(parts[:i]) or os.sep
        st = os.stat(current)
        shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
        need = stat.S_IXOTH | (stat.S_IROTH if i == len(parts) else 0)
        if (st.st_mode >> shift) & need != need:
            return f"{current} (mode {stat.filemode(st.st_mode)}) is closed to uid {uid}"
    return None


@functools.cache
def probe(uid: int = DEFAULT_UID, gid: int = DEFAULT_UID) -> Probe:
    """What this host offers for confining children that drop to ``uid``/``gid``;
    computed once per process (a few syscalls and file reads, no child process)."""
    detail: dict[str, str] = {}
    root = os.geteuid() == 0
    identity = None if root else f"the host runs as uid {os.geteuid()}, not root: children keep its uid"
    if root:
        detail["identity"] = f"children drop to uid {uid} gid {gid}"
    try:
        abi = landlock.abi_version()
        lock = None
        detail["landlock"] = f"ABI {abi}" + (
            " (filesystem, signals, abstract sockets)" if abi >= 6 else " (filesystem)"
        )
    except landlock.LandlockError as exc:
        lock = f"Landlock unavailable: {exc.strerror}"
    userns = _userns_reason(root)
    hierarchy = cgroups.find_hierarchy()
    group = hierarchy if isinstance(hierarchy, str) else None
    if not isinstance(hierarchy, str):
        detail["cgroup"] = f"v{hierarchy.version} memory+pids under {hierarchy.dirs['memory']}"
    reaper = None
    if LIBC.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(ctypes.c_int()), 0, 0, 0) != 0:
        reaper = f"PR_GET_CHILD_SUBREAPER: {os.strerror(ctypes.get_errno())}"
    closed = [r for p in installation_prefixes() if (r := _readable_by(p, uid, gid))] if root else []
    # a closed folder does not stop a child: it pins its imports while root (child.pin_imports)
    detail["python_readable"] = (f"{'; '.join(closed)}: children import through folders opened before they drop "
                                 f"to uid {uid}" if closed else f"Python is readable by uid {uid}")
    spaces, syscalls = namespaces.unavailable(), seccomp.unavailable()
    if spaces is None:
        detail["namespaces"] = ("pid (its own /proc), ipc, mount (private folder on a bounded tmpfs), "
                                "network (own loopback only)")
    if syscalls is None:
        detail["seccomp"] = f"libseccomp filter, {len(seccomp.program()) // 8} BPF instructions"
    return Probe(identity, lock, userns, group, reaper, None, spaces, syscalls, detail)


def available(spec: Confinement) -> tuple[Confinement, tuple[str, ...]]:
    """``spec`` with the mechanisms this host lacks turned off (namespaces, with them
    the disk bound, the PID and network namespaces; seccomp; the uid range, then every
    child drops to ``uid``), and one sentence per mechanism turned off or gap left, for an
    ``IsolationEvent`` (each is also logged as a warning, once per process: never a
    silent downgrade). With seccomp on, the compiled filter is filled in."""
    found = probe(*(DEFAULT_UID if v is None else v for v in (spec.uid, spec.gid)))
    missing = []
    if spec.namespaces and found.namespaces is not None:
        missing.append(f"untrusted workers run without their own PID, IPC, mount and network namespaces and "
                       f"without a disk bound: {found.namespaces}")
        spec = replace(spec, namespaces=False)
    if spec.seccomp and found.seccomp is not None:
        missing.append(f"untrusted workers run without a seccomp filter (file locks, AIO and sockets stay open to "
                       f"them): {found.seccomp}")
        spec = replace(spec, seccomp=False)
    own_uids = spec.uid_range is not None and spec.uid is not None and found.identity is None
    if own_uids and spec.uid_range is not None and (reason := uids.unavailable(spec.uid_range)):
        missing.append(f"untrusted workers share uid {spec.uid} and its per-uid kernel counters, "
                       f"no uid of their own: {reason}")
        spec = replace(spec, uid_range=None)
    if (spec.network or not spec.seccomp) and (reason := cgroups.tcp_unbounded()):
        missing.append(f"untrusted workers' TCP buffers are outside their memory bound: {reason}")
    if spec.seccomp:  # the filter of this spec's network (a spec may be a copy with another)
        spec = replace(spec, seccomp_filter=seccomp.program(spec.network))
    for text in missing:
        if text not in _missing_warned:
            _missing_warned.add(text)
            logger.warning(text)
    return spec, tuple(missing)


_missing_warned: set[str] = set()


def _userns_reason(root: bool) -> str | None:
    def number(path: str) -> int | None:
        try:
            with open(path, encoding="ascii") as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    if number("/proc/sys/user/max_user_namespaces") == 0:
        return "user.max_user_namespaces is 0"
    if not root and number("/proc/sys/kernel/unprivileged_userns_clone") == 0:
        return "kernel.unprivileged_userns_clone is 0"
    if not root and number("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == 1:
        return "AppArmor restricts unprivileged user namespaces"
    return None


_warned = threading.Event()


def warn_if_unconfined() -> str | None:
    """Log :meth:`Probe.warning` once per process (loguru, ``rho_actors`` logger) and return it."""
    text = probe().warning()
    if text is not None and not _warned.is_set():
        _warned.set()
        logger.warning(text)
    return text


def python_read_paths(
    modules: Iterable[str] = (), exclude: Iterable[str] = (),
    split: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
) -> tuple[str, ...]:
    """Read-only Landlock paths for running Python and a tool: this interpreter's
    prefixes, the ``sys.path`` folders inside them, the code entries of every other
    ``sys.path`` folder (:mod:`rho_actors.sandbox.confine.code_paths`: no ``.env`` beside the host's
    script), :data:`SYSTEM_READ_PATHS` and the given module file or folder paths. A
    ``sys.path`` folder that contains one of ``exclude`` (say ``data_dir``) is left out:
    pass the folders of the modules needed from it instead. The folders to list only:
    :func:`rho_actors.sandbox.confine.code_paths.split_sys_path`; ``split``: its result,
    when the caller has it already (for the same ``exclude``)."""
    read = (split or split_sys_path(exclude))[0]  # real paths already
    others = (os.path.realpath(p) if p != "/proc/self" else p for p in (*SYSTEM_READ_PATHS, *modules))
    return tuple(dict.fromkeys((*installation_prefixes(), *read, *others)))


def make_private_dir(uid: int | None = DEFAULT_UID, gid: int | None = DEFAULT_UID) -> str:
    """Create a fresh private temporary folder (mode ``0700``) for one worker, owned by
    ``uid``/``gid`` when this process is root; returns its path. The caller removes it;
    its name (``rho-actors-<host pid>-...``) lets a later host sweep it when this one was
    killed before it could (:mod:`rho_actors.sandbox.sweep`)."""
    path = tempfile.mkdtemp(prefix=f"rho-actors-{os.getpid()}-")
    os.chmod(path, 0o700)
    if os.geteuid() == 0 and uid is not None:
        os.chown(path, uid, DEFAULT_UID if gid is None else gid)
    return path


def make_session_dir(path: str) -> str:
    """Create ``path`` (and missing parents) with mode ``0700`` whatever the umask, and
    tighten it to ``0700`` if it exists; returns it. Session folders hold transcripts."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def default_identity() -> tuple[int, int]:
    """``nobody``'s uid and gid from the password database, else ``(65534, 65534)``."""
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return DEFAULT_UID, DEFAULT_UID


def guard_fork_server() -> bool:
    """In a ``multiprocessing`` fork server only (a no-op elsewhere, returns False):
    become a child subreaper, so orphans of workers reparent here, and kill and reap the
    whole tree at exit (the fork server exits when the host ends, even by SIGKILL, or closes
    it). Workers forked from it then check this pid as their parent in :func:`apply`."""
    if not any(a.startswith("from multiprocessing.forkserver import main") for a in sys.orig_argv):
        return False
    if _fork_server == [os.getpid()]:
        return True
    _prctl(PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")
    _fork_server[:] = [os.getpid()]
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
    atexit.register(end_own_tree)  # its tree killed and reaped: no zombie left for the host's init
    return True


guard_fork_server()


def guard_zygote() -> None:
    """In rho's own clean fork server (:mod:`rho_actors.sandbox.zygote`) only: become a
    child subreaper, so orphans of its children reparent there, and make children forked
    from it check its pid as their parent in :func:`apply`."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")
    _fork_server[:] = [os.getpid()]
