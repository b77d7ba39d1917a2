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

import functools
import ipaddress
import socket
import struct
import threading
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

    @functools.cached_property
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


@functools.lru_cache(maxsize=1024)
def parse_peer(peer: str) -> Peer:
    """Parse grpc's `context.peer()`; anything unrecognised is an "unknown", non-local peer. Kept for
    the peers seen lately: the same string is the same address, whoever is behind it."""
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


def _diag_request(client: IPAddress, client_port: int, server: IPAddress, server_port: int) -> bytes:
    """The sock_diag request (after its netlink header) for one TCP socket, by its four addresses."""
    family = socket.AF_INET if client.version == 4 else socket.AF_INET6
    sockid = struct.pack(">HH", client_port, server_port)
    sockid += client.packed.ljust(16, b"\0") + server.packed.ljust(16, b"\0")
    sockid += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    return struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ANY_STATE) + sockid


class _Diag(threading.local):
    """One sock_diag socket per thread, kept open: opening one per lookup costs more than the lookup.
    A reply is taken only with its request's sequence number, and a socket that failed or timed out
    is closed, so that a late reply can never answer a later question."""

    sock: socket.socket | None = None
    seq: int = 0

    def uid(self, request: bytes) -> int | None:
        """Ask the kernel (one exact lookup: no table walk) who owns the socket `request` names."""
        netlink = getattr(socket, "AF_NETLINK", None)  # Linux only (the private daemon also runs on PCs)
        if netlink is None:
            return None
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, self.seq, 0)
        try:
            if self.sock is None:
                self.sock = socket.socket(netlink, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
                self.sock.settimeout(1.0)
            self.sock.send(header + request)
            reply = self.sock.recv(4096)
            while len(reply) >= 16 and struct.unpack_from("=I", reply, 8)[0] != self.seq:
                reply = self.sock.recv(4096)  # an earlier question's answer: never this one's
        except OSError:  # no sock_diag here (kernel, seccomp, SELinux), or no answer: the caller falls back
            self.close()
            return None
        if len(reply) < _UID_OFFSET + 4 or struct.unpack_from("=H", reply, 4)[0] != SOCK_DIAG_BY_FAMILY:
            return None  # NLMSG_ERROR: no such socket
        return int(struct.unpack_from("=I", reply, _UID_OFFSET)[0])

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


_diag = _Diag()


def _server_addresses(listen_host: str, client: IPAddress) -> list[IPAddress]:
    """Where a local client may have connected to reach a listener on `listen_host`."""
    try:
        host = ipaddress.ip_address(listen_host)
    except ValueError:  # "localhost"
        return [client]
    if host.is_unspecified:  # 0.0.0.0 or ::, so any local address, most likely the client's own
        return [client] + ([ipaddress.ip_address("127.0.0.1")] if client.version == 4 else [])
    return [host] if host.version == client.version else []


@functools.lru_cache(maxsize=1024)
def _diag_requests(peer: Peer, listeners: tuple[Listener, ...]) -> tuple[bytes, ...]:
    """The lookups that may find a caller's socket, in order. Worked out once per peer address: they
    depend on the addresses alone, never on who owns the socket (the kernel is asked on every call,
    so a port reused by another user's connection is that user's)."""
    try:
        client = ipaddress.ip_address(peer.host)
    except ValueError:
        return ()
    if isinstance(client, ipaddress.IPv6Address) and client.ipv4_mapped is not None:
        client = client.ipv4_mapped  # a dual-stack listener; the client's socket is IPv4
    if peer.port is None:
        return ()
    return tuple(
        _diag_request(client, peer.port, server, port)
        for listen_host, port in listeners
        for server in _server_addresses(listen_host, client)
    )


def socket_owner(peer: Peer, listeners: Sequence[Listener]) -> int | None:
    """The uid owning the caller's end of a TCP connection on this machine, or None when unknown."""
    for request in _diag_requests(peer, tuple(listeners)):
        uid = _diag.uid(request)
        if uid is not None:
            return uid
    return None


def uid_identity(uid: int) -> str:
    """A local user as an identity, on every door: "uid:1000"."""
    return f"uid:{uid}"


def anonymous_identity(peer: Peer, listeners: Sequence[Listener]) -> str:
    """Who a caller without credentials is: its local user, else its address, else "unix-socket"."""
    if peer.family == "unix":
        return UNIX_SOCKET
    if not peer.is_local:
        return peer.host
    uid = socket_owner(peer, listeners)
    return uid_identity(uid) if uid is not None else peer.connection()
