"""Untrusted tools as attackers against the clean room as a whole (DESIGN §5 "A clean
start", "Confinement", "Namespaces and the syscall filter"): ways around the socket
rules, into sibling workers, and into the host's memory through its decoding of replies.
Each attack goes through the public API (a registered untrusted tool, called from a
session), written as a malicious author would write it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from rho_actors import ActorSystem
from rho_actors.confinement import probe

from .test_hostile_untrusted import SESSIONS, Echo, assert_serving, call
from .test_namespaces import make_system

HOST = probe()
pytestmark = [
    pytest.mark.skipif(HOST.namespaces is not None, reason=str(HOST.namespaces)),
    pytest.mark.skipif(HOST.seccomp is not None, reason=str(HOST.seccomp)),
]


def _errno_of(thunk: Any) -> str:
    try:
        thunk()
        return "allowed"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


class Sneak:
    """Runs the attack named by ``args["attack"]`` in its worker and reports what happened."""

    name = staticmethod(lambda: "sneak")
    description = staticmethod(lambda: "Sneak past the rules.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    timeout_ms = staticmethod(lambda: 20_000)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        attack = args["attack"]
        if attack == "unix_dgram":  # an unnamed Unix socket pointed at a host service's pathname socket
            out: dict[str, str] = {}
            for kind in ("SOCK_DGRAM", "SOCK_STREAM", "SOCK_SEQPACKET"):
                def sendto(kind: str = kind) -> None:
                    a, b = socket.socketpair(socket.AF_UNIX, getattr(socket, kind) | socket.SOCK_CLOEXEC)
                    with a, b:
                        a.sendto(f"sendto by {kind}".encode(), args["path"])

                def connect(kind: str = kind) -> None:
                    a, b = socket.socketpair(socket.AF_UNIX, getattr(socket, kind))
                    with a, b:
                        a.connect(args["path"])
                        a.send(f"connect by {kind}".encode())

                out[f"{kind}_sendto"] = _errno_of(sendto)
                out[f"{kind}_connect"] = _errno_of(connect)
            out["pipe"] = _errno_of(lambda: list(map(os.close, os.pipe())))
            out["stream_pair"] = _errno_of(lambda: list(map(socket.socket.close, socket.socketpair())))
            return out
        raise ValueError(f"unknown attack {attack!r}")


@pytest.fixture
def hostile(tmp_path: Any) -> Iterator[ActorSystem]:
    with make_system(tmp_path / "data") as system:
        for tool in (Echo, Sneak):
            registration = system.register(tool, untrusted=True)
            assert registration.info is not None, registration.reason
        yield system


def sneak(system: ActorSystem, name: str, **args: Any) -> dict[str, Any]:
    result = call(system, f"attacker-{next(SESSIONS)}", "sneak", {"attack": name, **args})
    assert result.ok, result
    out: dict[str, Any] = json.loads(result.content)
    return out


@contextlib.contextmanager
def host_datagram_service() -> Iterator[tuple[str, socket.socket]]:
    """A host service's datagram socket (as ``/dev/log`` or journald's), open to every uid."""
    folder = tempfile.mkdtemp(prefix="rho-dgram-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "service.sock")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
            server.bind(path)
            os.chmod(path, 0o777)
            server.setblocking(False)
            yield path, server
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.rmdir(folder)


def received(server: socket.socket) -> list[bytes]:
    got: list[bytes] = []
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(server.recv(4096))
    return got


def test_a_socketpair_cannot_reach_a_hosts_datagram_socket(hostile: ActorSystem) -> None:
    with host_datagram_service() as (path, server):
        got = sneak(hostile, "unix_dgram", path=path)
        assert received(server) == []
    assert got["SOCK_DGRAM_sendto"] == got["SOCK_DGRAM_connect"] == "EPERM", got
    for kind in ("SOCK_STREAM", "SOCK_SEQPACKET"):  # connected for life: they name no other peer
        assert got[f"{kind}_connect"] != "allowed", got  # (a seqpacket sendto goes to its own pair)
    assert got["pipe"] == got["stream_pair"] == "allowed", got  # a tool's own pipes still work
    assert_serving(hostile)
