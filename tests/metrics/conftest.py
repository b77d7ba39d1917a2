"""Daemons with the HTTP metrics listener on, and a Prometheus-style scrape of it."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from rknn_server.testing import START_TIMEOUT_S, DaemonProcess, start_daemon
from tests.rknnrt.fake_sysfs import put, rk3588_board

METRICS_LINE = "metrics on "


@dataclass
class MetricsDaemon:
    daemon: DaemonProcess
    base: str  # "http://127.0.0.1:PORT"

    @property
    def metrics_url(self) -> str:
        return f"{self.base}/metrics"


def start_metrics_daemon(folder: Path, *args: str) -> MetricsDaemon:
    """A host-runtime daemon with --metrics-listen on a free loopback port; stop it with .daemon.stop()."""
    daemon = start_daemon(
        folder / "cache",
        folder / "daemon.log",
        ["--runtime", "host", "--metrics-listen", "tcp://127.0.0.1:0", *args],
    )
    return MetricsDaemon(daemon, metrics_base(daemon))


def metrics_base(daemon: DaemonProcess) -> str:
    """ "http://127.0.0.1:PORT" of a daemon started with --metrics-listen, from its `metrics on` line."""
    found: list[str] = []

    def read() -> None:
        assert daemon.process.stdout is not None
        for line in daemon.process.stdout:
            if line.startswith(METRICS_LINE):
                found.append(line.strip().removeprefix(METRICS_LINE).removesuffix("/metrics"))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    if not found:
        daemon.stop()
        raise RuntimeError(f"the daemon did not print its metrics address: {daemon.log_text()[-3000:]}")
    return found[0]


@pytest.fixture
def metrics_daemon_factory(tmp_path: Path) -> Iterator:
    started: list[MetricsDaemon] = []

    def make(*args: str, name: str = "daemon") -> MetricsDaemon:
        started.append(start_metrics_daemon(tmp_path / name, *args))
        return started[-1]

    yield make
    for running in started:
        running.daemon.stop()


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET, errors included."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(url: str, token: str | None = None) -> dict[str, Metric]:
    """The metric families at `url`, by name, parsed as Prometheus parses them."""
    status, body = get(url, token)
    assert status == 200, body
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def samples(family: Metric, name: str | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    """A family's samples named `name` (default: the family's own), keyed by their sorted labels."""
    wanted = name or family.name
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if s.name == wanted}


def telemetry_board(root: Path) -> Path:
    """An RK3588 with NPU load in debugfs, two thermal zones (one unreadable) and /proc/meminfo."""
    rk3588_board(root)
    put(root, "sys/kernel/debug/rknpu/load", "NPU load:  Core0: 12%, Core1:  0%, Core2: 100%,\n")
    put(root, "sys/class/thermal/thermal_zone0/type", "soc-thermal\n")
    put(root, "sys/class/thermal/thermal_zone0/temp", "45250\n")
    put(root, "sys/class/thermal/thermal_zone1/type", "npu-thermal\n")
    put(root, "sys/class/thermal/thermal_zone1/temp", "")  # a sensor that reads nothing: no sample
    put(root, "proc/meminfo", "MemTotal:        8010000 kB\nMemFree:  100 kB\nMemAvailable:    5000000 kB\n")
    return root
