"""Reaching a daemon through adb: pick the board, forward a local port to its socket.

Uses adbutils against whatever adb server the environment names (ANDROID_ADB_SERVER_HOST/PORT,
ADBUTILS_ADB_PATH for the binary). Never kills or restarts a server; starts one only when none
answers on the configured local port.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import threading
from dataclasses import dataclass

import adbutils

from rknn_client.errors import ErrorWithFix
from rknn_client.transport.base import Endpoint, TransportError, android_serial
from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET

DEFAULT_ADB_SERVER_PORT = 5037
# `adb connect IP` without a port means this one.
NETWORK_ADB_PORT = 5555
_START_SERVER_SECONDS = 30
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


class AdbTransportError(TransportError, ErrorWithFix):
    """An adb link is broken: `problem` says which, `fix` how to mend it."""


class AdbServerUnavailable(AdbTransportError):
    """No adb server answers (and none could be started)."""


class AdbDeviceNotFound(AdbTransportError):
    """The requested board (or any board) is not attached."""


class AdbDeviceAmbiguous(AdbTransportError):
    """Several boards are attached and none was named."""


class AdbDeviceNotReady(AdbTransportError):
    """The board is listed but offline, unauthorized or not accessible."""


class AdbForwardFailed(AdbTransportError):
    """adb refused to forward a local port to the board."""


@dataclass(frozen=True)
class AdbDeviceInfo:
    """One line of `adb devices -l`."""

    serial: str
    state: str
    model: str = ""
    product: str = ""

    @property
    def is_network(self) -> bool:
        """Attached with `adb connect HOST:PORT` rather than over USB."""
        host, _, port = self.serial.rpartition(":")
        return bool(host) and port.isdigit()


def adb_server_address() -> tuple[str, int]:
    """The adb server this process is configured to use."""
    host = os.environ.get("ANDROID_ADB_SERVER_HOST") or "127.0.0.1"
    port = int(os.environ.get("ANDROID_ADB_SERVER_PORT") or DEFAULT_ADB_SERVER_PORT)
    return host, port


def adb_server_running(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def no_server_fix(port: int) -> str:
    """How to get an adb server on `port` (the one this process is configured to use)."""
    return (
        f"start one with `adb -P {port} start-server`, or set ANDROID_ADB_SERVER_PORT to the port "
        "your adb server uses"
    )


def connect_adb_server(start: bool = True) -> adbutils.AdbClient:
    """A client for the configured adb server, starting a local one when none answers and `start`."""
    host, port = adb_server_address()
    if not adb_server_running(host, port):
        if not start or host not in _LOCAL_HOSTS:
            raise AdbServerUnavailable(f"no adb server answers on {host}:{port}", no_server_fix(port))
        _start_adb_server(port)
    return adbutils.AdbClient(host=host, port=port)


def _start_adb_server(port: int) -> None:
    try:
        binary = adbutils.adb_path()
    except adbutils.AdbError as error:
        raise AdbServerUnavailable(
            "no adb server is running and no adb binary was found",
            "install adb (`apt install adb`, or `pip install adbutils` which bundles one) "
            "or set ADBUTILS_ADB_PATH",
        ) from error
    result = subprocess.run(
        [binary, "-P", str(port), "start-server"],
        env=os.environ | {"ANDROID_ADB_SERVER_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=_START_SERVER_SECONDS,
        check=False,
    )
    if result.returncode != 0:
        raise AdbServerUnavailable(
            f"`{binary} start-server` on port {port} failed: {(result.stderr or result.stdout).strip()}",
            "run `adb start-server` yourself and read its message",
        )


def list_adb_devices(start_server: bool = True) -> list[AdbDeviceInfo]:
    """Every board the adb server knows, in any state."""
    return attached_devices(connect_adb_server(start=start_server))


def attached_devices(client: adbutils.AdbClient) -> list[AdbDeviceInfo]:
    """Every board `client`'s adb server knows, in any state."""
    return [
        AdbDeviceInfo(info.serial, info.state, info.tags.get("model", ""), info.tags.get("product", ""))
        for info in client.list(extended=True)
    ]


def _describe(devices: list[AdbDeviceInfo]) -> str:
    return ", ".join(f"{device.serial} ({device.state})" for device in devices) or "none"


def _network_serial(device_id: str) -> str:
    """`IP` means `IP:5555`, as with `adb connect`."""
    return device_id if ":" in device_id else f"{device_id}:{NETWORK_ADB_PORT}"


def find_device(client: adbutils.AdbClient, device_id: str | None) -> AdbDeviceInfo:
    """The board `device_id` names (a serial, IP or IP:PORT); when None, the one ANDROID_SERIAL names,
    else the only attached one (adb's own order).

    A network address that is not attached yet is attached with `adb connect`, as RKNN-Toolkit2's
    user guide asks users to do by hand.
    """
    devices = attached_devices(client)
    device_id = device_id or android_serial()
    if device_id is None:
        if not devices:
            raise AdbDeviceNotFound(
                "no adb device is attached",
                "connect the board's USB OTG port, or attach a network board with `adb connect IP:5555`, "
                "or reach the daemon directly with tcp://HOST:PORT",
            )
        if len(devices) > 1:
            raise AdbDeviceAmbiguous(
                f"several adb devices are attached: {_describe(devices)}",
                "name one with device_id (its serial or IP:PORT)",
            )
        return devices[0]
    for candidate in (device_id, _network_serial(device_id)):
        match = next((device for device in devices if device.serial == candidate), None)
        if match is not None:
            return match
    if _looks_like_address(device_id):
        client.connect(_network_serial(device_id), timeout=10)
        match = next((d for d in attached_devices(client) if d.serial == _network_serial(device_id)), None)
        if match is not None:
            return match
    raise AdbDeviceNotFound(
        f"adb device {device_id!r} is not attached (attached: {_describe(devices)})",
        "check the serial with `adb devices`; for a network board run `adb connect IP:5555` first",
    )


def _looks_like_address(device_id: str) -> bool:
    host = device_id.rpartition(":")[0] if ":" in device_id else device_id
    return host.replace(".", "").isdigit() and host.count(".") == 3


def require_ready(device: AdbDeviceInfo) -> None:
    """Raise with the state-specific fix unless the board is usable."""
    if device.state == "device":
        return
    fixes = {
        "offline": "replug the cable (USB) or run `adb disconnect {s}` then `adb connect {s}` (network); "
        "if it stays offline, restart adbd on the board",
        "unauthorized": "accept the 'Allow USB debugging' prompt on the board, or copy ~/.android/adbkey.pub "
        "into the board's /data/misc/adb/adb_keys",
        "no permissions": "add a udev rule for the board's USB id (plugdev group) and replug it",
    }
    fix = fixes.get(device.state.split(";")[0], "check the board's adbd with `adb devices -l`")
    raise AdbDeviceNotReady(f"adb device {device.serial} is {device.state}", fix.format(s=device.serial))


class _Forwards:
    """Forwards this process opened, removed on close and at interpreter exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], adbutils.AdbDevice] = {}
        atexit.register(self.close_all)

    def add(self, device: adbutils.AdbDevice, port: int) -> None:
        with self._lock:
            self._open[(device.serial or "", port)] = device

    def remove(self, serial: str, port: int) -> None:
        with self._lock:
            device = self._open.pop((serial, port), None)
        if device is None:
            return
        client = device._client  # adbutils keeps the server address only there
        # A server that is gone took its forwards with it; asking adbutils anyway would start a new one.
        if adb_server_running(client.host, client.port):
            with contextlib.suppress(adbutils.AdbError, OSError):
                device.forward_remove(f"tcp:{port}", raise_non_found=False)

    def close_all(self) -> None:
        for serial, port in list(self._open):
            self.remove(serial, port)


_FORWARDS = _Forwards()


def forward_local_port(device: adbutils.AdbDevice, remote: str) -> int:
    """Forward a free local TCP port (adb picks it: `forward tcp:0`) to `remote` on the board."""
    try:
        with device.open_transport(f"forward:tcp:0;{remote}") as connection:
            connection.check_okay()
            port = int(connection.read_string_block())
    except (adbutils.AdbError, ValueError) as error:
        raise AdbForwardFailed(
            f"adb could not forward a local port to {remote} on {device.serial}: {error}",
            "old adbd builds cannot forward to abstract sockets: start the daemon with "
            "`--listen tcp://127.0.0.1:50515` and connect with the tcp fallback",
        ) from error
    _FORWARDS.add(device, port)
    return port


def open_adb(
    device_id: str | None = None,
    *,
    socket_name: str = DEFAULT_ABSTRACT_SOCKET,
    tcp_port: int | None = None,
) -> Endpoint:
    """An Endpoint for the daemon on an adb board.

    Forwards to the abstract socket `socket_name`, or to TCP `tcp_port` on the board when given
    (for boards whose adbd cannot forward to abstract sockets).
    """
    client = connect_adb_server(start=True)
    info = find_device(client, device_id)
    require_ready(info)
    remote = f"tcp:{tcp_port}" if tcp_port is not None else f"localabstract:{socket_name}"
    device = client.device(info.serial)
    port = forward_local_port(device, remote)
    return Endpoint(
        grpc_target=f"127.0.0.1:{port}",
        description=f"adb {info.serial}{f' ({info.model})' if info.model else ''} -> {remote}",
        kind="adb",
        close=lambda: _FORWARDS.remove(info.serial, port),
        device_id=info.serial,
    )
