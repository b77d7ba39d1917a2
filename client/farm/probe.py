"""Reaching one farm device and asking it how it is: health, SoC, versions, load, reservation.

A device is usable when its gRPC health check says SERVING and its GetInfo shows a protocol this
client can speak; anything else (refused, unresolvable, NOT_SERVING, a version mismatch, bad
credentials) is an unhealthy status with the reason, found within the probe timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rknn_client.device import Device
from rknn_client.errors import RknnError
from rknn_client.farm.auth import AuthError, auth_token
from rknn_client.farm.inventory import DeviceEntry
from rknn_client.transport.base import Endpoint, TransportError
from rknn_client.transport.tcp import tcp_endpoint


def endpoint_of(entry: DeviceEntry) -> Endpoint:
    if entry.address.startswith("adb:"):
        from rknn_client.transport.adb import open_adb

        return open_adb(entry.address.removeprefix("adb:"))
    return tcp_endpoint(entry.address)


def open_device(
    entry: DeviceEntry, metadata: Sequence[tuple[str, str]] = (), timeout_s: float | None = None
) -> Device:
    """A client Device for a farm entry, with its token (else the usual RKNN_SERVER_TOKEN) and any
    extra metadata."""
    try:
        token = auth_token(entry.auth)
    except AuthError as exc:
        raise TransportError(f"device {entry.name}: {exc}") from exc
    return Device(endpoint_of(entry), timeout_s, metadata, token=token)


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


def probe(entry: DeviceEntry, timeout_s: float = 3.0) -> DeviceStatus:
    """Health check, then GetInfo and the version check, each within `timeout_s`; never raises."""
    try:
        with open_device(entry) as device:
            device.health(timeout_s)
            info = device.info(timeout=timeout_s)
    except (RknnError, TransportError, OSError) as exc:
        return DeviceStatus(entry, healthy=False, error=str(exc))
    return DeviceStatus(
        entry,
        healthy=True,
        soc=entry.soc(info.soc),
        reported_soc=info.soc,
        board=info.board,
        daemon_version=info.daemon_version,
        protocol_version=info.protocol_version,
        runtime=info.runtime,
        runtime_version=info.runtime_version,
        driver_version=info.driver_version,
        open_sessions=info.open_sessions,
        reserved_by=info.reserved_by,
        reservation_waiters=info.reservation_waiters,
    )
