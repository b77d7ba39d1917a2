"""Ctrl-C on a real `rknn-client farm run`: the first cancels, releases and reports; the second ends it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rknn_client.farm import Farm
from rknn_client.farm.probe import probe
from rknn_server.testing import DaemonProcess
from tests.farm.html_data import parse_report


class FarmRun:
    """`rknn-client farm run` as a subprocess whose progress lines are read as they come."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rknn_client.cli", "farm", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.out: list[str] = []
        # Each pipe has its one reader (communicate() would read stderr too, racing this reader).
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.out_reader = threading.Thread(
            target=lambda: self.out.extend(self.process.stdout or ()), daemon=True
        )
        self.out_reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append("<eof>")
            self.changed.notify_all()

    def wait_for(self, wanted: set[str], timeout: float = 120) -> None:
        """Until a progress line `NAME: STAGE` arrived for each of `wanted` (e.g. "b0: time 1/9")."""
        with self.changed:
            done = self.changed.wait_for(
                lambda: (
                    all(any(line.startswith(w) for line in self.lines) for w in wanted)
                    or "<eof>" in self.lines
                ),
                timeout,
            )
        assert done and "<eof>" not in self.lines, "".join(self.lines)[-3000:]

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        self.process.wait(timeout=timeout)
        self.reader.join(timeout)
        self.out_reader.join(timeout)
        return self.process.returncode, "".join(self.out), "".join(self.lines)


@pytest.fixture
def long_run(
    boards: list[DaemonProcess], farm_file: Path, cnn_model: Path, tmp_path: Path
) -> Iterator[FarmRun]:
    """A run that times far more inferences than the test waits for, so Ctrl-C lands mid-run."""
    image = tmp_path / "input.npy"
    np.save(image, np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32))
    run = FarmRun(
        [
            str(cnn_model), "--input", str(image), "--farm", str(farm_file), "--runs", "1000000",
            "--reserve-timeout", "600", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"),
        ]
    )  # fmt: skip
    yield run
    if run.process.poll() is None:
        run.process.kill()
        run.process.wait()


def test_first_ctrl_c_releases_every_reservation_and_writes_the_partial_report(
    long_run: FarmRun, farm_file: Path, tmp_path: Path
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
        "b0": "FAILED (time)",
        "b1": "FAILED (time)",
        "b2": "FAILED (reserve)",
    }


def test_second_ctrl_c_exits_at_once_quietly(long_run: FarmRun) -> None:
    long_run.wait_for({"b0: time 1/", "b1: time 1/", "b2: time 1/"})
    long_run.process.send_signal(signal.SIGINT)
    long_run.wait_for({"interrupted: cancelling the running devices and releasing every reservation"})
    long_run.process.send_signal(signal.SIGINT)
    code, _, stderr = long_run.finish(timeout=10)
    assert code == 130
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
