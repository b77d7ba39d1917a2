"""Fixtures for the emulated boards. These tests run only under `make board-test` (python -m
tests.board), which builds the rootfs images and names them in RKNN_BOARD_ROOTFS; a plain `pytest`
run collects nothing here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from rknn_proto.ready import wait_tcp_address
from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET
from tests.adb import fixtures as adb_fixtures
from tests.adb.fixtures import (
    EmulatedBoard,
    PrivateAdbServer,
)
from tests.adb.host_board import point_adb_at
from tests.board.machine import Board
from tests.board.profile import board_profile
from tests.board.rootfs import BOARD_VENV, BOARDS, BoardSpec, host_pip_wheel
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt.stub_build import build_stub

ENV_ROOTFS = "RKNN_BOARD_ROOTFS"
ENV_WHEEL = "RKNN_BOARD_WHEEL"
if ENV_ROOTFS not in os.environ:
    collect_ignore_glob = ["test_*.py"]

# The board's fake RK3588 (device tree, NPU node, clocks) the daemon probes instead of the host's /sys.
FAKE_SYSFS = "/opt/fake-rk3588"
BOARD_LIB = "/usr/lib/librknnrt.so"
# Under emulation a start takes seconds (8x native) and more on a busy machine.
START_SECONDS = 240.0
# The board's settings for the daemon (docs/deploy.md: every option is also a variable): the stand-in
# runtime, and the fake RK3588 in place of an NPU node, which the emulated board cannot have.
DAEMON_ENV = {
    "RKNN_SERVER_RUNTIME": "rknnrt",
    "RKNN_SERVER_RUNTIME_LIB": BOARD_LIB,
    "RKNN_SERVER_SYSFS_ROOT": FAKE_SYSFS,
}


def rootfs_of(name: str) -> Path:
    paths: dict[str, str] = json.loads(os.environ.get(ENV_ROOTFS, "{}"))
    if name not in paths:
        pytest.skip(f"the {name} board is not in this run (make board-test BOARDS='arm64 {name}')")
    return Path(paths[name])


def daemon_boards() -> list[str]:
    """The boards of this run that carry the daemon's venv (default: arm64 only)."""
    paths: dict[str, str] = json.loads(os.environ.get(ENV_ROOTFS, "{}"))
    return [name for name in paths if BOARDS[name].with_venv] or ["arm64"]


@dataclass
class ReadyBoard:
    """A booted board with this clone's wheel in its venv, the stand-in runtime and a fake RK3588."""

    spec: BoardSpec
    board: Board
    install_output: str


def equip(board: Board, library: Path) -> None:
    """Lay the cross-compiled stand-in over the board's /usr/lib and give it a fake RK3588 to probe."""
    shutil.copy2(library, board.path(BOARD_LIB))
    rk3588_board(board.path(FAKE_SYSFS))


@pytest.fixture(scope="session")
def project_wheel() -> Path:
    return Path(os.environ[ENV_WHEEL])


CrossStub = Callable[[BoardSpec], Path]


@pytest.fixture(scope="session")
def cross_stub(tmp_path_factory: pytest.TempPathFactory) -> CrossStub:
    """The stand-in librknnrt.so cross-compiled for a board (tests/rknnrt/stub_build.py with CC set)."""
    built: dict[str, Path] = {}

    def build(spec: BoardSpec) -> Path:
        if spec.cross_cc not in built:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("CC", spec.cross_cc)
                built[spec.cross_cc] = build_stub(tmp_path_factory.mktemp(f"stub-{spec.name}"))
        return built[spec.cross_cc]

    return build


@pytest.fixture(scope="session", params=daemon_boards())
def ready_board(
    request: pytest.FixtureRequest, project_wheel: Path, cross_stub: CrossStub
) -> Iterator[ReadyBoard]:
    spec = BOARDS[request.param]
    with Board(rootfs_of(spec.name)) as board:
        shutil.copy2(project_wheel, board.path(f"/tmp/{project_wheel.name}"))
        pip_wheel = host_pip_wheel(board.path("/tmp"))
        # This clone's wheel over the cached venv's, as a board user upgrades (the venv's
        # dependencies came from PyPI when the rootfs was built, docs/deploy.md's steps).
        pip = f"{BOARD_VENV}/bin/python /tmp/{pip_wheel.name}/pip"
        result = board.run(
            f"{pip} install --no-index --no-deps --force-reinstall --disable-pip-version-check "
            f"/tmp/{project_wheel.name}",
            timeout=600,
        )
        assert result.returncode == 0, result.stdout
        equip(board, cross_stub(spec))
        yield ReadyBoard(spec, board, result.stdout)


@dataclass
class BoardDaemon:
    """`rknn_server` running inside a board, started from this machine through nsenter."""

    process: subprocess.Popen[str]
    address: str
    socket_name: str
    start_seconds: float
    log: Path

    @property
    def url(self) -> str:
        return f"tcp://{self.address}"

    def host_pid(self) -> int:
        """The daemon's PID as this machine sees it (nsenter's one child)."""
        (child,) = psutil.Process(self.process.pid).children()
        return child.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            for child in psutil.Process(self.process.pid).children():
                child.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                for child in psutil.Process(self.process.pid).children():
                    child.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_board_daemon(ready: ReadyBoard, log: Path) -> BoardDaemon:
    """The daemon as docs/deploy.md runs it, on TCP loopback and an abstract socket of its own."""
    socket_name = f"rknn-board-{uuid.uuid4().hex[:12]}"
    command = (
        f"exec {BOARD_VENV}/bin/rknn_server serve --listen tcp://127.0.0.1:0 "
        f"--listen unix-abstract:{socket_name} --model-cache /tmp/cache --log-format json"
    )
    env = DAEMON_ENV | {"PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with log.open("w") as errors:
        process = subprocess.Popen(
            ready.board.command(command, env), stdout=subprocess.PIPE, stderr=errors, text=True
        )
    assert process.stdout is not None
    address = wait_tcp_address(process.stdout, START_SECONDS)
    elapsed = time.monotonic() - started
    daemon = BoardDaemon(process, address or "", socket_name, elapsed, log)
    if address is None:
        daemon.stop()
        raise AssertionError(
            f"the daemon on the {ready.spec.name} board did not start: {log.read_text()[-3000:]}"
        )
    return daemon


@pytest.fixture(scope="session")
def board_daemon(ready_board: ReadyBoard, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BoardDaemon]:
    daemon = start_board_daemon(ready_board, tmp_path_factory.mktemp("board-daemon") / "daemon.log")
    yield daemon
    daemon.stop()


adb_server = adb_fixtures.adb_server  # the run's private adb server (a session fixture)


@pytest.fixture
def adb_env(adb_server: PrivateAdbServer, monkeypatch: pytest.MonkeyPatch) -> PrivateAdbServer:
    point_adb_at(adb_server, monkeypatch)
    return adb_server


@pytest.fixture(scope="session")
def adb_board(
    adb_server: PrivateAdbServer, ready_board: ReadyBoard, board_daemon: BoardDaemon
) -> Iterator[EmulatedBoard]:
    """The ready board behind the adbd emulator; its `rknn_server` socket is the board daemon's."""
    profile = board_profile(
        ready_board.board,
        f"emulated-{ready_board.spec.name}",
        abstract_sockets={DEFAULT_ABSTRACT_SOCKET: board_daemon.socket_name},
        board_env=DAEMON_ENV,
    )
    board = EmulatedBoard(adb_server, profile)
    yield board
    board.close()
