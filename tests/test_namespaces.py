"""Untrusted tools as attackers against the kernel resources their worker could share with
the host (DESIGN §5 "Confinement"): the network, SysV IPC, namespaces, sockets, the disk
and dangerous syscalls. Each attack goes through the public API (a registered untrusted
tool, called from a session) and is written as a malicious author would write it."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, IsolationEvent, ToolCall, ToolResult, UntrustedReads
from rho_actors.sandbox.confine import seccomp
from rho_actors.sandbox.confine.confinement import Confinement, probe
from tests.conftest import WAIT_S, wait_for

from .test_hostile_untrusted import SESSIONS, Echo, assert_serving, call

HOST = probe()
pytestmark = [
    pytest.mark.skipif(HOST.namespaces is not None, reason=str(HOST.namespaces)),
    pytest.mark.skipif(HOST.seccomp is not None, reason=str(HOST.seccomp)),
]
MIB = 2**20
# syscall numbers: x86_64, aarch64
_NR = {
    "x86_64": {"ptrace": 101, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "userfaultfd": 323,
               "io_uring_setup": 425, "unshare": 272, "clone": 56, "clone3": 435, "mount": 165, "setns": 308},
    "aarch64": {"ptrace": 117, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "userfaultfd": 282,
                "io_uring_setup": 425, "unshare": 97, "clone": 220, "clone3": 435, "mount": 40, "setns": 268},
}  # fmt: skip
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWIPC, SIGCHLD = 0x10000000, 0x40000000, 0x08000000, 17
_KEPT: list[Any] = []  # what a tool keeps open in its worker between calls


def _errno_of(thunk: Any) -> str:
    try:
        thunk()
        return "allowed"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def _syscall(name: str, *args: int) -> str:
    """One raw syscall: "allowed" or its errno's name (a success that forked exits the copy)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(_NR[platform.machine()][name]), *(ctypes.c_long(a) for a in args))
    if result == 0 and name == "clone":
        os._exit(0)  # the child of a clone that worked
    if result < 0:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    if name == "clone":
        os.waitpid(result, 0)
    return "allowed"


class Attack:
    """Runs the attack named by ``args["attack"]`` in its worker and reports what happened."""

    name = staticmethod(lambda: "attack")
    description = staticmethod(lambda: "Attack the host.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    timeout_ms = staticmethod(lambda: 20_000)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        attack = args["attack"]
        if attack == "connect":
            family = socket.AF_INET6 if ":" in args["host"] else socket.AF_INET

            def connect() -> None:
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.settimeout(WAIT_S)
                    s.connect((args["host"], args["port"]))

            return {"connect": _errno_of(connect)}
        if attack == "listen":
            def listen() -> None:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                _KEPT.append(s)  # still listening after the call: the worker stays for its session
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", args["port"]))
                s.listen(8)

            return {"listen": _errno_of(listen)}
        if attack == "shm_create":
            libc = ctypes.CDLL(None, use_errno=True)
            libc.shmat.restype = ctypes.c_void_p
            shmid = libc.shmget(args["key"], 4 * MIB, 0o1000 | 0o666)  # IPC_CREAT, never IPC_RMID
            if shmid < 0:
                return {"shmget": errno.errorcode[ctypes.get_errno()]}
            address = libc.shmat(shmid, None, 0)
            ctypes.memmove(address, b"left behind", 11)
            libc.shmdt(ctypes.c_void_p(address))
            return {"shmid": shmid, "ipc_ns": os.readlink("/proc/self/ns/ipc")}
        if attack == "shm_find":
            libc = ctypes.CDLL(None, use_errno=True)
            shmid = libc.shmget(args["key"], 0, 0)
            return {"shmget": "found" if shmid >= 0 else errno.errorcode[ctypes.get_errno()]}
        if attack == "namespaces":
            return {
                "unshare_user": _syscall("unshare", CLONE_NEWUSER),
                "unshare_net": _syscall("unshare", CLONE_NEWNET),
                "unshare_ipc": _syscall("unshare", CLONE_NEWIPC),
                "clone_user": _syscall("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
                "clone3": _syscall("clone3", 0, 0),
                "setns": _syscall("setns", os.open("/proc/self/ns/net", os.O_RDONLY), 0),
            }
        if attack == "sockets":
            def opened(*spec: int) -> str:
                def make() -> None:
                    socket.socket(*spec).close()

                return _errno_of(make)

            out = {
                "netlink_route": opened(socket.AF_NETLINK, socket.SOCK_RAW, 0),
                "netlink_netfilter": opened(socket.AF_NETLINK, socket.SOCK_RAW, 12),
                "packet": opened(socket.AF_PACKET, socket.SOCK_RAW, 0),
                "raw_inet": opened(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                "raw_inet6": opened(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
                "tcp": opened(socket.AF_INET, socket.SOCK_STREAM, 0),
                "socketpair": _errno_of(lambda: list(map(socket.socket.close, socket.socketpair()))),
            }

            def unix_connect() -> None:  # to a host service's pathname socket
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
                    unix.settimeout(WAIT_S)
                    unix.connect(args["unix"])

            out["unix_connect"] = _errno_of(unix_connect)
            return out
        if attack == "syscalls":
            return {
                "ptrace": _syscall("ptrace", 0, 0, 0, 0),  # PTRACE_TRACEME
                "keyctl": _syscall("keyctl", 1, 0, 0, 0),  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
                "add_key": _syscall("add_key", 0, 0, 0, 0, 0),
                "request_key": _syscall("request_key", 0, 0, 0, 0),
                "bpf": _syscall("bpf", 5, 0, 0),  # BPF_PROG_LOAD
                "userfaultfd": _syscall("userfaultfd", 1),  # UFFD_USER_MODE_ONLY
                "io_uring_setup": _syscall("io_uring_setup", 1, ctypes.addressof(ctypes.create_string_buffer(120))),
                "mount": _syscall("mount", 0, 0, 0, 0, 0),
            }
        if attack == "fill_disk":
            folder, written, chunk = Path(ctx["data_dir"]), 0, b"x" * MIB
            for i in range(args["files"]):
                with open(folder / f"{args['prefix']}-{i}.bin", "wb") as f:
                    for _ in range(args["per_file_mib"]):
                        f.write(chunk)
                        f.flush()
                        written += MIB
            return {"written": written}
        raise ValueError(f"unknown attack {attack!r}")


def make_system(data_dir: Path, **options: Any) -> ActorSystem:
    """A system whose declaration reads may take 30 s: this machine may be loaded."""
    return ActorSystem(data_dir=data_dir, shutdown_ms=2_000, untrusted=UntrustedReads(timeout_s=WAIT_S), **options)


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    with make_system(tmp_path / "data") as made:
        yield made


@pytest.fixture
def hostile(system: ActorSystem) -> ActorSystem:
    for tool in (Echo, Attack):
        registration = system.register(tool, untrusted=True)
        assert registration.info is not None, registration.reason
    return system


def attack(system: ActorSystem, name: str, session: str | None = None, **args: Any) -> dict[str, Any]:
    result = call(system, session or f"attacker-{next(SESSIONS)}", "attack", {"attack": name, **args})
    assert result.ok, result
    out: dict[str, Any] = json.loads(result.content)
    return out


@contextlib.contextmanager
def listener(family: int = socket.AF_INET, host: str = "127.0.0.1") -> Iterator[socket.socket]:
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.bind((host, 0))
        server.listen(8)
        server.setblocking(False)
        yield server


def accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def test_a_worker_cannot_connect_to_a_port_the_host_listens_on_loopback(hostile: ActorSystem) -> None:
    with listener() as v4, listener(socket.AF_INET6, "::1") as v6:
        got4 = attack(hostile, "connect", host="127.0.0.1", port=v4.getsockname()[1])
        got6 = attack(hostile, "connect", host="::1", port=v6.getsockname()[1])
        assert got4["connect"] == got6["connect"] == "EPERM", (got4, got6)  # no socket at all without the network
        assert not accepted(v4) and not accepted(v6)
    assert hostile.stats()["confinement"]["network"] is False
    assert_serving(hostile)


def test_a_worker_cannot_listen_on_a_port_a_host_client_connects_to(hostile: ActorSystem) -> None:
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    session = f"attacker-{next(SESSIONS)}"
    assert attack(hostile, "listen", session, port=port) == {"listen": "EPERM"}  # no socket without the network
    with socket.socket() as client, pytest.raises(ConnectionRefusedError):
        client.settimeout(WAIT_S)
        client.connect(("127.0.0.1", port))  # a host client meant for a host service: not the tool's
    assert_serving(hostile)


def test_a_tool_with_network_true_reaches_the_hosts_loopback(tmp_path: Path) -> None:
    with make_system(tmp_path, confinement=Confinement(network=True)) as system:
        assert system.register(Attack, untrusted=True).info is not None
        assert "network_namespace" not in system.stats()["confinement"]["active"]
        with listener() as server:
            got = attack(system, "connect", host="127.0.0.1", port=server.getsockname()[1])
            assert got == {"connect": "allowed"}
            server.setblocking(True)
            server.settimeout(WAIT_S)
            server.accept()[0].close()


def _ipc_namespaces_in_use() -> set[str]:
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            found.add(os.readlink(f"/proc/{pid}/ns/ipc"))
    return found


def _host_shm_keys() -> set[int]:
    with open("/proc/sysvipc/shm", encoding="ascii") as f:
        return {int(line.split()[0]) for line in list(f)[1:]}


def test_a_sysv_shm_segment_neither_outlives_its_worker_nor_reaches_another_session(hostile: ActorSystem) -> None:
    key = 0x52480000 | (os.getpid() & 0xFFFF)
    made = attack(hostile, "shm_create", key=key)
    assert "shmid" in made, made
    assert made["ipc_ns"] != os.readlink("/proc/self/ns/ipc")  # its own IPC namespace
    assert key not in _host_shm_keys()  # never in the host's namespace
    assert attack(hostile, "shm_find", key=key) == {"shmget": "ENOENT"}  # another session's worker
    hostile.stop()  # the worker ends: no process is left in its namespace, which the kernel frees
    # as its last process's exit completes, which on a loaded machine may come just after stop() returns
    assert wait_for(lambda: made["ipc_ns"] not in _ipc_namespaces_in_use()), made
    assert key not in _host_shm_keys()


def test_a_worker_cannot_create_namespaces(hostile: ActorSystem) -> None:
    got = attack(hostile, "namespaces")
    assert got == {
        "unshare_user": "EPERM", "unshare_net": "EPERM", "unshare_ipc": "EPERM", "clone_user": "EPERM",
        "clone3": "ENOSYS", "setns": "EPERM",
    }  # fmt: skip
    assert_serving(hostile)


def test_a_worker_cannot_open_raw_netlink_or_unix_sockets(hostile: ActorSystem) -> None:
    folder = tempfile.mkdtemp(prefix="rho-unix-")  # a host service's socket, open to every uid
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "service.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen(8)
        server.setblocking(False)
        try:
            got = attack(hostile, "sockets", unix=path)
            assert not accepted(server)
        finally:
            os.unlink(path)
            os.rmdir(folder)
    assert got == {
        "netlink_route": "EPERM", "netlink_netfilter": "EPERM", "packet": "EPERM", "raw_inet": "EPERM",
        "raw_inet6": "EPERM", "unix_connect": "EPERM", "tcp": "EPERM", "socketpair": "allowed",
    }  # fmt: skip


def test_ptrace_keyctl_bpf_io_uring_and_mount_are_denied(hostile: ActorSystem) -> None:
    if platform.machine() not in _NR:
        pytest.skip(f"syscall numbers unknown on {platform.machine()}")
    got = attack(hostile, "syscalls")
    assert got == dict.fromkeys(
        ("ptrace", "keyctl", "add_key", "request_key", "bpf", "userfaultfd", "io_uring_setup", "mount"), "EPERM"
    ), got
    assert_serving(hostile)


def test_a_worker_cannot_write_more_than_disk_bytes_in_its_folder(tmp_path: Path) -> None:
    disk = 8 * MIB
    with make_system(tmp_path, confinement=Confinement(disk_bytes=disk)) as system:
        assert system.register(Attack, untrusted=True).info is not None
        assert system.stats()["confinement"]["disk_bytes"] == disk
        loop = system.start_loop("filler")
        try:
            def fill(files: int, per_file_mib: int) -> ToolResult:
                arguments = json.dumps(
                    {"attack": "fill_disk", "files": files, "per_file_mib": per_file_mib, "prefix": str(files)}
                )
                [result] = loop.run_turn([ToolCall(f"fill-{time.monotonic_ns()}", "attack", arguments)])
                return result

            result = fill(4, 4)  # 16 MiB in four files, each under RLIMIT_FSIZE
            assert not result.ok and result.error_kind == ErrorKind.RAISED, result
            assert "No space left on device" in result.content and "bounded to 8 MiB in all" in result.content
            assert "Confinement(disk_bytes=...)" in result.content
            within = fill(1, 1)  # the same worker: the folder is still full
            assert not within.ok and "bounded to 8 MiB" in within.content, within
        finally:
            loop.stop()
    with pytest.raises(ValueError, match=r"disk_bytes=1000\): give bytes, at least 1 MiB"):
        Confinement(disk_bytes=1000)


def test_stats_list_every_mechanism(tmp_path: Path) -> None:
    with make_system(tmp_path) as system:
        info = system.stats()["confinement"]
        for mechanism in ("ipc_namespace", "mount_namespace", "network_namespace", "disk_bound", "seccomp",
                          "landlock", "identity"):
            assert mechanism in info["active"], info
        assert info["missing"] == [] and info["namespaces"]["available"] and info["seccomp"]["available"]


def test_a_mechanism_the_host_lacks_is_an_event_and_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: list[str]
) -> None:
    monkeypatch.setattr(seccomp, "unavailable", lambda: "the kernel has no seccomp filters (as on this host)")
    probe.cache_clear()
    events: list[IsolationEvent] = []
    try:
        with make_system(tmp_path) as system:
            system.subscribe(lambda e: events.append(e) if isinstance(e, IsolationEvent) else None)
            assert system.register(Attack, untrusted=True).info is not None
            info = system.stats()["confinement"]
            assert "seccomp" not in info["active"] and "network_namespace" in info["active"]
            assert info["missing"] == [
                "untrusted workers run without a seccomp filter (file locks, AIO and sockets stay open to them): "
                "the kernel has no seccomp filters (as on this host)"
            ]
            assert attack(system, "namespaces")["unshare_user"] == "allowed"  # what the missing filter denied
    finally:
        monkeypatch.undo()
        probe.cache_clear()
    assert [(e.kind, e.tool, e.detail) for e in events] == [("confinement_missing", "*", info["missing"][0])]
    assert any(info["missing"][0] in line for line in logs), logs


def test_a_confinement_that_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match=r"seccomp=True\) needs no_new_privs=True"):
        Confinement(no_new_privs=False)
    with pytest.raises(ValueError, match=r"disk_bytes='64M'\): give bytes"):
        Confinement(disk_bytes="64M")  # type: ignore[arg-type]
    assert Confinement(no_new_privs=False, seccomp=False).seccomp is False
