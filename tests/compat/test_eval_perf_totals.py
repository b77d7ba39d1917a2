"""eval_perf(perf_debug=True) prints two measurements: the per-layer times of profiled runs (their sum is
the table's own `Total Operator Elapsed Per Frame Time`) and `Total Time` of timed runs without the
profiler. Each total is labelled for what it measures, so the two are not read as one."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from rknn_client import RKNN
from rknn_server.testing import DaemonProcess
from tests import models


def test_the_per_layer_sum_and_the_total_say_what_each_measures(
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
    assert rows and footer is not None
    assert abs(int(footer.group(1)) - layer_sum) <= len(rows)  # each row is rounded to 1 us
    assert re.search(r"Total Time\(us\): \d+", text)
    assert "Total Time: timed runs without the profiler" in text
    assert "the per-layer times: profiled runs" in text and "Total Operator Elapsed Per Frame Time)" in text
