"""Protocol version negotiation: whether this client and a daemon can work together.

Each side says which protocol it speaks and the oldest peer it accepts. Fields are only ever added, so
any pair within each other's bounds works; otherwise the one fix is to put this client's own daemon
version on the board (`rknn-client deploy`), or to upgrade this PC when it is the older side.
"""

from __future__ import annotations

from dataclasses import dataclass

from rknn_client import __version__
from rknn_proto import rknn_pb2
from rknn_proto.version import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION


@dataclass(frozen=True)
class Mismatch:
    """Why the two sides cannot talk (`problem`, naming both versions) and how to fix it (`fix`)."""

    problem: str
    fix: str

    def message(self) -> str:
        return f"{self.problem}. {self.fix}"


def deploy_command(device_id: str) -> str:
    """The command that installs this client's daemon version on the board `device_id` names.

    deploy works over adb, so a board known by its TCP address is named by its adb serial instead.
    """
    if device_id and not device_id.startswith("tcp://"):
        return f"rknn-client deploy --device {device_id}"
    return "rknn-client deploy --device SERIAL (the board's adb serial, or IP:5555 after `adb connect`)"


def check_versions(info: rknn_pb2.GetInfoResponse, where: str, device_id: str = "") -> Mismatch | None:
    """None when this client can use the daemon that answered `info`; else the single reason why not."""
    daemon_too_old = info.protocol_version < MIN_PROTOCOL_VERSION
    client_too_old = info.min_client_protocol_version > PROTOCOL_VERSION
    if not (daemon_too_old or client_too_old):
        return None
    sides = (
        f"rknn_client {__version__} speaks protocol {PROTOCOL_VERSION} (accepts daemons >= "
        f"{MIN_PROTOCOL_VERSION}); the daemon at {where} (rknn_server {info.daemon_version or 'unknown'}) "
        f"speaks protocol {info.protocol_version}"
    )
    deploy = deploy_command(device_id)
    if daemon_too_old:
        return Mismatch(f"{sides}, too old for this client", f"Upgrade the board's daemon: {deploy}")
    return Mismatch(
        f"{sides} and needs clients >= {info.min_client_protocol_version}",
        "Upgrade this PC: pip install -U 'rknn-server-oss[client]', or put this client's daemon version "
        f"on the board: {deploy}",
    )
