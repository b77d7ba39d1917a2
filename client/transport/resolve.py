"""Which daemon a call reaches, in the toolkit's order:

1. `device_id` given: that device (`tcp://HOST:PORT` directly; an adb serial or `IP:PORT` over adb);
2. else `RKNN_SERVER` from the environment;
3. else `ANDROID_SERIAL` (adb's own choice of board when no serial is given): that adb board;
4. else, with `target` set: the single attached adb board;
5. else (no target, no device): a private host-runtime daemon, the toolkit's simulator.

The adb server is never started or changed here (no `start-server`, no `adb connect`): a board is
reached over adb only when a running adb server already lists it. A bare `HOST:PORT` that no adb
server lists is tried as `tcp://HOST:PORT` (a gRPC health check) before it is refused.
"""

from __future__ import annotations

import os

import grpc

from rknn_client.transport.base import Endpoint, TransportError, android_serial
from rknn_client.transport.health import health_status
from rknn_client.transport.private import start_private_daemon
from rknn_client.transport.security import Credentials, open_channel
from rknn_client.transport.tcp import is_tcp_address, tcp_endpoint

ENV_SERVER = "RKNN_SERVER"
# How long a bare HOST:PORT gets to answer a gRPC health check before it is refused.
PROBE_TIMEOUT_S = 3.0
# Codes that mean nothing gRPC answered at that address; any other code means a gRPC server did.
_NO_ANSWER = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _adb(serial: str | None) -> Endpoint:
    try:
        from rknn_client.transport import adb
    except ImportError as exc:
        raise TransportError(
            f"reaching a board over adb needs the adb transport ({exc}); "
            "connect over TCP instead with device_id='tcp://HOST:PORT' or RKNN_SERVER=tcp://HOST:PORT"
        ) from exc
    client = adb.connect_adb_server(start=False)  # raises, with the fix, when no server runs
    if serial is not None:
        listed = _adb_lists(serial)
        if listed is None:
            attached = ", ".join(d.serial for d in adb.attached_devices(client)) or "none"
            raise adb.AdbDeviceNotFound(
                f"adb device {serial!r} is not attached (attached: {attached})",
                "check the serial with `adb devices`; for a network board run `adb connect IP:5555` first",
            )
        serial = listed
    return adb.open_adb(serial)


def _adb_lists(device_id: str) -> str | None:
    """The serial a running adb server lists for `device_id` (itself, or IP as IP:5555); None when no
    server runs or it lists no such device. Never starts a server."""
    try:
        from rknn_client.transport import adb
    except ImportError:
        return None
    host, port = adb.adb_server_address()
    if not adb.adb_server_running(host, port):
        return None
    try:
        serials = {d.serial for d in adb.attached_devices(adb.connect_adb_server(start=False))}
    except (adb.AdbTransportError, OSError):
        return None
    for candidate in (device_id, f"{device_id}:{adb.NETWORK_ADB_PORT}"):
        if candidate in serials:
            return candidate
    return None


def _grpc_answers(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a gRPC server answers a health check at `endpoint` (any status but 'unreachable')."""
    channel = open_channel(endpoint, Credentials.resolve(), [])
    try:
        health_status(channel, timeout)
    except grpc.RpcError as exc:
        return exc.code() not in _NO_ANSWER if isinstance(exc, grpc.Call) else False
    finally:
        channel.close()
    return True


def _host_port(device_id: str) -> bool:
    host, _, port = device_id.rpartition(":")
    return bool(host) and port.isdigit()


def resolve_device_id(device_id: str) -> Endpoint:
    """The endpoint an explicit device id names; refuses at once what names nothing reachable."""
    if "://" in device_id:
        if is_tcp_address(device_id):
            return tcp_endpoint(device_id)
        scheme = device_id.split("://", 1)[0]
        raise TransportError(
            f"{device_id!r}: unsupported scheme {scheme}://; a daemon is tcp://HOST:PORT, "
            "an adb board its serial or IP:PORT"
        )
    if not _host_port(device_id):
        return _adb(device_id)
    if _adb_lists(device_id) is not None:
        return _adb(device_id)
    endpoint = tcp_endpoint(device_id)
    if _grpc_answers(endpoint):
        return endpoint
    raise TransportError(
        f"{device_id} is neither an adb device a running adb server lists nor a daemon: both were tried, "
        f"and nothing answers at {endpoint.description}. A network adb board must be attached first "
        f"(`adb connect {device_id}`); a daemon must run and listen there (`rknn-client doctor --device "
        f"{endpoint.description}` walks the chain)"
    )


def resolve(device_id: str | None, target: str | None) -> Endpoint:
    if device_id:
        return resolve_device_id(device_id)
    env = os.environ.get(ENV_SERVER, "").strip()
    if env:
        return tcp_endpoint(env)
    serial = android_serial()
    if serial:
        return resolve_device_id(serial)
    if target:
        return _adb(None)
    return start_private_daemon()
