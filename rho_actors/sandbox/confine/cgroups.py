"""A control group for one worker's whole process tree: a memory bound and a process bound
that every descendant shares, an OOM record, and a kill that no ``setsid`` escapes.

cgroup v2 is used when this process's own cgroup can delegate the ``memory`` and ``pids``
controllers to children (a cgroup root, or a delegated cgroup with no processes of its
own, e.g. systemd ``Delegate=yes`` with the host in a leaf; name it with the
``RHO_ACTORS_CGROUP`` environment variable); otherwise the v1 ``memory`` and ``pids``
hierarchies when they are mounted and writable. Each :class:`Cgroup` is created beneath
the host's own cgroup, so every bound set above it still holds.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Final

__all__ = ["Cgroup", "CgroupError", "CgroupHierarchy", "find_hierarchy", "tcp_unbounded"]

_CONTROLLERS: Final = ("memory", "pids")


class CgroupError(OSError):
    """No cgroup could be created, bounded or removed; the message says where and why."""


@dataclass(frozen=True)
class CgroupHierarchy:
    """Where this process's child cgroups go: ``version`` 2 (one directory for both
    controllers) or 1 (one directory per controller, ``dirs[controller]``)."""

    version: int
    dirs: dict[str, str]


def _mounts() -> list[tuple[str, str, set[str]]]:
    mounts = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fstype, _, options = tail.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                mounts.append((fstype, head.split()[4], set(options.split(","))))
    return mounts


def _own_paths() -> dict[str, str]:
    paths = {}
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(value)


def _v2_parent(directory: str) -> str | None:
    """Why ``directory`` cannot hold bounded children, or None once its ``subtree_control``
    names both controllers."""
    try:
        available = _read(os.path.join(directory, "cgroup.controllers")).split()
        missing = [c for c in _CONTROLLERS if c not in available]
        if missing:
            return f"cgroup v2 {directory} does not offer {', '.join(missing)}"
        enabled = _read(os.path.join(directory, "cgroup.subtree_control")).split()
        wanted = " ".join(f"+{c}" for c in _CONTROLLERS if c not in enabled)
        if wanted:
            _write(os.path.join(directory, "cgroup.subtree_control"), wanted)
    except OSError as exc:
        hint = (
            " (it holds processes: start the host in a leaf of a delegated cgroup)" if exc.errno == errno.EBUSY else ""
        )
        return f"cgroup v2 {directory}: {exc.strerror}{hint}"
    return None


@functools.cache
def find_hierarchy() -> CgroupHierarchy | str:
    """Where this process can create bounded child cgroups, or the reason it cannot
    (a sentence naming what was missing). Checked once per process."""
    own = _own_paths()
    reasons = []
    explicit = os.environ.get("RHO_ACTORS_CGROUP")
    mounts = _mounts()
    v2 = [
        (mount, explicit or os.path.join(mount, own.get("", "/").lstrip("/")))
        for t, mount, _ in mounts
        if t == "cgroup2"
    ]
    for _, directory in v2[:1]:
        reason = _v2_parent(directory)
        if reason is None:
            return CgroupHierarchy(2, {c: directory for c in _CONTROLLERS})
        reasons.append(reason)
    dirs: dict[str, str] = {}
    for controller in _CONTROLLERS:
        for fstype, mount, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                directory = os.path.join(mount, own[controller].lstrip("/"))
                if os.access(directory, os.W_OK):
                    dirs[controller] = directory
    if len(dirs) == len(_CONTROLLERS):
        return CgroupHierarchy(1, dirs)
    missing = [c for c in _CONTROLLERS if c not in dirs]
    reasons.append(f"cgroup v1: no writable {', '.join(missing)} hierarchy")
    return "; ".join(reasons)


_V1_TCP: Final = "memory.kmem.tcp.limit_in_bytes"


@functools.cache
def tcp_unbounded() -> str | None:
    """Why a worker's TCP buffers would not count against its memory bound (a sentence),
    or None. cgroup v2 charges socket memory to the cgroup; v1 only once
    ``memory.kmem.tcp.limit_in_bytes`` is set (:class:`Cgroup` sets it to the memory
    bound: TCP buffers then have a bound of that size of their own)."""
    hierarchy = find_hierarchy()
    if isinstance(hierarchy, str):
        return f"no cgroup: {hierarchy}"
    if hierarchy.version == 1 and not os.path.exists(os.path.join(hierarchy.dirs["memory"], _V1_TCP)):
        return f"cgroup v1 without {_V1_TCP} (a kernel that no longer accounts TCP memory on v1)"
    return None


class Cgroup:
    """One worker's process tree, bounded: ``memory_max`` bytes of memory (no swap) and
    ``pids_max`` processes for the whole tree (``None``: unbounded).

    Create it before the worker runs tool code; the worker joins it by writing its pid to
    :attr:`procs_files` (``Confinement.cgroup_procs``), or the host calls :meth:`add`.
    Raises :class:`CgroupError` when no hierarchy is usable (``find_hierarchy()`` says
    why) or the kernel refuses a bound. Use as a context manager, or call :meth:`kill`
    and :meth:`remove`."""

    def __init__(self, name: str, *, memory_max: int | None, pids_max: int | None) -> None:
        hierarchy = find_hierarchy()
        if isinstance(hierarchy, str):
            raise CgroupError(errno.ENOTSUP, hierarchy)
        self.version = hierarchy.version
        leaf = f"rho-actors-{os.getpid()}-{name}"
        self.dirs = {c: os.path.join(d, leaf) for c, d in hierarchy.dirs.items()}
        self._unique = sorted(set(self.dirs.values()))
        created: list[str] = []
        try:
            for directory in self._unique:
                os.mkdir(directory, 0o755)
                created.append(directory)
            self._bound(memory_max, pids_max)
        except OSError as exc:
            for directory in created:
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
            raise CgroupError(exc.errno, f"cannot create cgroup {leaf}: {exc.strerror} ({exc.filename})") from None

    @classmethod
    def existing(cls, hierarchy: CgroupHierarchy, leaf: str) -> Cgroup:
        """The cgroup named ``leaf`` that already stands in ``hierarchy`` (a leftover
        that :func:`~rho_actors.sandbox.sweep.sweep_leftovers` kills and removes), neither created
        nor bounded here."""
        self = cls.__new__(cls)
        self.version = hierarchy.version
        self.dirs = {c: os.path.join(d, leaf) for c, d in hierarchy.dirs.items()}
        self._unique = sorted(set(self.dirs.values()))
        return self

    def _bound(self, memory_max: int | None, pids_max: int | None) -> None:
        memory, pids = self.dirs["memory"], self.dirs["pids"]
        if pids_max is not None:
            _write(os.path.join(pids, "pids.max"), str(pids_max))
        if memory_max is None:
            return
        if self.version == 2:
            _write(os.path.join(memory, "memory.max"), str(memory_max))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if os.path.exists(os.path.join(memory, name)):
                    _write(os.path.join(memory, name), value)
        else:
            _write(os.path.join(memory, "memory.limit_in_bytes"), str(memory_max))
            for name in ("memory.memsw.limit_in_bytes", _V1_TCP):  # v1 counts TCP buffers apart, once bounded
                if os.path.exists(os.path.join(memory, name)):
                    _write(os.path.join(memory, name), str(memory_max))

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` files a process writes its pid to in order to join."""
        return tuple(os.path.join(d, "cgroup.procs") for d in self._unique)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (not yet its existing children) into this cgroup."""
        for path in self.procs_files:
            _write(path, str(pid))

    def pids(self) -> list[int]:
        """The processes now in the cgroup (their whole tree, ``setsid`` escapes included)."""
        try:
            return [int(p) for p in _read(os.path.join(self.dirs["pids"], "cgroup.procs")).split()]
        except FileNotFoundError:
            return []

    def counted(self) -> int:
        """The processes the cgroup's ``pids`` controller counts now (``pids.current``):
        unlike :meth:`pids`, those exiting and zombies not yet reaped too; 0 once removed."""
        try:
            return int(_read(os.path.join(self.dirs["pids"], "pids.current")))
        except FileNotFoundError:
            return 0

    def memory_events(self) -> dict[str, int]:
        """Counters of the memory bound: ``oom_kill`` (processes the kernel killed at it)
        and, by version, ``oom``/``max`` (v2 ``memory.events``) or ``failcnt``/``under_oom`` (v1)."""
        memory = self.dirs["memory"]
        if self.version == 2:
            text = _read(os.path.join(memory, "memory.events"))
        else:
            text = _read(os.path.join(memory, "memory.oom_control"))
            text += f"failcnt {_read(os.path.join(memory, 'memory.failcnt'))}"
        return {key: int(value) for key, value in (line.split() for line in text.splitlines() if line.strip())}

    def memory_bound_hit(self) -> bool:
        """Whether the kernel killed a process of this tree at the memory bound."""
        events = self.memory_events()
        return events.get("oom_kill", 0) > 0 or events.get("oom", 0) > 0

    def kill(self, timeout_s: float = 2.0) -> None:
        """SIGKILL every process in the cgroup and wait (at most ``timeout_s`` seconds)
        until it is empty: ``cgroup.kill`` on v2, repeated sweeps of ``cgroup.procs`` on v1.
        Raises :class:`CgroupError` if processes remain."""
        kill_file = os.path.join(self.dirs["pids"], "cgroup.kill")
        if self.version == 2 and os.path.exists(kill_file):
            _write(kill_file, "1")
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise CgroupError(errno.EBUSY, f"processes {pids} survived SIGKILL in {self.dirs['pids']}")
            time.sleep(0.002)

    def remove(self, timeout_s: float = 2.0) -> None:
        """Remove the cgroup once empty (call :meth:`kill` first). Already gone is fine."""
        deadline = time.monotonic() + timeout_s
        for directory in self._unique:
            while True:
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                        raise CgroupError(exc.errno, f"cannot remove cgroup {directory}: {exc.strerror}") from None
                    time.sleep(0.002)

    def __enter__(self) -> Cgroup:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        try:
            self.kill()
        finally:
            self.remove()

    def __repr__(self) -> str:
        return f"Cgroup(v{self.version}, {self._unique[0]})"
