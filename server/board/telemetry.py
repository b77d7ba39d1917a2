"""Board telemetry for Prometheus: NPU load per core, CPU/NPU/DDR frequencies, temperatures, memory.

Read at scrape time below the platform probe's root (--sysfs-root), so tests point it at a fake tree.
A source the board does not have (no debugfs, no thermal zones) gives no metric at all rather than a
zero, so a dashboard never shows an idle NPU that is in fact unobserved.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rknn_server.board.platform import cpufreq_policies, devfreq_devices, read_text

# The rknpu driver's load file: debugfs on RK35xx, procfs on RV110x.
NPU_LOAD_FILES = ("sys/kernel/debug/rknpu/load", "proc/rknpu/load")
THERMAL_DIR = "sys/class/thermal"
MEMINFO = "proc/meminfo"
# "NPU load:  Core0: 12%, Core1:  0%," on multi-core NPUs; "NPU load:  12%" on one-core ones.
_CORE_LOAD_RE = re.compile(r"Core(\d+):\s*(\d+)%")
_SINGLE_LOAD_RE = re.compile(r"load:\s*(\d+)%")
_MEMINFO = {"MemTotal": "rknn_memory_total_bytes", "MemAvailable": "rknn_memory_available_bytes"}


def npu_load(text: str) -> dict[str, float]:
    """Load per NPU core (0..1) from the driver's load file; {} when the text says nothing usable."""
    cores = {core: int(percent) / 100 for core, percent in _CORE_LOAD_RE.findall(text)}
    if cores:
        return cores
    single = _SINGLE_LOAD_RE.search(text)
    return {"0": int(single.group(1)) / 100} if single else {}


def _int(path: Path) -> int | None:
    text = read_text(path)
    return int(text) if text.lstrip("-").isdigit() else None


class BoardTelemetry(Collector):
    def __init__(self, root: Path) -> None:
        self.root = root

    def collect(self) -> Iterator[Metric]:
        for family in (self._load(), *self._frequencies(), self._temperatures(), *self._memory()):
            if family.samples:
                yield family

    def _load(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "rknn_npu_load_ratio", "NPU load per core (0-1), as the driver reports it", labels=["core"]
        )
        for name in NPU_LOAD_FILES:
            cores = npu_load(read_text(self.root / name))
            if cores:
                for core, load in sorted(cores.items()):
                    family.add_metric([core], load)
                break
        return family

    def _frequencies(self) -> Iterator[GaugeMetricFamily]:
        cpu = GaugeMetricFamily(
            "rknn_cpu_frequency_hertz", "Current CPU frequency per cluster", labels=["policy"]
        )
        for policy in cpufreq_policies(self.root):
            khz = _int(policy / "scaling_cur_freq")
            if khz is None:
                khz = _int(policy / "cpuinfo_cur_freq")
            if khz is not None:
                cpu.add_metric([policy.name], khz * 1000)
        yield cpu
        for kind in ("NPU", "DDR"):
            family = GaugeMetricFamily(
                f"rknn_{kind.lower()}_frequency_hertz",
                f"Current {kind} frequency (devfreq)",
                labels=["device"],
            )
            for device in devfreq_devices(self.root, kind):
                hz = _int(device / "cur_freq")
                if hz is not None:
                    family.add_metric([device.name], hz)
            yield family

    def _temperatures(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "rknn_temperature_celsius",
            "Temperature of each thermal zone (SoC, NPU, CPU...)",
            labels=["zone", "type"],
        )
        folder = self.root / THERMAL_DIR
        zones = sorted(folder.glob("thermal_zone*")) if folder.is_dir() else []
        for zone in zones:
            millidegrees = _int(zone / "temp")
            if millidegrees is not None:
                family.add_metric([zone.name, read_text(zone / "type")], millidegrees / 1000)
        return family

    def _memory(self) -> Iterator[GaugeMetricFamily]:
        found: dict[str, int] = {}
        for line in read_text(self.root / MEMINFO).splitlines():
            key, _, rest = line.partition(":")
            words = rest.split()
            if key in _MEMINFO and words and words[0].isdigit():
                found[key] = int(words[0]) * 1024  # meminfo counts kB
        for key, name in _MEMINFO.items():
            family = GaugeMetricFamily(name, f"{key} from /proc/meminfo")
            if key in found:
                family.add_metric([], found[key])
            yield family


__all__ = ["NPU_LOAD_FILES", "BoardTelemetry", "npu_load"]
