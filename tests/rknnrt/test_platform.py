from __future__ import annotations

from pathlib import Path

from rknn_proto.messages import FrequencyList
from rknn_server.board.platform import probe_platform, soc_from_compatible
from tests.rknnrt.fake_sysfs import put, rk3588_board, rv1106_board


def test_rk3588(tmp_path: Path) -> None:
    info = probe_platform(rk3588_board(tmp_path))
    assert info.soc == "rk3588" and info.npu_cores == 3 and not info.uses_mrt
    assert info.board_model == "Orange Pi 5"
    assert info.compatible == ("rockchip,rk3588s-orangepi-5", "rockchip,rk3588")
    assert info.driver_version == "0.9.8"
    assert info.npu_device == "/dev/dri/renderD129"
    assert info.frequencies == (
        FrequencyList("CPU", (1200000, 1200000, 1200000)),
        FrequencyList("NPU", (300000000,)),
        FrequencyList("DDR", (528000000,)),
    )


def test_rv1106_uses_procfs_and_dev_rknpu(tmp_path: Path) -> None:
    root = rv1106_board(tmp_path)
    put(root, "sys/kernel/debug/rknpu/version", "RKNPU driver: v0.0.1\n")
    info = probe_platform(root)
    assert (info.soc, info.driver_version, info.npu_device) == ("rv1106", "0.9.2", "/dev/rknpu")
    assert info.uses_mrt and info.frequencies == ()


def test_empty_tree(tmp_path: Path) -> None:
    info = probe_platform(tmp_path)
    assert (info.soc, info.board_model, info.driver_version, info.npu_device) == ("", "", "", "")


def test_render_node_without_sysfs_falls_back_to_renderD129(tmp_path: Path) -> None:
    put(tmp_path, "dev/dri/renderD128", "")
    put(tmp_path, "dev/dri/renderD129", "")
    assert probe_platform(tmp_path).npu_device == "/dev/dri/renderD129"


def test_soc_names() -> None:
    assert soc_from_compatible(("rockchip,rk3566-box", "rockchip,rk3566")) == "rk3566"
    assert soc_from_compatible(("rockchip,rv1103b",)) == "rv1103b"
    assert soc_from_compatible(("rockchip,rk3588s",)) == "rk3588"
    assert soc_from_compatible(("vendor,board",)) == ""
