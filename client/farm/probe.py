"""Reaching one farm device and asking it how it is: health, SoC, versions, load, reservation.

A device is usable when its gRPC health check says SERVING and its GetInfo shows a protocol this
client can speak; anything else (refused, unresolvable, NOT_SERVING, a version mismatch, bad
credentials) is an unhealthy status with the reason, found within the probe timeout.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rknn_client import __version__
from rknn_client.api import Device
from rknn_client.errors import RknnError, from_rpc_error
from rknn_client.farm.auth import AuthError, auth_metadata
from rknn_client.farm.inventory import DeviceEntry
from rknn_client.negotiate import check_versions
from rknn_client.transport.base import Endpoint, TransportError
from rknn_client.transport.tcp import tcp_endpoint
from rknn_proto import rknn_pb2
from rknn_proto.version import PROTOCOL_VERSION


def endpoint_of(entry: DeviceEntry) -> Endpoint:
    if entry.address.startswith("adb:"):
        from rknn_client.transport.adb import open_adb

        return open_adb(entry.address.removeprefix("adb:"))
    return tcp_endpoint(entry.address)


def open_device(
    entry: DeviceEntry, metadata: Sequence[tuple[str, str]] = (), timeout_s: float | None = None
) -> Device:
    """A client Device for a farm entry, carrying its credentials and any extra metadata."""
    try:
        credentials = auth_metadata(entry.auth)
    except AuthError as exc:
        raise TransportError(f"device {entry.name}: {exc}") from exc
    return Device(endpoint_of(entry), timeout_s, metadata=(*credentials, *metadata))


@dataclass(frozen=True)
class DeviceStatus:
    """What a probe found; `error` is set (and the rest empty) when the device did not answer."""

    entry: DeviceEntry
    healthy: bool
    error: str = ""
    soc: str = ""  # the entry's soc label, else what the daemon reports
    reported_soc: str = ""  # what the daemon reports
    board: str = ""
    daemon_version: str = ""
    protocol_version: int = 0
    runtime: str = ""
    runtime_version: str = ""
    driver_version: str = ""
    open_sessions: int = 0
    reserved_by: str = ""
    reservation_waiters: int = 0


def get_info(device: Device, timeout_s: float) -> rknn_pb2.GetInfoResponse:
    request = rknn_pb2.GetInfoRequest(
        client_protocol_version=PROTOCOL_VERSION,
        client_version=f"rknn_client {__version__} farm python {platform.python_version()}",
    )
    return device._call("GetInfo", device._stub.GetInfo, request, timeout=timeout_s)


def check_health(device: Device, timeout_s: float) -> None:
    """Raise unless the daemon's gRPC health service says SERVING (it answers without credentials)."""
    stub = health_pb2_grpc.HealthStub(device._channel)
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, f"health check on {device.endpoint.description}") from None
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        raise RknnError(f"the daemon at {device.endpoint.description} reports health {status}")


def probe(entry: DeviceEntry, timeout_s: float = 3.0) -> DeviceStatus:
    """Health check, then GetInfo and the version check, each within `timeout_s`; never raises."""
    try:
        with open_device(entry) as device:
            check_health(device, timeout_s)
            reply = get_info(device, timeout_s)
            mismatch = check_versions(reply, device.endpoint.description, device.endpoint.device_id)
    except (RknnError, TransportError, OSError) as exc:
        return DeviceStatus(entry, healthy=False, error=str(exc))
    if mismatch is not None:
        return DeviceStatus(entry, healthy=False, error=mismatch.message())
    return DeviceStatus(
        entry,
        healthy=True,
        soc=entry.soc(reply.soc),
        reported_soc=reply.soc,
        board=reply.board,
        daemon_version=reply.daemon_version,
        protocol_version=reply.protocol_version,
        runtime=reply.runtime,
        runtime_version=reply.runtime_version,
        driver_version=reply.driver_version,
        open_sessions=reply.open_sessions,
        reserved_by=reply.reservation.holder if reply.HasField("reservation") else "",
        reservation_waiters=reply.reservation_waiters,
    )
