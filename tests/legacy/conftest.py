"""Fixtures: the real toolkit, a real .rknn, a daemon serving the legacy protocol on the stand-in
librknnrt, and an emulated board reached through the toolkit's own adb binary."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rknn_server.testing import DaemonProcess, start_daemon
from tests.adb.fixtures import EmulatedBoard, PrivateAdbServer
from tests.adb.services import DeviceProfile
from tests.legacy.toolkit import Toolkit, export_tiny_rknn, find_toolkit
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt_cases import rknnrt_args


@dataclass
class LegacyDaemon:
    process: DaemonProcess
    name: str  # the abstract socket it serves the legacy protocol on
    board: Path  # the fake board root it probes (also the emulated adb board's root)

    @property
    def address(self) -> str:
        return "\0" + self.name

    @property
    def url(self) -> str:
        return self.process.url


LegacyDaemonFactory = Callable[..., LegacyDaemon]


@pytest.fixture(scope="session")
def toolkit() -> Toolkit:
    found = find_toolkit()
    if found is None:
        pytest.skip("no RKNN-Toolkit2 venv (run `rknn-client toolkit install --torch-stub`)")
    return found


# The toolkit releases whose client the listener serves; behaviour tests run with each one installed.
TOOLKIT_VERSIONS = ("2.5.0", "2.3.2")


@pytest.fixture(params=TOOLKIT_VERSIONS)
def each_toolkit(request: pytest.FixtureRequest) -> Toolkit:
    """Each release in turn, unmodified (their bundled adb is the same binary, so one adb server
    serves both); a release that is not installed skips, saying how to install it."""
    version = request.param
    found = find_toolkit(version)
    if found is None:
        pytest.skip(
            f"no RKNN-Toolkit2 {version} venv (rknn-client toolkit install --version {version} --torch-stub)"
        )
    return found


@pytest.fixture(scope="session")
def real_rknn(toolkit: Toolkit, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_tiny_rknn(toolkit, tmp_path_factory.mktemp("real-rknn"))


@pytest.fixture
def legacy_daemon(tmp_path: Path, stub_lib: Path) -> Iterator[LegacyDaemonFactory]:
    """Factory: daemons on the stub librknnrt and a fake RK3588, serving the legacy protocol on a
    private abstract name (plus `extra` arguments); each is stopped by PID at the end."""
    started: list[LegacyDaemon] = []

    def start(*extra: str) -> LegacyDaemon:
        work = tmp_path / f"daemon{len(started)}"
        name = f"rknn-legacy-test-{uuid.uuid4().hex[:12]}"
        board = rk3588_board(work / "board")
        args = rknnrt_args(stub_lib, board, "--legacy-listen", f"unix-abstract:{name}", *extra)
        daemon = LegacyDaemon(start_daemon(work / "cache", work / "daemon.log", args), name, board)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.process.stop()


@pytest.fixture(scope="session")
def toolkit_adb(toolkit: Toolkit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateAdbServer]:
    """A private server of the toolkit's bundled adb (the client and server versions must match)."""
    server = PrivateAdbServer(str(toolkit.adb), tmp_path_factory.mktemp("toolkit-adb-home"))
    server.start()
    yield server
    server.stop()


RESTARTS_LOG = "restart-commands.log"


def ps_showing(pid: int) -> str:
    """A `ps` that lists the daemon under the name the kernel really has for it."""
    return f'echo "  PID TTY          TIME CMD"; echo "  {pid} ?        00:00:00 $(cat /proc/{pid}/comm)"'


def recording(command: str, root: Path) -> str:
    """A stand-in for a board command the toolkit runs when it finds no `rknn_server` process
    (`killall rknn_server`, `nohup /usr/bin/rknn_server`): it only records the call."""
    return f'echo "{command} $*" >> {root / RESTARTS_LOG}'


@pytest.fixture
def board_for(toolkit_adb: PrivateAdbServer) -> Iterator[Callable[[LegacyDaemon], EmulatedBoard]]:
    """Factory: an emulated board whose `local:transfer_proxy` reaches a daemon's legacy listener."""
    boards: list[EmulatedBoard] = []

    def attach(daemon: LegacyDaemon) -> EmulatedBoard:
        profile = DeviceProfile(
            daemon.board,
            serial_name=f"legacy{len(boards)}",
            abstract_sockets={"transfer_proxy": daemon.name},
            commands={
                "ps": ps_showing(daemon.process.pid),
                "killall": recording("killall", daemon.board),
                "nohup": recording("nohup", daemon.board),
            },
        )
        board = EmulatedBoard(toolkit_adb, profile)
        boards.append(board)
        return board

    yield attach
    for board in boards:
        board.close()
