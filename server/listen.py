"""Listen addresses: `tcp://HOST:PORT` and `unix-abstract:NAME`, parsed once and checked early."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET, DEFAULT_PORT

DEFAULT_LISTEN = (f"tcp://127.0.0.1:{DEFAULT_PORT}", f"unix-abstract:{DEFAULT_ABSTRACT_SOCKET}")


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
        return (
            self.scheme == "unix-abstract"
            or self.host in ("127.0.0.1", "localhost", "::1")
            or self.host.startswith("127.")
        )


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
