"""eval_perf(perf_debug=True) on the host runtime: the per-layer table and Total Time come from the same
profiled runs (as one perf run gives both on a board), so the layers add up under the total they are
printed with, and the report states the rest: ONNX Runtime's own work between nodes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from rknn_client import RKNN
from rknn_server.testing import DaemonProcess
from tests import models


def test_the_per_layer_times_add_up_under_the_total_of_the_same_runs(
    tmp_path: Path, host_daemon: DaemonProcess
) -> None:
    rknn = RKNN(toolkit="host")
    try:
        assert rknn.load_onnx(str(models.small_cnn(tmp_path / "cnn.onnx"))) == 0
        assert rknn.init_runtime(device_id=host_daemon.url, perf_debug=True) == 0
        assert rknn.inference(inputs=[np.zeros((1, 3, 16, 16), np.float32)]) is not None
        text = rknn.eval_perf(is_print=False)
    finally:
        rknn.release()
    assert text is not None
    lines = text.split("Total Operator Elapsed Per Frame Time(us):")[0].splitlines()
    header = [cell.strip() for cell in lines[lines.index("Network Layer Information Table") + 1].split("|")]
    rows = [line.split("|") for line in lines if re.match(r"^\d+\s+\|", line)]
    layer_sum = sum(int(row[header.index("Time(us)")]) for row in rows)
    footer = re.search(r"Total Operator Elapsed Per Frame Time\(us\): (\d+)", text)
    total = re.search(r"Total Time\(us\): (\d+)", text)
    gap = re.search(r"; (\d+) us of it outside the layers", text)
    assert rows and footer is not None and total is not None and gap is not None
    rounding = len(rows)  # each row, and each total, is rounded to 1 us
    assert abs(int(footer.group(1)) - layer_sum) <= rounding
    # Node spans lie inside the run spans of the same runs: the layers cannot add up to more.
    assert layer_sum <= int(total.group(1)) + rounding
    assert abs(int(total.group(1)) - int(footer.group(1)) - int(gap.group(1))) <= 1
    assert "Total Time: the same profiled run(s) as the per-layer times" in text
