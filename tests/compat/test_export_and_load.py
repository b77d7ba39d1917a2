"""export_rknn without RKNN-Toolkit2 (a virtual-board file) and load_rknn of every kind of file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rknn_client import RKNN, RKNNLite, connect
from rknn_client.compat.rknn_file import read_rknn_header
from rknn_client.errors import RknnError
from rknn_server.testing import DaemonProcess
from tests import models
from tests.compat.rknn_files import write_rknn_file
from tests.conftest import onnx_reference


def built_and_exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    model = models.small_cnn(tmp_path / "cnn.onnx")
    rknn = RKNN()
    assert rknn.config(mean_values=[[10] * 3], std_values=[[50] * 3], target_platform="rk3588") == 0
    assert rknn.load_onnx(str(model)) == 0
    assert rknn.build(do_quantization=False) == 0
    exported = tmp_path / "cnn.rknn"
    assert rknn.export_rknn(str(exported)) == 0
    rknn.release()
    return model, exported


def test_export_rknn_writes_a_virtual_board_file_that_no_rknn_tool_takes_for_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, exported = built_and_exported(tmp_path, capsys)
    head = exported.read_bytes()[:8]
    assert not head.startswith(b"RKNN") and not head.startswith(b"CYPTRKNN")
    assert read_rknn_header(exported) is None
    said = capsys.readouterr()
    lines = [line for line in (said.out + said.err).splitlines() if "export_rknn" in line]
    assert len(lines) == 1
    assert "virtual board only" in lines[0] and "RKNN-Toolkit2" in lines[0]


def test_the_exported_file_runs_through_load_rknn_on_the_host_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host_daemon: DaemonProcess
) -> None:
    model, exported = built_and_exported(tmp_path, capsys)
    image = np.random.default_rng(3).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    want = onnx_reference(model, 10.0, 50.0)([image.transpose(2, 0, 1)[np.newaxis].astype(np.float32)])
    for cls in (RKNN, RKNNLite):
        runner = cls()
        assert runner.load_rknn(str(exported)) == 0
        assert runner.init_runtime(device_id=host_daemon.url) == 0
        got = runner.inference(inputs=[image])
        runner.release()
        assert got is not None
        np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-4)


def test_a_board_runtime_refuses_the_virtual_file_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rknnrt_daemon: DaemonProcess
) -> None:
    _, exported = built_and_exported(tmp_path, capsys)
    with connect(rknnrt_daemon.url) as device, pytest.raises(RknnError, match="virtual board") as caught:
        device.load(exported)
    assert "RKNN-Toolkit2" in str(caught.value)
    rknn = RKNN()
    assert rknn.load_rknn(str(exported)) == 0
    assert rknn.init_runtime(target="rk3588", device_id=rknnrt_daemon.url) == -1
    rknn.release()
    assert "virtual board" in capsys.readouterr().err


@pytest.mark.parametrize("header_size", [24, 64])
def test_load_rknn_reads_a_real_files_header(tmp_path: Path, header_size: int) -> None:
    header = read_rknn_header(write_rknn_file(tmp_path / "yolo.rknn", header_size=header_size))
    assert header is not None
    assert header.file_format == 6
    assert header.target_platforms == ("rk3588",)
    assert header.toolkit_version == "2.5.0"
    assert [(t.name, t.shape, t.dtype) for t in header.inputs] == [("images", (1, 3, 640, 640), "int8")]


def test_a_truncated_real_file_has_no_description_but_is_still_rknn(tmp_path: Path) -> None:
    path = write_rknn_file(tmp_path / "cut.rknn")
    path.write_bytes(path.read_bytes()[:-10])
    header = read_rknn_header(path)
    assert header is not None and header.target_platforms == ()
    assert "no readable model description" in header.summary()


def test_a_real_rknn_on_the_host_runtime_is_refused_before_upload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host_daemon: DaemonProcess
) -> None:
    rknn = RKNN()
    assert rknn.load_rknn(str(write_rknn_file(tmp_path / "yolo.rknn"))) == 0
    assert rknn.init_runtime(device_id=host_daemon.url) == -1
    rknn.release()
    err = capsys.readouterr().err
    assert "real RKNN model" in err and "rk3588" in err and "host runtime cannot run RKNN models" in err


def test_a_real_rknn_for_another_soc_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rknnmrt_daemon: DaemonProcess
) -> None:
    rknn = RKNN()
    assert rknn.load_rknn(str(write_rknn_file(tmp_path / "yolo.rknn", target="rk3588"))) == 0
    assert rknn.init_runtime(device_id=rknnmrt_daemon.url) == -1
    rknn.release()
    err = capsys.readouterr().err
    assert "built for rk3588" in err and "is rv1106" in err
