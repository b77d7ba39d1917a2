"""RKNN-Toolkit2 compatibility, end to end through a real daemon, per transport x backend.

Outputs are checked against the backend's own reference (a direct ONNX Runtime run for the host
runtime), whatever form the script feeds its inputs in.
"""

from __future__ import annotations

import numpy as np
import pytest

from rknn_client import RKNN, RKNNLite
from tests.conftest import BoardCase


@pytest.fixture
def image(board: BoardCase) -> np.ndarray:
    _, c, h, w = board.input_nchw
    return np.random.default_rng(7).integers(0, 256, (h, w, c), dtype=np.uint8)


@pytest.fixture
def rknn(board: BoardCase):
    r = RKNN()
    assert board.load(r) == 0
    yield r
    r.release()


def expected(board: BoardCase, image_hwc: np.ndarray) -> list[np.ndarray]:
    return board.reference([image_hwc.transpose(2, 0, 1)[np.newaxis].astype(np.float32)])


def assert_outputs(board: BoardCase, got: list[np.ndarray] | None, want: list[np.ndarray]) -> None:
    assert got is not None
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=board.atol, rtol=1e-4)


def test_inference_with_a_3d_uint8_image_equals_the_reference(
    board: BoardCase, rknn: RKNN, image: np.ndarray
) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    assert_outputs(board, rknn.inference(inputs=[image]), expected(board, image))


def test_a_bare_ndarray_is_one_input(board: BoardCase, rknn: RKNN, image: np.ndarray) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    assert_outputs(board, rknn.inference(image[np.newaxis]), expected(board, image))


@pytest.mark.parametrize("data_format", ["nchw", "NCHW", ["nchw"], ["NCHW"]])
def test_nchw_data_format_in_any_spelling(
    board: BoardCase, rknn: RKNN, image: np.ndarray, data_format
) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    nchw = image.transpose(2, 0, 1)[np.newaxis].astype(np.float32)
    assert_outputs(board, rknn.inference([nchw], data_format=data_format), expected(board, image))


@pytest.mark.parametrize("data_format", [None, "nhwc", "NHWC", ["nhwc"]])
def test_nhwc_is_the_default_layout(board: BoardCase, rknn: RKNN, image: np.ndarray, data_format) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    nhwc = image[np.newaxis].astype(np.float32)
    assert_outputs(board, rknn.inference([nhwc], data_format=data_format), expected(board, image))


def test_repeated_inference_gives_identical_results(board: BoardCase, rknn: RKNN, image: np.ndarray) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    first = rknn.inference([image])
    second = rknn.inference([image])
    assert first is not None and second is not None
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_eval_perf_returns_the_per_layer_report_as_text(board: BoardCase, rknn: RKNN, capsys) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id, perf_debug=True) == 0
    report = rknn.eval_perf()
    assert isinstance(report, str)
    assert capsys.readouterr().out == report
    lines = report.splitlines()
    if not board.per_layer_perf:
        assert "Network Layer Information Table" not in lines
        assert int(next(line for line in lines if line.startswith("Total Time(us): ")).split(":")[1]) >= 0
        return
    header = lines.index("Network Layer Information Table")
    columns = [c.strip() for c in lines[header + 1].split("|")]
    assert columns[:6] == ["ID", "OpType", "DataType", "Target", "InputShape", "OutputShape"]
    assert "Time(us)" in columns and columns[-1] == "FullName"
    rows = []
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        rows.append([c.strip() for c in line.split("|")])
    assert rows, report
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1))
    time_col = columns.index("Time(us)")
    total = next(line for line in lines if line.startswith("Total Operator Elapsed Per Frame Time(us):"))
    assert int(total.split(":")[1]) == pytest.approx(sum(float(r[time_col]) for r in rows), abs=len(rows))
    assert "Operator Time Consuming Ranking Table" in lines
    assert any(line.startswith("Total Time(us): ") for line in lines)


def test_eval_perf_without_perf_debug_reports_the_total_only(board: BoardCase, rknn: RKNN) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    report = rknn.eval_perf(is_print=False)
    assert report is not None
    assert "Network Layer Information Table" not in report
    total = next(line for line in report.splitlines() if line.startswith("Total Time(us): "))
    assert int(total.split(":")[1]) > 0


def test_eval_memory_returns_the_toolkit_dict(board: BoardCase, rknn: RKNN, capsys) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id, eval_mem=True) == 0
    memory = rknn.eval_memory()
    assert memory is not None
    assert set(memory) == {"weight_memory", "internal_memory", "other_memory", "total_memory"}
    assert memory["weight_memory"] > 0 and memory["internal_memory"] > 0
    assert (
        memory["total_memory"] == memory["weight_memory"] + memory["internal_memory"] + memory["other_memory"]
    )
    printed = capsys.readouterr().out
    assert "Memory Profile Info Dump" in printed and "Weight Memory:" in printed


def test_get_sdk_version_has_the_three_version_lines(board: BoardCase, rknn: RKNN) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    text = rknn.get_sdk_version()
    assert text is not None
    lines = text.splitlines()
    assert lines[1] == "RKNN VERSION:"
    assert lines[2].startswith("API: ")
    assert lines[3].startswith("DRV: rknn_server: ")
    assert lines[4].startswith("DRV: rknnrt: ")


def test_calls_after_release_fail_with_minus_one_semantics(
    board: BoardCase, rknn: RKNN, image, capsys
) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    rknn.release()
    assert rknn.inference([image]) is None
    assert "init_runtime" in capsys.readouterr().err


def test_wrong_input_count_returns_none_and_says_why(board: BoardCase, rknn: RKNN, image, capsys) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id) == 0
    assert rknn.inference([image, image]) is None
    err = capsys.readouterr().err
    assert err.startswith("E inference:") and "1 input(s)" in err and "2 were given" in err


def test_rknnlite_runs_the_same_flow(board: BoardCase, image: np.ndarray) -> None:
    lite = RKNNLite()
    assert board.load(lite._rknn) == 0
    try:
        assert (
            lite.init_runtime(target=board.target, device_id=board.device_id, core_mask=board.lite_core_mask)
            == 0
        )
        outputs = lite.inference(inputs=[image])
        assert_outputs(board, outputs, expected(board, image))
        with_id = lite.inference(inputs=[image], get_frame_id=True)
        assert with_id is not None and len(with_id) == len(outputs or []) + 1
    finally:
        lite.release()


def test_target_sub_class_is_accepted_and_ignored(board: BoardCase, rknn: RKNN) -> None:
    assert rknn.init_runtime(target=board.target, device_id=board.device_id, target_sub_class="AI") == 0
