"""Which board a toolkit script reaches over adb, and the target check on it."""

from __future__ import annotations

import numpy as np
import pytest

from rknn_client import RKNN
from rknn_client.device import connect
from rknn_client.transport.adb import AdbDeviceAmbiguous, AdbDeviceNotFound
from rknn_client.transport.resolve import ENV_SERVER
from tests.adb.conftest import MakeBoard
from tests.adb.fixtures import PrivateAdbServer
from tests.adb.host_board import AdbHostBoard, point_adb_at


@pytest.fixture
def only_adb_board(adb_board: AdbHostBoard, monkeypatch: pytest.MonkeyPatch) -> AdbHostBoard:
    """The session's adb board as the single attached one, with no RKNN_SERVER to take precedence."""
    point_adb_at(adb_board.server, monkeypatch)
    monkeypatch.delenv(ENV_SERVER, raising=False)
    return adb_board


def test_a_target_without_device_id_uses_the_single_adb_board(
    only_adb_board: AdbHostBoard, cnn_model
) -> None:
    with connect(None, only_adb_board.soc) as device:
        assert device.endpoint.kind == "adb" and only_adb_board.serial in device.endpoint.description
        assert device.info().soc == only_adb_board.soc
    rknn = RKNN()
    try:
        assert rknn.load_onnx(str(cnn_model)) == 0
        assert rknn.init_runtime(target=only_adb_board.soc) == 0
        outputs = rknn.inference([np.zeros((16, 16, 3), np.uint8)])
        assert outputs is not None and outputs[0].shape == (1, 10)
    finally:
        rknn.release()


def test_target_mismatch_over_adb_names_both_socs(
    only_adb_board: AdbHostBoard, cnn_model, capsys: pytest.CaptureFixture[str]
) -> None:
    rknn = RKNN()
    try:
        assert rknn.load_onnx(str(cnn_model)) == 0
        assert rknn.init_runtime(target="rk3566", device_id=only_adb_board.serial) == -1
    finally:
        rknn.release()
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "target mismatch" in text and "rk3566" in text and only_adb_board.soc in text


def test_a_target_with_several_boards_lists_them(
    make_board: MakeBoard, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_SERVER, raising=False)
    first, second = make_board("first"), make_board("second")
    with pytest.raises(AdbDeviceAmbiguous) as raised:
        connect(None, "rk3588")
    assert first.serial in str(raised.value) and second.serial in str(raised.value)


def test_a_target_with_no_board_says_how_to_attach_one(
    adb_env: PrivateAdbServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_SERVER, raising=False)
    with pytest.raises(AdbDeviceNotFound) as raised:
        connect(None, "rk3588")
    assert "USB" in raised.value.fix and "adb connect" in raised.value.fix
