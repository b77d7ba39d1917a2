"""Version negotiation against fake daemons of other protocol versions, over TCP and over adb."""

from __future__ import annotations

import pytest

from rknn_client import RKNN
from rknn_client.device import connect
from rknn_client.errors import VersionMismatch
from rknn_proto.version import PROTOCOL_VERSION
from tests.adb.conftest import FakeDaemonFactory, MakeBoard
from tests.adb.fake_daemon import FakeDaemon


def version_error(device_id: str) -> str:
    with pytest.raises(VersionMismatch) as raised, connect(device_id) as device:
        device.info()
    return str(raised.value)


def test_a_newer_daemon_that_still_accepts_this_client_works(fake_daemon: FakeDaemonFactory) -> None:
    daemon: FakeDaemon = fake_daemon(PROTOCOL_VERSION + 3, min_client=PROTOCOL_VERSION)
    with connect(daemon.url) as device:
        assert device.info().protocol_version == PROTOCOL_VERSION + 3


def test_an_older_daemon_names_both_versions_and_the_upgrade(fake_daemon: FakeDaemonFactory) -> None:
    daemon = fake_daemon(0)
    message = version_error(daemon.url)
    assert f"speaks protocol {PROTOCOL_VERSION}" in message and "speaks protocol 0" in message
    assert "rknn-client deploy --device SERIAL" in message
    assert "\n" not in message, "one message, not a chain of them"


def test_a_daemon_needing_a_newer_client_over_adb_names_the_board(
    make_board: MakeBoard, fake_daemon: FakeDaemonFactory
) -> None:
    daemon = fake_daemon(PROTOCOL_VERSION + 5, min_client=PROTOCOL_VERSION + 2)
    board = make_board(abstract_sockets={"rknn_server": daemon.socket_name})
    message = version_error(board.serial)
    assert f"speaks protocol {PROTOCOL_VERSION + 5}" in message
    assert f"needs clients >= {PROTOCOL_VERSION + 2}" in message
    assert f"rknn-client deploy --device {board.serial}" in message and "pip install -U" in message


def test_the_toolkit_call_fails_with_the_same_message(
    make_board: MakeBoard, fake_daemon: FakeDaemonFactory, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = fake_daemon(0)
    board = make_board(abstract_sockets={"rknn_server": daemon.socket_name})
    model = tmp_path / "model.rknn"
    model.write_bytes(b"RKNN")
    rknn = RKNN()
    try:
        assert rknn.load_rknn(str(model)) == 0
        assert rknn.init_runtime(target="rk3588", device_id=board.serial) == -1
    finally:
        rknn.release()
    err = capsys.readouterr()
    assert f"rknn-client deploy --device {board.serial}" in err.out + err.err
