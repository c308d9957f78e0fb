"""Who owns a local TCP socket, from the kernel's socket tables (``/proc/net/tcp``
and ``/proc/net/tcp6``: each row gives a socket's addresses, state and owner uid).

Used by :mod:`rho_actors.mcp.guard` to tell MCP clients apart by uid (every loopback
client has the address 127.0.0.1) and by :class:`~rho_actors.mcp.MCPServer` to check
who listens on the port of a URL reaching this host (:func:`local_hosts`) before it
sends its headers (DESIGN §6b). The
tables are of this process's network namespace, which is the one that matters: a socket
of another namespace is not reachable through loopback here.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
import urllib.parse
from pathlib import Path

__all__ = ["is_loopback", "listener_uids", "local_hosts", "pin_listener", "socket_uid"]

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hex(host: str, port: int, family: int) -> str:
    """``host:port`` as the kernel's table writes it (32-bit words in host order)."""
    packed = socket.inet_pton(family, host)
    words = "".join(f"{int.from_bytes(packed[i:i + 4], 'little'):08X}" for i in range(0, len(packed), 4))
    return f"{words}:{port:04X}"


def _forms(host: str, port: int) -> set[str]:
    """Every way the tables may write ``host:port`` (IPv4, IPv6, IPv4-mapped IPv6)."""
    address = ipaddress.ip_address(host.strip("[]"))
    if isinstance(address, ipaddress.IPv4Address):
        return {_hex(str(address), port, socket.AF_INET), _hex(f"::ffff:{address}", port, socket.AF_INET6)}
    mapped = address.ipv4_mapped
    forms = {_hex(str(address), port, socket.AF_INET6)}
    if mapped is not None:
        forms.add(_hex(str(mapped), port, socket.AF_INET))
    return forms


def _rows() -> list[list[str]]:
    rows: list[list[str]] = []
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        rows.extend(line.split() for line in lines)
    return [row for row in rows if len(row) > 9]


def socket_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The owner uid of the TCP socket whose own address is ``local`` and whose peer is
    ``remote`` (``(host, port)`` each), or None when there is no such socket here or no
    process holds it (a closed socket in TIME_WAIT, which the kernel reports as uid 0).
    Asked of the kernel for that one socket (netlink ``sock_diag``, about 0.1 ms), else
    read from the tables (which cost a read of every socket's row)."""
    with contextlib.suppress(OSError, ValueError):
        return _diag_uid(local, remote)
    mine, theirs = _forms(*local), _forms(*remote)
    for row in _rows():
        if row[1] in mine and row[2] in theirs:
            return int(row[7]) if row[9] != "0" else None  # inode 0: no process holds it (TIME_WAIT: uid 0)
    return None


_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NETLINK_SOCK_DIAG = 4
_NO_COOKIE = 0xFFFFFFFF


def _diag_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """:func:`socket_uid` by netlink ``sock_diag`` (``inet_diag_req_v2`` naming the exact
    socket, every state). Raises ``OSError`` where the kernel does not answer it, and
    ``ValueError`` for an address of two families."""
    local_ip, remote_ip = ipaddress.ip_address(local[0].strip("[]")), ipaddress.ip_address(remote[0].strip("[]"))
    if local_ip.version != remote_ip.version:
        raise ValueError("addresses of two families")
    family = socket.AF_INET if local_ip.version == 4 else socket.AF_INET6
    sockid = (struct.pack("!HH", local[1], remote[1]) + local_ip.packed.ljust(16, b"\0")
              + remote_ip.packed.ljust(16, b"\0") + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(1.0)
        link.sendto(header + request, (0, 0))
        answer = link.recv(8192)
    length, kind = struct.unpack_from("=IH", answer)
    if kind == _NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", answer, 16)
        if error == -errno.ENOENT:
            return None
        raise OSError(-error, os.strerror(-error))
    if kind != _SOCK_DIAG_BY_FAMILY or length < 16 + 4 + 48 + 12 + 8:
        raise OSError(errno.EPROTO, "an unexpected sock_diag answer")
    # inet_diag_msg: uid and inode after expires, rqueue, wqueue; a socket no process
    # holds (inode 0: a TIME_WAIT one, which the kernel reports as uid 0) has no owner
    uid, inode = struct.unpack_from("=II", answer, 16 + 4 + 48 + 12)
    return int(uid) if inode else None


def listener_uids(host: str, port: int) -> set[int]:
    """The owner uids of the sockets listening on TCP ``port`` that take connections to
    ``host`` (bound to that address, or to every address). An empty set: none listens."""
    wanted = {form.split(":")[0] for form in _forms(host, port)}
    wanted |= {"00000000", "0" * 32, "0000000000000000FFFF000000000000"}  # 0.0.0.0, ::, ::ffff:0.0.0.0
    uids: set[int] = set()
    for row in _rows():
        address, _, row_port = row[1].partition(":")
        if row[3] == _LISTEN and int(row_port, 16) == port and address in wanted:
            uids.add(int(row[7]))
    return uids


def local_hosts(host: str, port: int) -> tuple[str, ...]:
    """The addresses of this host that a connection to ``host`` (an address or a name,
    as a URL spells it) on ``port`` reaches, or ``()`` when it reaches none: a loopback
    address, the unspecified one (``0.0.0.0`` and ``::`` reach loopback), an IPv4-mapped
    one, one of this host's own addresses (one a socket can be bound to), a name (each
    address it resolves to). Never raises."""
    bare = host.strip("[]")
    if bare.lower() == "localhost":
        return ("127.0.0.1", "::1")
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:  # a name: where it resolves (the connection resolves it the same way)
        try:
            found = {str(info[4][0]) for info in socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)}
        except (OSError, UnicodeError):
            return ()
        return tuple(sorted({local for one in found for local in local_hosts(one, port)}))
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        return local_hosts(str(mapped), port)
    if address.is_unspecified:
        return ("127.0.0.1",) if address.version == 4 else ("::1",)
    if address.is_loopback:
        return (str(address),)
    with socket.socket(socket.AF_INET if address.version == 4 else socket.AF_INET6) as probe:
        try:
            probe.bind((str(address), 0))  # only an address of this host can be bound
        except OSError:
            return ()
    return (str(address),)


def pin_listener(url: str, uid: int) -> None:
    """Raise ``PermissionError`` when a socket listening on ``url``'s port, where the URL
    reaches this host (:func:`local_hosts`: loopback however spelled, one of its own
    addresses, a name resolving to one), belongs to a uid other than ``uid``,
    ``ConnectionRefusedError`` when none listens (nothing has been sent either way). A
    URL reaching another host is left to TLS."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    hosts = local_hosts(host, port)
    if not hosts:
        return
    owners = set().union(*(listener_uids(h, port) for h in hosts))
    if not owners:
        raise ConnectionRefusedError(f"nothing listens on {host}:{port}")
    if owners != {uid}:
        others = sorted(owners - {uid})
        raise PermissionError(f"{host}:{port} is listened on by uid {others} where uid {uid} was expected "
                              "(server_uid): not connecting, no headers sent")
