"""Who is on the other end of a connection, as far as the socket can tell.

grpc gives a servicer only a peer string, and no SO_PEERCRED. For a loopback TCP caller the kernel
still knows the user that owns the caller's end: /proc/net/tcp and tcp6 list each socket with its
addresses and its owner's uid. So a caller without a token is named by its local user ("uid:1000",
stable across reconnections, and the unit of trust on Unix: processes of one user can already
inspect and signal each other), a remote caller by its address, and an abstract-socket caller
(adb forward: every such caller arrives through adbd) by the socket alone.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

ESTABLISHED = "01"  # the `st` column of /proc/net/tcp
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


def _proc_form(address: IPAddress, port: int) -> str:
    """The address as /proc/net/tcp{,6} writes it: 32-bit words in host byte order, then the port."""
    words = struct.unpack(f"={len(address.packed) // 4}I", address.packed)
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"


def socket_owner(peer: Peer, proc_net: Path = Path("/proc/net")) -> int | None:
    """The uid owning the caller's end of a TCP connection on this machine, or None when unknown."""
    try:
        address = ipaddress.ip_address(peer.host)
    except ValueError:
        return None
    if peer.port is None:
        return None
    forms: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv4Address):
        forms.append(ipaddress.IPv6Address(f"::ffff:{address}"))
    elif address.ipv4_mapped is not None:
        forms.append(address.ipv4_mapped)
    wanted = {_proc_form(form, peer.port) for form in forms}
    owners: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[1] in wanted and fields[3] == ESTABLISHED:
                owners.add(int(fields[7]))
    return owners.pop() if len(owners) == 1 else None


def anonymous_identity(peer: Peer) -> str:
    """Who a caller without credentials is: its local user, else its address, else "unix-socket"."""
    if peer.family == "unix":
        return UNIX_SOCKET
    if not peer.is_local:
        return peer.host
    uid = socket_owner(peer)
    return f"uid:{uid}" if uid is not None else peer.connection()
