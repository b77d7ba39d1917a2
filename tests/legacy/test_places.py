"""Where the legacy protocol is served, and when it is not: local sockets only, off by default with a
token file, an explicit place with a warning, the socket file private to the daemon's user."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rknn_server.protocols.legacy.listener import parse_place
from rknn_server.protocols.legacy.startup import plan
from rknn_server.testing import start_daemon
from tests.adb.fixtures import EmulatedBoard, PrivateAdbServer
from tests.adb.services import DeviceProfile
from tests.legacy.conftest import LegacyDaemonFactory
from tests.legacy.wire_client import VERSION, VERSION_ACK, WireClient
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt_cases import rknnrt_args


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a path short enough for a unix socket (pytest's tmp_path may not be)."""
    folder = Path(tempfile.mkdtemp(prefix="rl-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_socket_path_place_is_served_and_private(
    legacy_daemon: LegacyDaemonFactory, short_dir: Path
) -> None:
    path = short_dir / "socket" / "transfer_proxy"
    daemon = legacy_daemon("--legacy-listen", f"unix:{path}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    client = WireClient(str(path))
    assert client.open() == 0
    assert client.call(VERSION).command == VERSION_ACK
    client.close()
    daemon.process.stop()
    assert not path.exists() or path.is_socket()


@pytest.mark.parametrize(
    "place", ["tcp://127.0.0.1:5000", "unix:relative/path", "unix-abstract:", "transfer_proxy"]
)
def test_places_other_than_local_sockets_are_refused(place: str) -> None:
    with pytest.raises(ValueError, match="unix"):
        parse_place(place)
    run = subprocess.run(
        [sys.executable, "-m", "rknn_server", "--legacy-listen", place],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "legacy listen place" in run.stderr


def test_the_default_serves_boards_and_a_token_file_turns_it_off_unless_asked() -> None:
    assert plan(None, on_board=False, authenticated=False).places == ()
    assert plan(None, on_board=True, authenticated=False).places == (
        "unix:/dev/socket/transfer_proxy",
        "unix-abstract:transfer_proxy",
    )
    guarded = plan(None, on_board=True, authenticated=True)
    assert guarded.places == () and "token file" in guarded.warnings[0]
    explicit = plan(("unix-abstract:x",), on_board=False, authenticated=True)
    assert explicit.places == ("unix-abstract:x",) and explicit.explicit
    assert "no authentication" in explicit.warnings[0]
    assert plan((), on_board=True, authenticated=False).places == ()


def test_an_explicit_place_with_a_token_file_is_served_with_a_warning(
    legacy_daemon: LegacyDaemonFactory, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("ci:" + "t" * 32 + "\n")
    tokens.chmod(0o600)
    daemon = legacy_daemon("--auth-token-file", str(tokens))
    client = WireClient(daemon.address)
    assert client.open() == 0
    client.close()
    daemon.process.stop()
    assert "has no authentication" in daemon.process.log_text()


def test_adb_forwards_local_transfer_proxy_to_the_board_socket_file(
    stub_lib: Path, toolkit_adb: PrivateAdbServer, short_dir: Path
) -> None:
    """What the toolkit sets up (`adb forward localabstract:... local:transfer_proxy`) through the real
    adb binary reaches the daemon at the emulated board's /dev/socket/transfer_proxy."""
    board_root = rk3588_board(short_dir / "b")
    socket_path = board_root / "dev" / "socket" / "transfer_proxy"
    daemon = start_daemon(
        short_dir / "cache",
        short_dir / "daemon.log",
        rknnrt_args(stub_lib, board_root, "--legacy-listen", f"unix:{socket_path}"),
    )
    board = EmulatedBoard(toolkit_adb, DeviceProfile(board_root, serial_name="socketfile"))
    host_name = f"rknn-legacy-forward-{short_dir.name}"
    try:
        toolkit_adb.adb("-s", board.serial, "forward", f"localabstract:{host_name}", "local:transfer_proxy")
        client = WireClient("\0" + host_name)
        assert client.open() == 0
        assert client.call(VERSION).command == VERSION_ACK
        client.close()
    finally:
        toolkit_adb.adb("-s", board.serial, "forward", "--remove", f"localabstract:{host_name}", check=False)
        board.close()
        daemon.stop()
