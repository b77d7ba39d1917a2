"""Shape inference of a model load: the same shapes as ONNX's own inference of the whole model, got
without handing it the weights (it copies what it is given three times: for a large model on a board,
that was most of a load's time and several times the model's size in memory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from rknn_server.runtime import onnx_graph
from tests import models as base_models


def _reshaping_cnn() -> onnx.ModelProto:
    """A Conv with 37 KB of weights, then shapes that only an initializer's values decide: a Reshape
    to a shape tensor and a Slice by starts and ends tensors (what inference must still read)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((64, 3, 7, 7)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1, 64, -1], np.int64), "shape"),
        numpy_helper.from_array(np.array([0], np.int64), "starts"),
        numpy_helper.from_array(np.array([10], np.int64), "ends"),
        numpy_helper.from_array(np.array([2], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[3, 3, 3, 3]),
        helper.make_node("Reshape", ["c", "shape"], ["flat"]),
        helper.make_node("Slice", ["flat", "starts", "ends", "axes"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "reshaping_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        weights,
    )
    return base_models.onnx_model(graph)


def _whole_model_inference(model: onnx.ModelProto) -> dict[str, onnx_graph.ValueInfo]:
    graph = shape_inference.infer_shapes(model, strict_mode=False).graph
    tensors = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim)
        tensors[value.name] = onnx_graph.ValueInfo(value.name, value.type.tensor_type.elem_type, dims)
    return tensors


def test_shapes_from_initializer_values_are_still_inferred() -> None:
    tensors = onnx_graph.inferred_tensors(_reshaping_cnn())
    assert tensors["flat"].shape == (1, 64, 64)
    assert tensors["y"].shape == (1, 64, 10)


@pytest.mark.parametrize("build", ["reshaping_cnn", "small_cnn", "concat_block"])
def test_the_shapes_are_those_of_inferring_the_whole_model(build: str, tmp_path: Path) -> None:
    if build == "reshaping_cnn":
        model = _reshaping_cnn()
    else:
        model = onnx.load(str(getattr(base_models, build)(tmp_path / f"{build}.onnx")))
    assert onnx_graph.inferred_tensors(model) == _whole_model_inference(model)


def test_inference_is_handed_the_graph_without_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _reshaping_cnn()
    weight_bytes = model.graph.initializer[0].ByteSize()
    handed: list[onnx.ModelProto] = []
    infer = shape_inference.infer_shapes

    def recording(given: onnx.ModelProto, **options: bool) -> onnx.ModelProto:
        handed.append(given)
        return infer(given, **options)

    monkeypatch.setattr(onnx_graph.shape_inference, "infer_shapes", recording)
    onnx_graph.inferred_tensors(model)
    assert len(handed) == 1
    assert handed[0].ByteSize() < weight_bytes // 10
    # The model the caller holds is untouched: its weights are still all there.
    assert model.graph.initializer[0].ByteSize() == weight_bytes
    assert model.graph.initializer[0].data_location == TensorProto.DEFAULT
