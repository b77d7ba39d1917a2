"""No toolkit method raises on a bad model or bad data: -1 (or None) and the reason in the log."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from rknn_client import RKNN
from tests.models import save_graph


def variable_size_detector(path: Path) -> Path:
    """Free height and width, but an Add with a fixed 16x16 constant: ONNX Runtime loads it and
    fails at run time with a broadcast error on any other size, as a variable-size detector did."""
    anchor = numpy_helper.from_array(np.ones((1, 3, 16, 16), np.float32), "anchor")
    graph = helper.make_graph(
        [helper.make_node("Add", ["images", "anchor"], ["out"])],
        "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, "h", "w"])],
        [anchor],
    )
    return save_graph(graph, path)


def test_a_broadcast_error_in_calibration_is_minus_one_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "dataset.txt").write_text("a.png\n")
    rknn = RKNN()
    assert rknn.load_onnx(str(variable_size_detector(tmp_path / "det.onnx"))) == 0
    assert rknn.build(do_quantization=True, dataset=str(tmp_path / "dataset.txt")) == -1
    rknn.release()
    err = capsys.readouterr().err
    assert err.startswith("E build: ") and "broadcast" in err


def test_a_model_that_is_not_onnx_fails_load_or_build_with_minus_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07junk" * 10)
    rknn = RKNN()
    assert rknn.load_onnx(str(tmp_path / "junk.onnx")) == 0
    assert rknn.build(do_quantization=False) == -1
    assert rknn.export_rknn(str(tmp_path / "x.rknn")) == -1
    assert rknn.inference(inputs=[np.zeros((2, 2), np.float32)]) is None
    assert rknn.accuracy_analysis(inputs=["nope.jpg"]) == -1
    rknn.release()
    err = capsys.readouterr().err
    assert "E build: " in err and "junk.onnx" in err


def test_library_logging_and_warnings_land_in_the_toolkit_log_at_their_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging
    import warnings

    from rknn_client.compat.toolkit_log import ToolkitLog

    root = logging.getLogger()
    before = root.handlers[:]
    log = ToolkitLog(verbose=True)
    with log.captured("build"):
        logging.warning("Please consider to run pre-processing before quantization.")
        logging.getLogger("onnxruntime.quantization").error("calibration failed")
        logging.getLogger("some.lib").info("loaded")
        warnings.warn("calibration set is small", UserWarning, stacklevel=1)
    assert root.handlers == before
    said = capsys.readouterr()
    # The info record stays below the root logger's WARNING threshold, as it would without the toolkit.
    assert said.out.splitlines() == [
        "W build: Please consider to run pre-processing before quantization.",
        "W build: UserWarning: calibration set is small",
    ]
    assert said.err.splitlines() == ["E build: calibration failed"]
    assert "WARNING:root" not in said.out + said.err
