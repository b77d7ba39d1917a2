"""Fan-out over simulated boards: agreement, a board dying mid-run, the reports, the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rknn_client.farm import Farm
from rknn_client.farm.compare import cosine_similarity
from rknn_client.farm.report import report_dict, table_text, write_html, write_json
from rknn_client.farm.runner import Timing, run_fanout
from rknn_server.testing import DaemonProcess
from tests import models
from tests.farm.conftest import SOCS, write_farm_file
from tests.farm.html_data import parse_report


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "input.npy"
    np.save(path, np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32))
    return path


def test_cosine_similarity() -> None:
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert cosine_similarity(a, a * 5) == pytest.approx(1.0)
    assert cosine_similarity(a, -a) == pytest.approx(-1.0)
    assert cosine_similarity(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(0.0)
    assert cosine_similarity(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine_similarity(np.zeros(3), a) == 0.0
    assert cosine_similarity(a, a[:2]) == 0.0


def test_every_board_reports_latency_and_agreement(
    farm_file: Path, cnn_model: Path, image: Path, tmp_path: Path
) -> None:
    report = run_fanout(
        Farm.from_file(farm_file), cnn_model, [np.load(image)], concurrency=3, timing=Timing(warmup=1, runs=5)
    )
    assert [d.name for d in report.devices] == ["b0", "b1", "b2"]
    assert [d.soc for d in report.devices] == list(SOCS)
    for device in report.devices:
        assert device.ok, device.error
        lat = device.latency
        assert lat is not None and lat.runs == 5
        assert 0 < lat.min_us <= lat.p50_us <= lat.p90_us <= lat.max_us
        assert device.memory_bytes > 0 and device.perf_total_us > 0
        assert device.agrees is True and device.cosine == [pytest.approx(1.0, abs=1e-6)]
        assert {layer.op_type for layer in device.layers} >= {"Conv", "Gemm"}
    assert report.reference.startswith("host runtime")
    assert {layer.op_type for layer in report.reference_layers} >= {"Conv", "Gemm"}
    table = table_text(report)
    for name, soc in zip(("b0", "b1", "b2"), SOCS, strict=True):
        assert any(line.split()[:3] == [name, soc, "ok"] for line in table.splitlines())

    html_path, json_path = tmp_path / "report.html", tmp_path / "report.json"
    write_html(report, html_path)
    write_json(report, json_path)
    parsed = parse_report(html_path.read_text())
    assert parsed.data == json.loads(json_path.read_text()) == report_dict(report)
    devices = parsed.data["devices"]
    assert isinstance(devices, list)
    assert [(d["name"], d["ok"], d["agrees"]) for d in devices] == [
        (n, True, True) for n in ("b0", "b1", "b2")
    ]
    assert all(d["latency"]["p50_us"] > 0 and d["min_cosine"] > 0.999 for d in devices)
    # The headline chart comes first, before the layer charts.
    assert parsed.charts == ["latency-chart", "top-layers-chart", "layer-comparison-chart"]
    assert [row[0] for row in parsed.tables["devices"][1:]] == ["b0", "b1", "b2"]
    assert [row[0] for row in parsed.tables["agreement"]] == ["device", "b0", "b1", "b2"]
    for device in report.devices:  # each device's slowest layers, slowest first
        top = parsed.tables[f"top-{device.name}"][1:]
        times = [float(row[2]) for row in top]
        assert times == sorted(times, reverse=True) and len(top) == min(10, len(device.layers))
        assert times[0] == pytest.approx(max(layer.time_us for layer in device.layers), abs=0.06)
    layer_table = parsed.tables["layers"]
    assert layer_table[0][:3] == ["layer", "op", "reference (µs)"]
    assert layer_table[0][3:] == [h for n in ("b0", "b1", "b2") for h in (f"{n} (µs)", f"{n} / ref")]
    assert len(layer_table) - 1 == len(report.reference_layers)
    conv = next(row for row in layer_table[1:] if row[1] == "Conv")
    reference_us = next(x.time_us for x in report.reference_layers if x.name == conv[0])
    b0_us = next(x.time_us for x in report.devices[0].layers if x.name == conv[0])
    assert conv[2:5] == [f"{reference_us:.1f}", f"{b0_us:.1f}", f"{b0_us / reference_us:.2f}"]


def test_a_board_dying_mid_run_leaves_the_others_reporting(
    farm_file: Path, boards: list[DaemonProcess], cnn_model: Path, image: Path, tmp_path: Path
) -> None:
    victim = boards[2]

    def observer(name: str, stage: str) -> None:
        if name == "b2" and stage == "run":  # the model is loaded; the board dies before running it
            victim.process.kill()
            victim.process.wait()

    report = run_fanout(
        Farm.from_file(farm_file), cnn_model, [np.load(image)], concurrency=3, observer=observer
    )
    ok = {d.name: d for d in report.devices if d.ok}
    assert sorted(ok) == ["b0", "b1"]
    assert all(d.agrees and d.latency and d.latency.p50_us > 0 for d in ok.values())
    dead = report.devices[2]
    assert (dead.name, dead.ok, dead.failed_stage) == ("b2", False, "run")
    assert "not reachable" in dead.error and dead.agrees is None
    assert "b2: ConnectionFailed" in table_text(report)
    write_html(report, tmp_path / "report.html")
    parsed = parse_report((tmp_path / "report.html").read_text())
    rows = {row[0]: row for row in parsed.tables["devices"][1:]}
    assert rows["b2"][2] == "FAILED (run)" and "not reachable" in rows["b2"][-1]
    assert parsed.charts[0] == "latency-chart"


def test_an_unreachable_board_fails_in_seconds_and_the_others_report(
    boards: list[DaemonProcess], cnn_model: Path, image: Path, tmp_path: Path
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    farm_file = write_farm_file(tmp_path / "farm.toml", boards)
    with farm_file.open("a") as out:
        out.write(f'[[device]]\nname = "unplugged"\naddress = "{closed}"\n')
    started = time.monotonic()
    failed_after: list[float] = []

    def observer(name: str, stage: str) -> None:
        if name == "unplugged" and stage == "failed":
            failed_after.append(time.monotonic() - started)

    report = run_fanout(
        Farm.from_file(farm_file),
        cnn_model,
        [np.load(image)],
        concurrency=4,
        reserve_timeout_s=300,
        observer=observer,
        timing=Timing(warmup=1, runs=3),
    )
    assert failed_after and failed_after[0] < 20, failed_after  # not the 300 s reserve timeout
    assert [d.name for d in report.devices] == ["b0", "b1", "b2", "unplugged"]
    assert all(d.ok and d.agrees for d in report.devices[:3])
    dead = report.devices[3]
    assert (dead.ok, dead.failed_stage) == (False, "reserve")
    assert "NoReachableDevice" in dead.error and "Connection refused" in dead.error


def test_golden_device_reference(farm_file: Path, cnn_model: Path, image: Path) -> None:
    report = run_fanout(Farm.from_file(farm_file), cnn_model, [np.load(image)], reference="device:b1")
    assert report.reference == "device b1"
    assert [d.name for d in report.devices] == ["b0", "b1", "b2"]
    assert [d.is_reference for d in report.devices] == [False, True, False]
    assert all(d.ok and d.agrees for d in report.devices)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rknn_client.cli", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )


def test_cli_devices_and_a_disagreeing_reference(
    farm_file: Path, cnn_model: Path, image: Path, tmp_path: Path
) -> None:
    farm = Farm.from_file(farm_file)
    with farm.acquire(soc="rk3566", timeout=30, holder="nightly-run"):
        listed = cli("farm", "devices", "--farm", str(farm_file))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["name", "address", "health", "soc"]
    rows = {line.split()[0]: line for line in lines[1:]}
    for name, soc in zip(("b0", "b1", "b2"), SOCS, strict=True):
        assert rows[name].split()[2:4] == ["ok", soc]
    assert "nightly-run" in rows["b1"] and "nightly-run" not in rows["b0"]

    other = models.small_cnn(tmp_path / "other.onnx", seed=7)  # a reference that must disagree
    json_path = tmp_path / "r.json"
    run = cli(
        "farm", "run", str(cnn_model), "--input", str(image), "--farm", str(farm_file), "--soc", "rk3588",
        "--reference-model", str(other), "--json", str(json_path), "--quiet",
    )  # fmt: skip
    assert run.returncode == 3, run.stderr
    data = json.loads(json_path.read_text())
    assert [d["name"] for d in data["devices"]] == ["b0"]
    assert data["devices"][0]["ok"] is True and data["devices"][0]["agrees"] is False
    assert "DISAGREES" in run.stdout

    missing = cli("farm", "run", str(cnn_model), "--input", str(image))
    assert missing.returncode == 1 and "no devices" in missing.stderr
