"""Which daemon a call reaches, in the toolkit's order:

1. `device_id` given: that device (`tcp://HOST:PORT` directly; an adb serial or `IP:PORT` over adb);
2. else `RKNN_SERVER` from the environment;
3. else, with `target` set: the single attached adb board;
4. else (no target, no device): a private host-runtime daemon, the toolkit's simulator.
"""

from __future__ import annotations

import os

from rknn_client.transport.base import Endpoint, TransportError
from rknn_client.transport.private import start_private_daemon
from rknn_client.transport.tcp import is_tcp_address, tcp_endpoint

ENV_SERVER = "RKNN_SERVER"


def _adb(serial: str | None) -> Endpoint:
    try:
        from rknn_client.transport.adb import open_adb
    except ImportError as exc:
        raise TransportError(
            f"reaching a board over adb needs the adb transport ({exc}); "
            "connect over TCP instead with device_id='tcp://HOST:PORT' or RKNN_SERVER=tcp://HOST:PORT"
        ) from exc
    return open_adb(serial)


def resolve(device_id: str | None, target: str | None) -> Endpoint:
    if device_id:
        return tcp_endpoint(device_id) if is_tcp_address(device_id) else _adb(device_id)
    env = os.environ.get(ENV_SERVER, "").strip()
    if env:
        return tcp_endpoint(env)
    if target:
        return _adb(None)
    return start_private_daemon()
