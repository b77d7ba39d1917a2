"""A whole board reached over adb, for tests outside tests/adb: a private adb server, an emulated board
attached to it, and a host-runtime daemon whose abstract socket the board serves as `rknn_server`.

The daemon listens on a name of its own (concurrent test runs never share one); the emulated board maps
its `localabstract:rknn_server` to it, so the client reaches it with the default socket name.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET
from rknn_server.testing import DaemonProcess, start_daemon
from tests.adb.fixtures import EmulatedBoard, PrivateAdbServer, find_adb
from tests.adb.services import DeviceProfile

# Environment keys that point adbutils and the adb transport at one adb server.
ADB_ENV_KEYS = ("ANDROID_ADB_SERVER_PORT", "ADB_MDNS", "ADB_MDNS_OPENSCREEN", "HOME")


def point_adb_at(server: PrivateAdbServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this process (adbutils, the transport) use `server` only."""
    for key in ADB_ENV_KEYS:
        monkeypatch.setenv(key, server.env[key])
    monkeypatch.setenv("ADBUTILS_ADB_PATH", server.binary)
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)


@dataclass
class AdbHostBoard:
    server: PrivateAdbServer
    board: EmulatedBoard
    daemon: DaemonProcess
    soc: str

    @property
    def serial(self) -> str:
        return self.board.serial


@contextlib.contextmanager
def adb_host_board(root: Path, soc: str = "rk3588") -> Iterator[AdbHostBoard]:
    """Start everything under `root`; stop every process it started, by PID, on exit."""
    binary = find_adb()
    if binary is None:
        pytest.skip("no adb binary: pip install adbutils or apt-get install adb")
    socket_name = f"rknn-test-{uuid.uuid4().hex[:12]}"
    with contextlib.ExitStack() as stack:
        server = PrivateAdbServer(binary, root / "adb-home")
        server.start()
        stack.callback(server.stop)
        daemon = start_daemon(
            root / "cache",
            root / "daemon.log",
            ["--runtime", "host", "--soc", soc, "--listen", f"unix-abstract:{socket_name}"],
        )
        stack.callback(daemon.stop)
        profile = DeviceProfile(
            root / "board",
            serial_name="adbhost",
            model="Emulated RK3588 board",
            abstract_sockets={DEFAULT_ABSTRACT_SOCKET: socket_name},
        )
        board = EmulatedBoard(server, profile)
        stack.callback(board.close)
        yield AdbHostBoard(server, board, daemon, soc)
