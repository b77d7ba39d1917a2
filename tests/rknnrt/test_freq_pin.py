from __future__ import annotations

from pathlib import Path

import pytest

from rknn_server.runtime.rknnrt.freq_pin import pinned_frequencies
from tests.rknnrt.fake_sysfs import rk3588_board

CPU0 = "sys/devices/system/cpu/cpufreq/policy0"
CPU6 = "sys/devices/system/cpu/cpufreq/policy6"
NPU = "sys/class/devfreq/fdab0000.npu"
DDR = "sys/class/devfreq/dmc"


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


def test_pins_and_restores(tmp_path: Path) -> None:
    root = rk3588_board(tmp_path)
    before = snapshot(root)
    with pinned_frequencies(root) as outcome:
        assert outcome.fixed and outcome.note == ""
        assert (root / CPU0 / "scaling_governor").read_text() == "performance"
        assert (root / CPU0 / "scaling_min_freq").read_text() == "1800000"
        assert (root / CPU6 / "scaling_min_freq").read_text() == "2304000"
        assert (root / NPU / "min_freq").read_text() == "1000000000"
        assert (root / DDR / "min_freq").read_text() == "2112000000"
        assert (root / DDR / "governor").read_text() == "performance"
        assert [reading.kind for reading in outcome.frequencies] == ["CPU", "NPU", "DDR"]
    assert snapshot(root) == before


def test_restores_after_failure_inside_block(tmp_path: Path) -> None:
    root = rk3588_board(tmp_path)
    before = snapshot(root)
    with pytest.raises(RuntimeError, match="measurement failed"), pinned_frequencies(root) as outcome:
        assert outcome.fixed
        raise RuntimeError("measurement failed")
    assert snapshot(root) == before


def test_without_permission_reports_and_changes_nothing(tmp_path: Path) -> None:
    root = rk3588_board(tmp_path)
    # A file that cannot be written (root ignores mode bits, so make it a directory).
    (root / NPU / "max_freq").unlink()
    (root / NPU / "max_freq").mkdir()
    before = snapshot(root)
    with pinned_frequencies(root) as outcome:
        assert not outcome.fixed
        assert "frequencies not fixed" in outcome.note and "fdab0000.npu/max_freq" in outcome.note
        assert snapshot(root) == before
        ran = True
    assert ran and snapshot(root) == before


def test_no_controls(tmp_path: Path) -> None:
    with pinned_frequencies(tmp_path) as outcome:
        assert not outcome.fixed and "no cpufreq/devfreq controls" in outcome.note
