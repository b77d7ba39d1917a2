"""Who is on the other end of a connection, as far as the socket can tell.

grpc gives a servicer only a peer string, and no SO_PEERCRED. For a loopback TCP caller the kernel
still knows the user that owns the caller's end, and sock_diag (what `ss` uses) answers for one
socket by its addresses in tens of microseconds (/proc/net/tcp walks every hash bucket: milliseconds).
So a caller without a token is named by its local user ("uid:1000",
stable across reconnections, and the unit of trust on Unix: processes of one user can already
inspect and signal each other), a remote caller by its address, and an abstract-socket caller
(adb forward: every such caller arrives through adbd) by the socket alone.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

UNIX_SOCKET = "unix-socket"


@dataclass(frozen=True)
class Peer:
    """A caller's transport address, parsed from grpc's peer string.

    grpc writes "ipv4:10.0.0.2:5555", "ipv6:%5B::1%5D:5555" (brackets URL-escaped), and "unix:" or
    "unix:/path" for unix sockets; an abstract-socket caller (adb forward) is "unix:" with nothing that
    tells two callers apart, and grpc exposes no SO_PEERCRED.
    """

    family: str  # "ipv4" | "ipv6" | "unix" | "unknown"
    host: str  # the address without brackets; the socket path (often empty) for unix
    port: int | None

    @property
    def is_local(self) -> bool:
        """On this machine: a unix or abstract socket, or a loopback address (IPv4-mapped included)."""
        if self.family == "unix":
            return True
        try:
            address = ipaddress.ip_address(self.host)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return address.ipv4_mapped.is_loopback
        return address.is_loopback

    def connection(self) -> str:
        """One connection's name: "10.0.0.2:5555", "[::1]:5555", "unix-socket" (callers cannot be told apart)."""
        if self.family == "unix":
            return UNIX_SOCKET
        host = f"[{self.host}]" if self.family == "ipv6" else self.host
        return f"{host}:{self.port}" if self.port is not None else host


def parse_peer(peer: str) -> Peer:
    """Parse grpc's `context.peer()`; anything unrecognised is an "unknown", non-local peer."""
    family, _, rest = peer.partition(":")
    if family in ("unix", "unix-abstract"):
        return Peer("unix", unquote(rest), None)
    rest = unquote(rest)
    if family == "ipv6" and rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif family == "ipv4":
        host, _, port_text = rest.rpartition(":")
    else:
        return Peer("unknown", peer, None)
    return Peer(family, host, int(port_text) if port_text.isdigit() else None)


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Listener = tuple[str, int]  # a bound TCP listener: its host as given to --listen, and its port
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_ANY_STATE = 0xFFFFFFFF
_UID_OFFSET = 16 + 4 + 48 + 12  # nlmsghdr, then inet_diag_msg: 4 bytes, the socket id, 3 u32s, then uid


def _diag_uid(client: IPAddress, client_port: int, server: IPAddress, server_port: int) -> int | None:
    """Ask the kernel (sock_diag, one exact lookup: no table walk) who owns the client's socket."""
    family = socket.AF_INET if client.version == 4 else socket.AF_INET6
    sockid = struct.pack(">HH", client_port, server_port)
    sockid += client.packed.ljust(16, b"\0") + server.packed.ljust(16, b"\0")
    sockid += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ANY_STATE) + sockid
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    netlink = getattr(socket, "AF_NETLINK", None)  # Linux only (the private daemon also runs on PCs)
    if netlink is None:
        return None
    try:
        with socket.socket(netlink, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(1.0)
            diag.send(header + request)
            reply = diag.recv(4096)
    except OSError:  # no sock_diag here (kernel, seccomp, SELinux): the caller falls back
        return None
    if len(reply) < _UID_OFFSET + 4 or struct.unpack_from("=H", reply, 4)[0] != SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket
    return int(struct.unpack_from("=I", reply, _UID_OFFSET)[0])


def _server_addresses(listen_host: str, client: IPAddress) -> list[IPAddress]:
    """Where a local client may have connected to reach a listener on `listen_host`."""
    try:
        host = ipaddress.ip_address(listen_host)
    except ValueError:  # "localhost"
        return [client]
    if host.is_unspecified:  # 0.0.0.0 or ::, so any local address, most likely the client's own
        return [client] + ([ipaddress.ip_address("127.0.0.1")] if client.version == 4 else [])
    return [host] if host.version == client.version else []


def socket_owner(peer: Peer, listeners: Sequence[Listener]) -> int | None:
    """The uid owning the caller's end of a TCP connection on this machine, or None when unknown."""
    try:
        client = ipaddress.ip_address(peer.host)
    except ValueError:
        return None
    if isinstance(client, ipaddress.IPv6Address) and client.ipv4_mapped is not None:
        client = client.ipv4_mapped  # a dual-stack listener; the client's socket is IPv4
    if peer.port is None:
        return None
    for listen_host, port in listeners:
        for server in _server_addresses(listen_host, client):
            uid = _diag_uid(client, peer.port, server, port)
            if uid is not None:
                return uid
    return None


def anonymous_identity(peer: Peer, listeners: Sequence[Listener]) -> str:
    """Who a caller without credentials is: its local user, else its address, else "unix-socket"."""
    if peer.family == "unix":
        return UNIX_SOCKET
    if not peer.is_local:
        return peer.host
    uid = socket_owner(peer, listeners)
    return f"uid:{uid}" if uid is not None else peer.connection()
