"""rknn_batch_size and dynamic_input on the host runtime, in the call pattern of the toolkit's
functions/multi_batch and functions/dynamic_shape examples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rknn_client import RKNN, RKNNLite
from rknn_server.testing import DaemonProcess
from tests import models
from tests.conftest import onnx_reference
from tests.models import save_graph


def reshape_to_batch_one(path: Path) -> Path:
    """Conv then Reshape to a hard-coded [1, -1]: a batch-1 graph that a rewritten batch dim breaks."""
    weight = numpy_helper.from_array(
        np.random.default_rng(4).standard_normal((2, 3, 3, 3)).astype(np.float32), "w"
    )
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Reshape", ["c", "shape"], ["y"]),
        ],
        "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 72])],
        [weight, shape],
    )
    return save_graph(graph, path)


@pytest.mark.parametrize("builder", [models.small_cnn, reshape_to_batch_one])
def test_rknn_batch_size_runs_a_batch_of_n_from_a_batch_one_model(
    tmp_path: Path, host_daemon: DaemonProcess, builder
) -> None:
    model = builder(tmp_path / "m.onnx")
    reference = onnx_reference(model)
    rknn = RKNN()
    assert rknn.config(mean_values=[0, 0, 0], std_values=[1, 1, 1]) == 0
    assert rknn.load_onnx(model=str(model)) == 0
    assert rknn.build(do_quantization=False, rknn_batch_size=4) == 0
    assert rknn.export_rknn(str(tmp_path / "m_4.rknn")) == 0
    rknn.release()

    lite = RKNNLite()
    assert lite.load_rknn(str(tmp_path / "m_4.rknn")) == 0
    assert lite.init_runtime(device_id=host_daemon.url) == 0
    side = 16 if builder is models.small_cnn else 8
    images = np.random.default_rng(8).integers(0, 256, (4, side, side, 3), dtype=np.uint8)
    got = lite.inference(inputs=[images])
    lite.release()
    assert got is not None and got[0].shape[0] == 4
    for k in range(4):
        want = reference([images[k : k + 1].transpose(0, 3, 1, 2).astype(np.float32)])[0]
        np.testing.assert_allclose(got[0][k : k + 1], want, atol=1e-3, rtol=1e-4)


def test_dynamic_input_runs_each_listed_shape_and_refuses_others(
    tmp_path: Path, host_daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    model = models.small_cnn(tmp_path / "cnn.onnx")
    free = onnx.load(str(model))
    for axis in (2, 3):
        free.graph.input[0].type.tensor_type.shape.dim[axis].dim_param = f"d{axis}"
    onnx.save(free, str(tmp_path / "free.onnx"))
    reference = onnx_reference(tmp_path / "free.onnx")
    dynamic_input = [[[1, 3, 16, 16]], [[1, 3, 24, 24]], [[1, 3, 12, 20]]]
    rknn = RKNN()
    assert rknn.config(mean_values=[[0, 0, 0]], std_values=[[1, 1, 1]], dynamic_input=dynamic_input) == 0
    assert rknn.load_onnx(model=str(model)) == 0
    assert rknn.build(do_quantization=False) == 0
    assert rknn.export_rknn(str(tmp_path / "dyn.rknn")) == 0
    rknn.release()

    runner = RKNN()
    assert runner.load_rknn(str(tmp_path / "dyn.rknn")) == 0
    assert runner.init_runtime(device_id=host_daemon.url) == 0
    rng = np.random.default_rng(9)
    for h, w in ((16, 16), (24, 24), (12, 20)):
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        got = runner.inference(inputs=[image])
        assert got is not None
        want = reference([image.transpose(2, 0, 1)[np.newaxis].astype(np.float32)])[0]
        np.testing.assert_allclose(got[0], want, atol=1e-4, rtol=1e-4)
    assert runner.inference(inputs=[np.zeros((20, 20, 3), np.uint8)]) is None
    runner.release()
    err = capsys.readouterr().err
    assert "input shape(s) [[1, 3, 20, 20]] are not among the dynamic_input shapes" in err


def test_a_model_without_batch_one_is_refused_for_rknn_batch_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rknn = RKNN()
    assert (
        rknn.load_onnx(
            str(models.small_cnn(tmp_path / "m.onnx")), inputs=["input"], input_size_list=[[2, 3, 16, 16]]
        )
        == 0
    )
    assert rknn.build(do_quantization=False, rknn_batch_size=4) == -1
    rknn.release()
    assert "rknn_batch_size needs a batch-1 model" in capsys.readouterr().err
