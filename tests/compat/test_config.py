"""config()'s rules: the toolkit's spellings accepted, its errors reported at config() itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rknn_client import RKNN
from rknn_server.testing import DaemonProcess
from tests import models
from tests.conftest import onnx_reference

MEAN, STD = [103.94, 116.78, 123.68], [58.82, 58.82, 58.82]


@pytest.mark.parametrize("nested", [False, True])
def test_flat_and_nested_mean_std_mean_the_same_for_one_input(
    tmp_path: Path, host_daemon: DaemonProcess, nested: bool
) -> None:
    model = models.small_cnn(tmp_path / "cnn.onnx")
    rknn = RKNN()
    mean, std = ([MEAN], [STD]) if nested else (MEAN, STD)
    assert rknn.config(mean_values=mean, std_values=std) == 0
    assert rknn.load_onnx(str(model)) == 0
    assert rknn.build(do_quantization=False) == 0
    assert rknn.init_runtime(device_id=host_daemon.url) == 0
    image = np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    got = rknn.inference(inputs=[image])
    rknn.release()
    session = onnx_reference(model)
    nchw = image.transpose(2, 0, 1)[np.newaxis].astype(np.float32)
    want = session([(nchw - np.reshape(MEAN, (1, 3, 1, 1))) / np.reshape(STD, (1, 3, 1, 1))])
    assert got is not None
    np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"mean_values": "123"}, "mean_values must be a list"),
        ({"mean_values": [[1, 2, 3], [4, "x"]]}, "mean_values[1] must hold numbers"),
        (
            {"mean_values": [[0, 0, 0]], "std_values": [[1, 1, 1], [1, 1, 1]]},
            "lists 1 input(s) but std_values lists 2",
        ),
        ({"std_values": [1, 0, 1]}, "std_values[0] contains 0"),
    ],
)
def test_bad_mean_std_fail_at_config_with_the_reason(
    kwargs: dict[str, object], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rknn = RKNN()
    assert rknn.config(**kwargs) == -1  # type: ignore[arg-type]
    rknn.release()
    assert says in capsys.readouterr().err
