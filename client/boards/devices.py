"""`rknn-client devices`: every board this PC can reach, what it is, and whether its daemon answers.

The SoC and board model come from the daemon's GetInfo when it answers, else from the board itself over
adb shell (the device tree on Linux images, `getprop` on Android).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import adbutils

from rknn_client.boards.doctor import TOKEN_FIX
from rknn_client.boards.shell import BoardShell
from rknn_client.device import Device
from rknn_client.errors import AuthenticationFailed, RknnError
from rknn_client.transport.adb import (
    AdbDeviceInfo,
    AdbTransportError,
    adb_server_address,
    adb_server_running,
    attached_devices,
    connect_adb_server,
    no_server_fix,
    open_adb,
)
from rknn_client.transport.base import Endpoint, TransportError
from rknn_client.transport.resolve import ENV_SERVER
from rknn_client.transport.tcp import tcp_endpoint
from rknn_proto import rknn_pb2
from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET

_COLUMNS = ("DEVICE", "TRANSPORT", "STATE", "SOC", "MODEL", "DAEMON", "DAEMON VERSION", "RUNTIME")
# One shell round trip for everything the board says about itself.
_IDENTITY_SCRIPT = (
    "echo compatible=$(tr '\\0' ' ' < /proc/device-tree/compatible 2>/dev/null); "
    "echo dtmodel=$(tr -d '\\0' < /proc/device-tree/model 2>/dev/null); "
    "echo platform=$(getprop ro.board.platform 2>/dev/null); "
    "echo propmodel=$(getprop ro.product.model 2>/dev/null)"
)


@dataclass(frozen=True)
class DeviceRow:
    address: str
    transport: str  # "adb-usb", "adb-network" or "tcp"
    state: str
    soc: str = ""
    model: str = ""
    daemon: bool = False
    daemon_version: str = ""
    runtime: str = ""
    refused: str = ""  # why the daemon refused this client (its token), when it answered so


def survey(
    tcp_addresses: Sequence[str] = (),
    socket_name: str = DEFAULT_ABSTRACT_SOCKET,
    timeout: float = 3.0,
    token: str | None = None,
) -> list[DeviceRow]:
    """Every attached adb board plus each TCP daemon named (and RKNN_SERVER), without starting an adb
    server. Daemons are asked with the credentials every command uses (`token`, else RKNN_SERVER_TOKEN)."""
    rows: list[DeviceRow] = []
    with contextlib.suppress(AdbTransportError):
        client = connect_adb_server(start=False)
        rows += [_adb_row(client, device, socket_name, timeout, token) for device in attached_devices(client)]
    env = os.environ.get(ENV_SERVER, "").strip()
    for address in [*tcp_addresses, *([env] if env else [])]:
        rows.append(_tcp_row(address, timeout, token))
    return rows


def _handshake(
    endpoint: Endpoint, timeout: float, token: str | None
) -> tuple[rknn_pb2.GetInfoResponse | None, str]:
    """GetInfo through a Device (credentials included), or None and why the daemon refused this
    client ("" when it did not answer at all). Closes `endpoint`."""
    try:
        with Device(endpoint, token=token) as device:
            return device.handshake(timeout), ""
    except AuthenticationFailed as error:
        return None, str(error)
    except (RknnError, TransportError):
        return None, ""


def _adb_row(
    client: adbutils.AdbClient, device: AdbDeviceInfo, socket_name: str, timeout: float, token: str | None
) -> DeviceRow:
    transport = "adb-network" if device.is_network else "adb-usb"
    if device.state != "device":
        return DeviceRow(device.serial, transport, device.state, model=device.model)
    info: rknn_pb2.GetInfoResponse | None = None
    refused = ""
    with contextlib.suppress(TransportError):
        info, refused = _handshake(open_adb(device.serial, socket_name=socket_name), timeout, token)
    soc, model = (info.soc, info.board) if info is not None else ("", "")
    if not (soc and model):
        found_soc, found_model = _board_identity(BoardShell(client.device(device.serial)))
        soc, model = soc or found_soc, model or found_model or device.model
    row = DeviceRow(device.serial, transport, device.state, soc, model, refused=refused)
    return _with_daemon(row, info)


def _board_identity(shell: BoardShell) -> tuple[str, str]:
    """(SoC, model) as the board reports them; '' where it does not."""
    facts = dict(line.split("=", 1) for line in shell.output(_IDENTITY_SCRIPT).splitlines() if "=" in line)
    socs = [
        entry.split(",", 1)[1]
        for entry in facts.get("compatible", "").split()
        if entry.startswith("rockchip,r") and entry.count(",") == 1
    ]
    soc = socs[-1] if socs else facts.get("platform", "").strip()
    return soc, (facts.get("dtmodel") or facts.get("propmodel") or "").strip()


def _tcp_row(address: str, timeout: float, token: str | None) -> DeviceRow:
    try:
        endpoint = tcp_endpoint(address)
    except TransportError:
        return DeviceRow(address, "tcp", "invalid address")
    info, refused = _handshake(endpoint, timeout, token)
    if refused:
        return DeviceRow(endpoint.device_id, "tcp", "reachable", refused=refused)
    if info is None:
        return DeviceRow(endpoint.device_id, "tcp", "unreachable")
    return _with_daemon(DeviceRow(endpoint.device_id, "tcp", "reachable", info.soc, info.board), info)


def _with_daemon(row: DeviceRow, info: rknn_pb2.GetInfoResponse | None) -> DeviceRow:
    if info is None:
        return row
    runtime = f"{info.runtime} {info.runtime_version}".strip()
    return replace(row, daemon=True, daemon_version=info.daemon_version, runtime=runtime)


def adb_problem() -> str:
    """Why no adb board can be listed at all (no adb server answers, and this never starts one),
    with the fix; '' when a server answers."""
    host, port = adb_server_address()
    if adb_server_running(host, port):
        return ""
    return (
        f"no adb server answers on {host}:{port}, so no adb board could be listed (devices never starts "
        f"one).\n  fix: {no_server_fix(port)}; or name a daemon with --device tcp://HOST:PORT or RKNN_SERVER"
    )


def devices_table(rows: Sequence[DeviceRow], adb_problem: str = "") -> str:
    """A fixed-width table, one board per line; under it, why a daemon refused this client. With no
    row, `adb_problem` (why no adb board could be listed) says what is wrong instead."""
    if not rows:
        if adb_problem:
            return f"No device found: {adb_problem}\n"
        return (
            "No device found. Attach a board over USB (adb devices), or a network board with "
            "`adb connect IP:5555`, or name a daemon with --device tcp://HOST:PORT or RKNN_SERVER.\n"
        )
    cells = [
        (
            r.address,
            r.transport,
            r.state,
            r.soc or "-",
            r.model or "-",
            "yes" if r.daemon else "refused" if r.refused else "no",
            r.daemon_version or "-",
            r.runtime or "-",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [_COLUMNS, *cells]) for i in range(len(_COLUMNS))]
    table = "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in [_COLUMNS, *cells]
    )
    refusals = "".join(f"{r.address}: {r.refused}\n  fix: {TOKEN_FIX}\n" for r in rows if r.refused)
    return table + refusals
