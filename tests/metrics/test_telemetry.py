"""Board telemetry read at scrape time: the driver's load formats, and sources a board lacks stay absent."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rknn_server.board.telemetry import BoardTelemetry, npu_load
from tests.rknnrt.fake_sysfs import put, rv1106_board


def exported(root: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(BoardTelemetry(root))
    text = generate_latest(registry).decode()
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def test_load_formats_of_multi_and_single_core_npus() -> None:
    assert npu_load("NPU load:  Core0: 12%, Core1:  0%, Core2:  0%,") == {"0": 0.12, "1": 0.0, "2": 0.0}
    assert npu_load("NPU load:  37%\n") == {"0": 0.37}
    assert npu_load("") == {}
    assert npu_load("permission denied") == {}


def test_a_bare_root_exports_no_telemetry(tmp_path: Path) -> None:
    assert exported(tmp_path) == {}


def test_only_the_sources_present_are_exported(tmp_path: Path) -> None:
    """An RV1106: load in procfs, no cpufreq, devfreq, thermal zones or meminfo."""
    root = rv1106_board(tmp_path)
    put(root, "proc/rknpu/load", "NPU load:  25%\n")
    put(root, "sys/class/thermal/thermal_zone0/type", "soc-thermal")  # no temp file
    put(root, "proc/meminfo", "MemTotal: 1024 kB\n")  # no MemAvailable line
    assert exported(root) == {
        "rknn_npu_load_ratio": [({"core": "0"}, 0.25)],
        "rknn_memory_total_bytes": [({}, 1024 * 1024)],
    }


def test_debugfs_load_wins_over_procfs(tmp_path: Path) -> None:
    put(tmp_path, "sys/kernel/debug/rknpu/load", "NPU load:  Core0: 50%, Core1: 10%,")
    put(tmp_path, "proc/rknpu/load", "NPU load:  99%")
    assert exported(tmp_path)["rknn_npu_load_ratio"] == [({"core": "0"}, 0.5), ({"core": "1"}, 0.1)]
