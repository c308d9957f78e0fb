"""The syscall filter of a confined child (DESIGN §5 "Confinement"): seccomp-BPF.

The host compiles the filter once with libseccomp (through the ``pyseccomp`` binding:
libseccomp resolves syscall numbers per architecture, rejects foreign-ABI calls such as
``int 0x80`` and x32 on x86_64, and emits the 64-bit argument checks); the child only
loads the compiled program with one ``seccomp(2)`` call (:func:`load`), last before tool
code, after ``PR_SET_NO_NEW_PRIVS`` and the uid drop. Every syscall not named here is
allowed; a denied one fails with ``EPERM`` (``clone3`` with ``ENOSYS``, so that libc
falls back to ``clone``, whose flags the filter can read):

- namespaces: ``unshare``/``clone`` with any ``CLONE_NEW*`` flag, ``setns``;
- other processes' memory: ``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd``, ``kcmp``;
- kernel keyrings, BPF and similar attack surface: ``keyctl``, ``add_key``,
  ``request_key``, ``bpf``, ``userfaultfd``, ``perf_event_open``, ``io_uring_*``;
- the filesystem tree: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new
  mount API (``fsopen``, ``fsmount``, ``move_mount``, ``open_tree``, ...);
- the machine: module loading, ``kexec``, ``reboot``, swap, ``acct``, ``iopl``/``ioperm``;
- kernel objects counted per uid, not per process (every worker runs as the one dropped
  uid, so one worker holding them all would starve every other session's and every other
  process of that uid): ``inotify_init``/``inotify_init1`` (``max_user_instances``, 128),
  ``fanotify_init`` and ``mq_open`` (POSIX queues' bytes, ``RLIMIT_MSGQUEUE`` per user);
- the kernel's asynchronous I/O (``io_setup`` and the other ``io_*`` calls): its budget,
  ``fs.aio-max-nr``, is one for the whole machine, so one worker holding it would starve
  every other session's (and every other program's); ``io_uring_*`` are denied above;
- file locks: ``flock`` and the ``fcntl`` commands that place one (``F_SETLK``,
  ``F_SETLKW``, ``F_OFD_SETLK``, ``F_OFD_SETLKW``) succeed without placing anything
  (``errno`` 0): a lock on a file every worker can read (an installed module) is seen by
  every other (``F_GETLK``/``F_OFD_GETLK`` read back its offsets, a blocked ``flock``
  times it), so no confined worker ever holds one, and ``F_GETLK`` always answers
  "unlocked" as far as workers go. SQLite in the private folder works (one process
  needs no file locks; its own in-process locking still holds); a tool's *several*
  processes that lock one file against each other are not serialized;
- sockets: ``socket()`` of any family but ``AF_INET``/``AF_INET6`` (so no ``AF_UNIX``
  socket can connect to a pathname socket anywhere on the host, no netlink, netfilter
  or packet socket), and ``SOCK_RAW``/``SOCK_PACKET`` of those two; without the network
  (``program(network=False)``, the default) no ``socket()`` at all: the worker's own
  loopback is no use to a tool, and its buffers live outside the memory bound on cgroup
  v1; ``socketpair`` of
  ``AF_UNIX`` ``SOCK_STREAM``/``SOCK_SEQPACKET`` only (pipes between a tool's own
  processes: connected for life, they name no other peer). A ``SOCK_DGRAM`` pair is
  denied: a datagram socket may ``sendto`` or ``connect`` to any pathname socket, which
  no network namespace and no Landlock rule covers (``/dev/log``, journald, any host
  service's datagram socket).
- other processes' scheduling and limits: every worker runs as the one dropped uid, and
  the uid is all that ``setpriority``, ``ioprio_set``, ``prlimit64``,
  ``sched_setaffinity``, ``sched_setscheduler``, ``sched_setparam`` and
  ``sched_setattr`` check (Landlock scopes signals, not these), so a worker could lower
  another session's limits or priorities, or a warm spare's; each is allowed on the
  caller itself only (pid ``0``; ``setpriority``/``ioprio_set`` of ``who`` ``0`` and not
  of a whole user).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import tempfile
from typing import Any, Final

from rho_actors.sandbox.confine.libc import LIBC, checked

__all__ = ["DENIED", "SeccompError", "load", "program", "unavailable"]

_CLONE_NEW: Final = {
    "CLONE_NEWTIME": 0x80, "CLONE_NEWNS": 0x20000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}  # fmt: skip
DENIED: Final = (
    "setns", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    "keyctl", "add_key", "request_key", "bpf", "userfaultfd", "perf_event_open",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "iopl", "ioperm", "quotactl", "lookup_dcookie",
    "inotify_init", "inotify_init1", "fanotify_init", "mq_open",
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
)  # fmt: skip
"""Syscalls denied outright (``EPERM``); names unknown on this architecture are skipped."""

_AF_INET, _AF_INET6 = 2, 10
_AF_UNIX: Final = 1
_SOCK_TYPE_MASK, _SOCK_STREAM, _SOCK_SEQPACKET, _SOCK_RAW, _SOCK_PACKET = 0xF, 1, 5, 3, 10
_LOCK_COMMANDS: Final = {"F_SETLK": 6, "F_SETLKW": 7, "F_OFD_SETLK": 37, "F_OFD_SETLKW": 38}
_SECCOMP_SET_MODE_FILTER: Final = 1
_SYS_SECCOMP: Final = {"x86_64": 317, "aarch64": 277}




class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompError(OSError):
    """The filter could not be compiled (no libseccomp) or loaded; the message says why."""


def _compile(network: bool) -> bytes:
    try:
        import pyseccomp as sc  # type: ignore[import-untyped]  # ctypes binding, loads libseccomp.so.2
    except (ImportError, RuntimeError, OSError) as exc:
        raise SeccompError(errno.ENOSYS, f"libseccomp is unavailable: {exc}") from None
    deny: Any = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.CTL_NNP, 0)  # apply() sets no_new_privs itself, before the uid drop
    names = list(DENIED)
    for name in names:
        try:
            f.add_rule(deny, name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a syscall on this architecture
    for flag in _CLONE_NEW.values():
        f.add_rule(deny, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # its flags sit behind a pointer: libc falls back to clone
    no_effect: Any = sc.ERRNO(0)  # the call "succeeds" and does nothing
    f.add_rule(no_effect, "flock")
    for command in _LOCK_COMMANDS.values():  # fcntl's cmd is an unsigned int: its low 32 bits
        f.add_rule(no_effect, "fcntl", sc.Arg(1, sc.MASKED_EQ, _INT, command))
    if not network:
        f.add_rule(deny, "socket")
    else:
        f.add_rule(deny, "socket", sc.Arg(0, sc.LT, _AF_INET))
        f.add_rule(deny, "socket", sc.Arg(0, sc.GT, _AF_INET6))
        for family in range(_AF_INET + 1, _AF_INET6):
            f.add_rule(deny, "socket", sc.Arg(0, sc.EQ, family))
        for kind in (_SOCK_RAW, _SOCK_PACKET):
            f.add_rule(deny, "socket", sc.Arg(1, sc.MASKED_EQ, _SOCK_TYPE_MASK, kind))
    # socketpair: AF_UNIX streams only; an unconnected (datagram) Unix socket could address a pathname socket
    f.add_rule(deny, "socketpair", sc.Arg(0, sc.NE, _AF_UNIX))
    for kind in range(_SOCK_TYPE_MASK + 1):
        if kind not in (_SOCK_STREAM, _SOCK_SEQPACKET):
            f.add_rule(deny, "socketpair", sc.Arg(1, sc.MASKED_EQ, _SOCK_TYPE_MASK, kind))
    _own_process_only(f, deny, sc)
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


_PID_FIRST: Final = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")
_WHICH_WHO: Final = {"setpriority": 2, "ioprio_set": 3}  # syscall -> its "which" value naming a whole user
_INT: Final = 0xFFFFFFFF


def _own_process_only(f: Any, deny: Any, sc: Any) -> None:
    """Rules keeping the calls that act on a process by pid (gated only by the uid) to
    the caller's own: a pid other than 0 is denied; the kernel reads these as ``int``, so
    a value with any upper bit set is denied too, and a ``which`` is compared on its low
    32 bits."""
    for name in _PID_FIRST:
        try:
            f.add_rule(deny, name, sc.Arg(0, sc.NE, 0))
        except (OSError, ValueError, RuntimeError):
            continue  # not a syscall on this architecture
    for name, user in _WHICH_WHO.items():
        f.add_rule(deny, name, sc.Arg(1, sc.NE, 0))
        f.add_rule(deny, name, sc.Arg(0, sc.MASKED_EQ, _INT, user))


def program(network: bool = False) -> bytes:
    """The compiled filter (classic BPF ``sock_filter`` instructions, 8 bytes each) of a
    worker without the network (``network=True``: ``AF_INET``/``AF_INET6`` sockets
    allowed), built once per process. Raises :class:`SeccompError` without libseccomp."""
    return _program(bool(network))


@functools.cache
def _program(network: bool) -> bytes:
    try:
        return _compile(network)
    except SeccompError:
        raise
    except (OSError, ValueError, RuntimeError) as exc:
        raise SeccompError(getattr(exc, "errno", 0) or 0, f"libseccomp refused the filter: {exc}") from None


@functools.cache
def unavailable() -> str | None:
    """Why this host cannot filter a child's syscalls (a sentence), or None: the kernel
    lacks seccomp filters or their ``errno`` action, or libseccomp is missing."""
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail", encoding="ascii") as f:
            if "errno" not in f.read().split():
                return "the kernel's seccomp lacks the errno action"
    except OSError:
        return "the kernel has no seccomp filters (/proc/sys/kernel/seccomp missing)"
    if os.uname().machine not in _SYS_SECCOMP:
        return f"seccomp syscall number unknown on {os.uname().machine}"
    try:
        program()
    except SeccompError as exc:
        return exc.strerror
    return None


def load(compiled: bytes) -> None:
    """Install ``compiled`` (from :func:`program`) on this thread and every process it
    starts; irreversible. Needs ``PR_SET_NO_NEW_PRIVS`` (or ``CAP_SYS_ADMIN``). Raises
    :class:`SeccompError` when the kernel refuses it."""
    if not compiled or len(compiled) % 8:
        raise SeccompError(errno.EINVAL, f"not a compiled seccomp filter ({len(compiled)} bytes)")
    buffer = ctypes.create_string_buffer(compiled, len(compiled))
    prog = _Fprog(len(compiled) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    number = _SYS_SECCOMP.get(os.uname().machine)
    if number is None:
        raise SeccompError(errno.ENOSYS, f"seccomp syscall number unknown on {os.uname().machine}")
    checked(LIBC.syscall(ctypes.c_long(number), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER), ctypes.c_uint(0),
                         ctypes.byref(prog)), SeccompError, "seccomp(SECCOMP_SET_MODE_FILTER)")
