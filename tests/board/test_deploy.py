"""`rknn-client deploy` from this PC onto emulated boards over adb, end to end: the offline bundle
built here for the board's Python and architecture (from PyPI), pushed, installed and started there;
and a Debian 11 board (Python 3.9) refused with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rknn_client import __version__
from rknn_client.deploy.install import INSTALL_DIR, LAUNCHER_MARK, PID_FILE, TOOLKIT_LAUNCHER
from rknn_client.device import Device
from rknn_client.transport.adb import open_adb
from tests.adb.fixtures import EmulatedBoard, PrivateAdbServer
from tests.board.conftest import DAEMON_ENV, CrossStub, daemon_boards, equip, rootfs_of
from tests.board.machine import Board
from tests.board.profile import board_profile
from tests.board.rootfs import BOARDS
from tests.board.stub_case import an_image, expected, stub_model

CLI = Path(sys.executable).with_name("rknn-client")
# The bundle downloads from PyPI and the board installs it under emulation (about a minute idle).
DEPLOY_SECONDS = 600


def deploy(serial: str, socket_name: str) -> subprocess.CompletedProcess[str]:
    """The command a user types, with this process's environment (the private adb server)."""
    command = [str(CLI), "deploy", "--device", serial, "--socket", socket_name]
    return subprocess.run(command, capture_output=True, text=True, timeout=DEPLOY_SECONDS, check=False)


@pytest.fixture
def attach(adb_env: PrivateAdbServer) -> Iterator[list[EmulatedBoard]]:
    """Boards put behind the adbd emulator here are detached at the end."""
    attached: list[EmulatedBoard] = []
    yield attached
    for board in attached:
        board.close()


@pytest.mark.parametrize("name", daemon_boards())
def test_deploy_installs_and_starts_the_daemon_on_a_board_without_it(
    name: str, adb_env: PrivateAdbServer, attach: list[EmulatedBoard], cross_stub: CrossStub, tmp_path: Path
) -> None:
    spec = BOARDS[name]
    socket_name = f"rknn-deploy-{uuid.uuid4().hex[:12]}"
    with Board(rootfs_of(name)) as board:
        assert board.run(f"rm -rf {INSTALL_DIR}").returncode == 0  # the image as mmdebstrap made it
        equip(board, cross_stub(spec))
        emulated = EmulatedBoard(adb_env, board_profile(board, f"deploy-{name}", board_env=DAEMON_ENV))
        attach.append(emulated)

        first = deploy(emulated.serial, socket_name)
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"installed rknn_server {__version__} into {INSTALL_DIR}" in first.stdout
        assert LAUNCHER_MARK in board.path(TOOLKIT_LAUNCHER).read_text()
        pid = board.path(PID_FILE).read_text().strip()
        assert board.run(f"kill -0 {pid}").returncode == 0

        image = an_image(11)
        with Device(open_adb(emulated.serial, socket_name=socket_name)) as device:
            session = device.load(stub_model(tmp_path / "m.rknn"))
            try:
                (output,) = session.run([image])
            finally:
                session.release()
        np.testing.assert_array_equal(output, expected(image))

        again = deploy(emulated.serial, socket_name)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"rknn_server {__version__} already installed and running" in again.stdout
        assert board.path(PID_FILE).read_text().strip() == pid


def test_deploy_refuses_a_python_39_board_and_changes_nothing(
    adb_env: PrivateAdbServer, attach: list[EmulatedBoard]
) -> None:
    with Board(rootfs_of("bullseye")) as board:
        emulated = EmulatedBoard(adb_env, board_profile(board, "deploy-bullseye"))
        attach.append(emulated)
        refused = deploy(emulated.serial, f"rknn-deploy-{uuid.uuid4().hex[:12]}")
        assert refused.returncode != 0
        assert "has Python 3.9; the daemon needs >= 3.10" in refused.stdout + refused.stderr
        assert not board.path(INSTALL_DIR).exists()
        assert not os.path.lexists(board.path(TOOLKIT_LAUNCHER))
