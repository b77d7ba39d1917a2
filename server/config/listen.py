"""Listen addresses: `tcp://HOST:PORT` and `unix-abstract:NAME`, parsed once and checked early."""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET, DEFAULT_PORT

DEFAULT_LISTEN = (f"tcp://127.0.0.1:{DEFAULT_PORT}", f"unix-abstract:{DEFAULT_ABSTRACT_SOCKET}")


class ListenError(OSError):
    """A listen address cannot be bound; the message says which and why."""


@dataclass(frozen=True)
class ListenAddress:
    scheme: str  # "tcp" | "unix-abstract"
    host: str
    port: int
    name: str

    def grpc_address(self) -> str:
        if self.scheme == "unix-abstract":
            return f"unix-abstract:{self.name}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def display(self, bound_port: int | None = None) -> str:
        if self.scheme == "unix-abstract":
            return f"unix-abstract:{self.name}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{bound_port if bound_port is not None else self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.scheme == "unix-abstract" or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name other than localhost: it may resolve anywhere
            return False


def parse_listen(text: str) -> ListenAddress:
    if text.startswith("unix-abstract:"):
        name = text.removeprefix("unix-abstract:")
        if not name or "/" in name:
            raise ValueError(f"listen address {text!r}: expected unix-abstract:NAME with a non-empty NAME")
        return ListenAddress("unix-abstract", "", 0, name)
    parts = urlsplit(text)
    if parts.scheme != "tcp" or not parts.hostname or parts.path:
        raise ValueError(f"listen address {text!r}: expected tcp://HOST:PORT or unix-abstract:NAME")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        raise ValueError(f"listen address {text!r}: expected a port 0-65535 (0 picks a free one)")
    return ListenAddress("tcp", parts.hostname, port, "")


def bind_problem(address: ListenAddress) -> str | None:
    """Why `address` cannot be bound, or None: binding a plain socket says why, where grpc only logs that
    it failed (and in a line of its own on stderr)."""
    target: str | tuple[Any, ...]
    try:
        if address.scheme == "unix-abstract":
            family, target = socket.AF_UNIX, "\0" + address.name
        else:
            infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
            family, target = infos[0][0], infos[0][4]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            if family != socket.AF_UNIX:  # as grpc does, so that connections in TIME_WAIT do not count
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(target)
    except OSError as exc:
        return "the address is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
    return None


def parse_metrics_listen(text: str) -> ListenAddress:
    """--metrics-listen: a TCP address (HTTP has no abstract-socket clients)."""
    address = parse_listen(text)
    if address.scheme != "tcp":
        raise ValueError(f"metrics listen address {text!r}: expected tcp://HOST:PORT")
    return address
