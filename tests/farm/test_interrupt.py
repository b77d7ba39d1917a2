"""Ctrl-C on a real `rknn-client farm run`: the first cancels, releases and reports; the second ends it."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rknn_client.farm import Farm
from rknn_client.farm.probe import probe
from rknn_server.testing import DaemonProcess
from tests.cli_run import CliRun
from tests.farm.html_data import parse_report


@pytest.fixture
def long_run(
    boards: list[DaemonProcess], farm_file: Path, cnn_model: Path, tmp_path: Path
) -> Iterator[CliRun]:
    """A run that times far more inferences than the test waits for, so Ctrl-C lands mid-run."""
    image = tmp_path / "input.npy"
    np.save(image, np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32))
    run = CliRun(
        [
            "farm", "run", str(cnn_model), "--input", str(image), "--farm", str(farm_file), "--runs", "1000000",
            "--reserve-timeout", "600", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"),
        ]
    )  # fmt: skip
    yield run
    if run.process.poll() is None:
        run.process.kill()
        run.process.wait()


def test_first_ctrl_c_releases_every_reservation_and_writes_the_partial_report(
    long_run: CliRun, farm_file: Path, tmp_path: Path
) -> None:
    farm = Farm.from_file(farm_file)
    b2 = next(e for e in farm.entries if e.name == "b2")
    with farm.acquire(name="b2", timeout=30, holder="hog"):  # b2 is busy: the run queues there
        long_run.wait_for({"b0: time 1/", "b1: time 1/"})
        assert probe(b2).reservation_waiters == 1
        holders = {s.entry.name: s.reserved_by for s in farm.statuses()}
        assert "pid" in holders["b0"] and "pid" in holders["b1"] and holders["b2"] == "hog"
        long_run.process.send_signal(signal.SIGINT)
        code, stdout, stderr = long_run.finish()
        assert code == 130, stderr[-3000:]
        assert "Traceback" not in stderr
        statuses = {s.entry.name: s for s in farm.statuses()}  # ask the daemons themselves
        assert statuses["b0"].reserved_by == statuses["b1"].reserved_by == ""
        assert statuses["b2"].reserved_by == "hog" and statuses["b2"].reservation_waiters == 0
    assert "CANCELLED" in stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["cancelled"] is True
    devices = {d["name"]: d for d in data["devices"]}
    assert sorted(devices) == ["b0", "b1", "b2"]
    assert all(not d["ok"] and d["error"] == "cancelled (Ctrl-C)" for d in devices.values())
    assert (devices["b0"]["failed_stage"], devices["b2"]["failed_stage"]) == ("time", "reserve")
    parsed = parse_report((tmp_path / "r.html").read_text())
    assert parsed.data == data
    assert {row[0]: row[2] for row in parsed.tables["devices"][1:]} == {
        "b0": "CANCELLED (at time)",
        "b1": "CANCELLED (at time)",
        "b2": "CANCELLED (at reserve)",
    }


def test_second_ctrl_c_exits_at_once_quietly(long_run: CliRun) -> None:
    long_run.wait_for({"b0: time 1/", "b1: time 1/", "b2: time 1/"})
    long_run.process.send_signal(signal.SIGINT)
    long_run.wait_for({"interrupted: cancelling the running devices and releasing every reservation"})
    long_run.process.send_signal(signal.SIGINT)
    code, _, stderr = long_run.finish(timeout=10)
    assert code == 130
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
