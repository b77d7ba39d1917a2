"""The line a user reads when inference() gets an image of the wrong size: it names the layout the array
was taken to be in only when the user (data_format) or its shape says so, and gives the model's shape
in that layout too, so an NCHW array is never called NHWC merely because NHWC is the default."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rknn_client import RKNN
from rknn_client.compat.inputs import InputRuleError, prepare
from rknn_proto.messages import TensorAttr
from rknn_server.testing import DaemonProcess
from tests import models

# models.small_cnn(size=16): one float input of 3 channels, 16x16, NCHW as ONNX lays it out.
NCHW_MODEL = "[1, 3, 16, 16] (NCHW)"
SMALL_NCHW = np.zeros((1, 3, 8, 8), np.float32)


@pytest.fixture(scope="module")
def rknn(tmp_path_factory: pytest.TempPathFactory, host_daemon: DaemonProcess) -> Iterator[RKNN]:
    model = models.small_cnn(tmp_path_factory.mktemp("layout") / "cnn.onnx")
    rknn = RKNN(toolkit="host")
    try:
        assert rknn.load_onnx(str(model)) == 0
        assert rknn.init_runtime(device_id=host_daemon.url) == 0
        yield rknn
    finally:
        rknn.release()


def refusal(rknn: RKNN, capfd: pytest.CaptureFixture[str], array: np.ndarray, data_format: str | None) -> str:
    """The one `E inference:` line a refused inference prints, without the daemon's address suffix."""
    capfd.readouterr()
    assert rknn.inference(inputs=[array], data_format=data_format) is None
    (line,) = [line for line in capfd.readouterr().err.splitlines() if line.startswith("E inference:")]
    return line.split(" [INVALID_ARGUMENT from ")[0]


@pytest.mark.parametrize("array", [SMALL_NCHW, np.zeros((1, 8, 8, 3), np.float32)], ids=["nchw", "nhwc"])
def test_an_array_of_no_layout_of_the_model_is_said_to_fit_neither_with_both_shapes(
    rknn: RKNN, capfd: pytest.CaptureFixture[str], array: np.ndarray
) -> None:
    assert refusal(rknn, capfd, array, None) == (
        f"E inference: input 0 (input) has shape {list(array.shape)}, which fits the model's input in "
        "neither layout: it expects [1, 16, 16, 3] as NHWC (the default data_format) or [1, 3, 16, 16] as NCHW"
    )


def test_an_array_declared_nhwc_is_compared_with_the_models_shape_in_nhwc(
    rknn: RKNN, capfd: pytest.CaptureFixture[str]
) -> None:
    assert refusal(rknn, capfd, SMALL_NCHW, "nhwc") == (
        f"E inference: input 0 (input) has shape [1, 3, 8, 8] (NHWC); the model expects {NCHW_MODEL}, "
        "which is [1, 16, 16, 3] as NHWC"
    )


def test_an_array_declared_in_the_models_layout_gets_the_one_shape(
    rknn: RKNN, capfd: pytest.CaptureFixture[str]
) -> None:
    assert refusal(rknn, capfd, SMALL_NCHW, "nchw") == (
        f"E inference: input 0 (input) has shape [1, 3, 8, 8] (NCHW); the model expects {NCHW_MODEL}"
    )


def test_an_array_that_fits_only_as_nchw_still_runs_without_data_format(rknn: RKNN) -> None:
    outputs = rknn.inference(inputs=[np.zeros((1, 3, 16, 16), np.float32)])
    assert outputs is not None and len(outputs) == 1


def test_an_nhwc_model_takes_an_nchw_array_only_when_told() -> None:
    """A board's .rknn (NHWC input): an NCHW array without data_format is refused with the fix, as the
    toolkit treats it as NHWC; with data_format='nchw' it is sent as NCHW."""
    spec = TensorAttr(0, "image", (1, 16, 16, 3), np.dtype(np.float32), "NHWC")
    nchw = np.zeros((1, 3, 16, 16), np.float32)
    with pytest.raises(InputRuleError) as refused:
        prepare([nchw], [spec], None, None)
    assert str(refused.value) == (
        "input 0 (image) has shape [1, 3, 16, 16], the model's input as NCHW [1, 3, 16, 16], but data_format "
        "defaults to NHWC, where the model expects [1, 16, 16, 3]: pass data_format='nchw'"
    )
    assert prepare([nchw], [spec], "nchw", None).frame.layouts == ["NCHW"]
    assert prepare([np.zeros((1, 16, 16, 3), np.float32)], [spec], None, None).frame.layouts == ["NHWC"]
