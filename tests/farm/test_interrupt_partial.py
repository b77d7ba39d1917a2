"""Ctrl-C on `rknn-client farm run` keeps what each board measured and leaves nothing open on them:
no session waiting out its idle lease, no reservation."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np

from rknn_client.farm import Farm
from rknn_server.testing import DaemonProcess
from tests.cli_run import CliRun


def test_ctrl_c_shows_the_runs_done_marks_boards_cancelled_and_closes_their_sessions(
    boards: list[DaemonProcess], farm_file: Path, cnn_model: Path, tmp_path: Path
) -> None:
    image = tmp_path / "input.npy"
    np.save(image, np.zeros((1, 3, 16, 16), np.float32))
    report = tmp_path / "r.json"
    run = CliRun(
        [
            "farm", "run", str(cnn_model), "--input", str(image), "--farm", str(farm_file),
            "--runs", "1000000", "--json", str(report),
        ]
    )  # fmt: skip
    try:
        run.wait_for({f"b{i}: time 3/" for i in range(len(boards))})
        farm = Farm.from_file(farm_file)
        assert all(s.open_sessions == 1 for s in farm.statuses())
        run.process.send_signal(signal.SIGINT)
        code, stdout, stderr = run.finish()
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    statuses = farm.statuses()  # the daemons themselves: nothing left open to wait out its lease
    assert [(s.open_sessions, s.reserved_by) for s in statuses] == [(0, "")] * len(boards)
    devices = json.loads(report.read_text())["devices"]
    assert all(d["cancelled"] and d["failed_stage"] == "time" for d in devices)
    assert all(d["latency"]["runs"] >= 3 for d in devices)  # the timed runs done are kept
    names = {f"b{i}" for i in range(len(boards))}
    rows = [cells for cells in map(str.split, stdout.splitlines()) if cells and cells[0] in names]
    assert len(rows) == len(boards) and all(row[2:5] == ["CANCELLED", "(at", "time)"] for row in rows), stdout
    assert all(row[5] != "-" for row in rows), stdout  # p50 of the runs done, not a blank
    assert "failed, 0 cancelled" not in stdout and f"0 failed, {len(boards)} cancelled" in stdout
    assert f"b0: cancelled (Ctrl-C) after {devices[0]['latency']['runs']} timed run(s)" in stdout
