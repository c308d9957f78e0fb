"""The kernel namespaces of a confined child (DESIGN §5 "Confinement").

:func:`enter` runs in the child while it is still root, before Landlock and the uid
drop: ``unshare(2)`` moves it (and all it starts) into

- a new **PID namespace** (made by the clean fork server, which forks the child into it:
  :data:`CLONE_NEWPID` moves only the children of the caller) of which the child is
  PID 1, with a ``/proc`` of its own mounted here: it sees and addresses no process but
  its own tree (not another worker, not the host: ``kill``, ``getpriority``,
  ``sched_getaffinity``, ``ioprio_get`` of any other pid fail with ``ESRCH``, and ``/proc``
  lists its tree alone), and when it ends the kernel kills every process left in it;
- a new **IPC namespace**: SysV shared memory, semaphores and message queues, and POSIX
  message queues, seen by no other process and destroyed with the namespace when the
  child's tree ends (the kernel frees every segment left in it);
- a new **mount namespace**, made private (``MS_REC|MS_PRIVATE``: nothing mounted in it
  reaches the host's), in which every mount is ``noatime`` (reading a file whose access
  time is a day old would otherwise update it, for every other worker to ``stat``: one
  bit a file a day), whose private folder is a fresh ``tmpfs`` of ``disk_bytes``
  (``size=``, ``nr_inodes=``; ``nosuid``, ``nodev``, mode ``0700``, owned by the dropped
  uid): the folder's total is bounded, its pages are charged to the child's memory
  cgroup, and its content vanishes with the tree;
- unless ``network`` is set, a new **network namespace** whose only interface is a
  loopback brought up for the child alone: it reaches no address of the host (not its
  loopback, not a cloud metadata address), and nothing it listens on can be reached from
  outside; abstract Unix sockets are per network namespace too.

Creating namespaces needs ``CAP_SYS_ADMIN``: :func:`unavailable` says why a host cannot.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from typing import Final

from rho_actors.sandbox.confine.libc import LIBC, checked

__all__ = ["CLONE_NEWPID", "NamespaceError", "enter", "fork_into_pid_namespace", "unavailable"]

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWIPC: Final = 0x08000000
CLONE_NEWNET: Final = 0x40000000
CLONE_NEWPID: Final = 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x1, 0x2, 0x4, 0x8, 0x4000, 0x40000
_MS_REMOUNT, _MS_BIND, _MS_NOATIME = 0x20, 0x1000, 0x400
_KEPT_FLAGS: Final = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC  # statvfs's ST_* bits are these
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE = 442, -100, 0x8000  # 442 on x86_64 and aarch64 alike
_MOUNT_ATTR_NOATIME, _MOUNT_ATTR__ATIME = 0x10, 0x70


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_INODE_BYTES: Final = 16 * 1024  # one inode of the tmpfs per 16 KiB of its size (at least 1024)



class NamespaceError(OSError):
    """A namespace or mount step failed; the message names it."""


def enter(
    *, network: bool, private_dir: str | None, disk_bytes: int | None, uid: int, gid: int, pid: bool = True,
) -> tuple[str, ...]:
    """Move this (single-threaded, root) process into new IPC and mount namespaces, and a
    new network namespace unless ``network``; with ``pid``, this process must be PID 1
    of a new PID namespace (forked into it) and gets a ``/proc`` of that namespace; mount
    make every mount ``noatime``; mount a ``disk_bytes`` tmpfs owned by ``uid``/``gid`` on
    ``private_dir`` (both given). Returns the mechanism names applied (``pid_namespace``, ``ipc_namespace``,
    ``mount_namespace``, ``no_atime``, ``network_namespace``, ``disk_bound``). Raises
    :class:`NamespaceError` naming the failed step."""
    if pid and os.getpid() != 1:
        raise NamespaceError(0, f"not PID 1 of a PID namespace of its own (pid {os.getpid()}): only the clean fork "
                                "server starts a child in one")
    flags = CLONE_NEWIPC | CLONE_NEWNS | (0 if network else CLONE_NEWNET)
    named = "unshare(CLONE_NEWIPC|CLONE_NEWNS" + "|CLONE_NEWNET" * (not network) + ")"
    checked(LIBC.unshare(ctypes.c_int(flags)), NamespaceError, named)
    done = ["ipc_namespace", "mount_namespace"]
    private = LIBC.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None)
    checked(private, NamespaceError, "making / private")
    if pid:
        proc = LIBC.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC), None)
        checked(proc, NamespaceError, "mounting the PID namespace's own /proc")
        done.insert(0, "pid_namespace")
    _no_atime()
    done.append("no_atime")
    if not network:
        _loopback_up()
        done.append("network_namespace")
    if private_dir is not None and disk_bytes is not None:
        inodes = max(1024, disk_bytes // _INODE_BYTES)
        options = f"size={disk_bytes},nr_inodes={inodes},mode=0700,uid={uid},gid={gid}".encode()
        checked(
            LIBC.mount(b"rho-private", os.fsencode(private_dir), b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV),
                       options),
            NamespaceError,
            f"mounting a {disk_bytes}-byte tmpfs on {private_dir}",
        )
        done.append("disk_bound")
    return tuple(done)


def _no_atime() -> None:
    """Make every mount of this (new, private) mount namespace ``noatime``: one
    ``mount_setattr(2)`` on ``/`` with ``AT_RECURSIVE`` (Linux 5.12), else a bind remount
    of each mount point, keeping its read-only, nosuid, nodev and noexec flags."""
    attr = _MountAttr(_MOUNT_ATTR_NOATIME, _MOUNT_ATTR__ATIME, 0, 0)
    done = LIBC.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(_AT_FDCWD), b"/", ctypes.c_uint(_AT_RECURSIVE),
                        ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    if done == 0 or ctypes.get_errno() != errno.ENOSYS:
        checked(done, NamespaceError, "mount_setattr(/, MOUNT_ATTR_NOATIME, AT_RECURSIVE)")
        return
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        points = [line.split()[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
                  .replace("\\134", "\\") for line in f]
    for target in dict.fromkeys(points):
        try:
            flags = os.statvfs(target).f_flag & _KEPT_FLAGS
        except OSError:
            continue  # a mount point hidden beneath another
        checked(LIBC.mount(None, os.fsencode(target), None,
                           ctypes.c_ulong(_MS_REMOUNT | _MS_BIND | _MS_NOATIME | flags), None),
                NamespaceError, f"remounting {target} noatime")


def _loopback_up() -> None:
    """Bring up ``lo`` in this (new) network namespace: 127.0.0.1 and ::1 for the child alone."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("16sh", b"lo", 0)
            current = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", current | _IFF_UP))
    except OSError as exc:
        raise NamespaceError(exc.errno, f"bringing up lo in the new network namespace: {exc.strerror}") from None


def unavailable() -> str | None:
    """Why this host cannot give children their own namespaces (a sentence), or None."""
    if os.geteuid() != 0:
        return f"the host runs as uid {os.geteuid()}, not root: creating namespaces needs CAP_SYS_ADMIN"
    for kind in ("pid", "ipc", "mnt", "net"):
        if not os.path.exists(f"/proc/self/ns/{kind}"):
            return f"the kernel lacks {kind} namespaces"
        try:
            with open(f"/proc/sys/user/max_{kind}_namespaces", encoding="ascii") as f:
                if int(f.read()) == 0:
                    return f"user.max_{kind}_namespaces is 0"
        except (OSError, ValueError):
            continue
    return None


_own_pid_namespace: list[int] = []  # a descriptor of this process's PID namespace, once opened


def fork_into_pid_namespace() -> int:
    """``os.fork()`` with the child as PID 1 of a new PID namespace (the caller stays in
    its own: it unshares ``CLONE_NEWPID`` for the one fork, then rejoins its namespace
    with ``setns``). Returns as ``os.fork``. Raises :class:`NamespaceError` when the
    kernel refuses the namespace (no ``CAP_SYS_ADMIN``); the caller then has not forked."""
    if not _own_pid_namespace:
        _own_pid_namespace.append(os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC))
    checked(LIBC.unshare(ctypes.c_int(CLONE_NEWPID)), NamespaceError, "unshare(CLONE_NEWPID)")
    try:
        return os.fork()
    finally:
        if os.getpid() != 1:  # the parent: its next children are born in its own namespace again
            checked(LIBC.setns(ctypes.c_int(_own_pid_namespace[0]), ctypes.c_int(CLONE_NEWPID)), NamespaceError,
                    "setns(its own PID namespace)")
