"""Direct TCP: `tcp://HOST:PORT` (or a bare HOST:PORT when RKNN_SERVER names one)."""

from __future__ import annotations

from urllib.parse import urlsplit

from rknn_client.transport.base import Endpoint, TransportError
from rknn_proto.version import DEFAULT_PORT


def is_tcp_address(device_id: str) -> bool:
    return device_id.startswith("tcp://")


def tcp_endpoint(address: str) -> Endpoint:
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme != "tcp" or not parts.hostname or parts.path not in ("", "/"):
        raise TransportError(f"{address!r} is not a daemon address; expected tcp://HOST[:PORT]")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise TransportError(
            f"{address!r} has an invalid port; expected tcp://HOST:PORT with PORT 1-65535"
        ) from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    url = f"tcp://{host}:{port}"
    return Endpoint(grpc_target=f"{host}:{port}", description=url, kind="tcp", device_id=url)
