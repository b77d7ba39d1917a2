"""Quantization emulation: algorithms, per-channel vs per-layer, the MMSE search."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from rknn_client.accuracy.calibrate import quantization_mse, search_range
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.quantize import quantize_model


def _activation_scales(path: Path) -> dict[str, float]:
    """Scale of each QuantizeLinear on an activation, by the tensor it quantizes."""
    model = onnx.load(path)
    initializers = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    return {
        node.input[0]: float(initializers[node.input[1]])
        for node in model.graph.node
        if node.op_type == "QuantizeLinear" and node.input[0] not in initializers
    }


def _weight_scale_shape(path: Path, conv: str) -> tuple[int, ...]:
    model = onnx.load(path)
    node = next(node for node in model.graph.node if node.name == conv)
    dequantize = next(n for n in model.graph.node if n.output[0] == node.input[1])
    scale = next(init for init in model.graph.initializer if init.name == dequantize.input[1])
    return tuple(scale.dims)


def test_mmse_ranges_are_never_wider_than_minmax(
    tmp_path: Path, float_model: Path, quant_model: Path, dataset: Path
) -> None:
    mmse = tmp_path / "mmse.onnx"
    quantize_model(float_model, mmse, dataset, "mmse", "channel")

    minmax_scales, mmse_scales = _activation_scales(quant_model), _activation_scales(mmse)
    assert minmax_scales.keys() == mmse_scales.keys() and len(mmse_scales) >= 10
    assert all(mmse_scales[name] <= minmax_scales[name] * (1 + 1e-6) for name in mmse_scales)
    assert any(mmse_scales[name] < minmax_scales[name] * 0.99 for name in mmse_scales)


def test_search_range_clips_heavy_tails_and_lowers_the_error() -> None:
    values = np.random.default_rng(0).laplace(0.0, 1.0, 100_000)
    counts, edges = np.histogram(values, bins=2048, range=(float(values.min()), float(values.max())))

    low, high = search_range(counts, edges)

    assert values.min() < low < 0 < high < values.max()
    weights = np.ones_like(values)
    full = quantization_mse(values, weights, float(values.min()), float(values.max()))
    assert quantization_mse(values, weights, low, high) < full * 0.9


def test_search_range_keeps_an_all_zero_tensor() -> None:
    assert search_range(np.zeros(4, np.int64), np.zeros(5)) == (0.0, 0.0)


def test_kl_divergence_and_per_layer_weights(
    tmp_path: Path, float_model: Path, quant_model: Path, dataset: Path
) -> None:
    kl = tmp_path / "kl.onnx"
    quantize_model(float_model, kl, dataset, "kl_divergence", "layer")

    assert _weight_scale_shape(kl, "expand_node") == ()
    assert _weight_scale_shape(quant_model, "expand_node") == (32,)
    assert _activation_scales(kl).keys() == _activation_scales(quant_model).keys()


@pytest.mark.parametrize(
    ("algorithm", "method", "message"),
    [("fast", "channel", "quantized_algorithm"), ("normal", "group", "quantized_method")],
)
def test_unknown_options_are_refused(
    tmp_path: Path, float_model: Path, dataset: Path, algorithm: str, method: str, message: str
) -> None:
    with pytest.raises(AccuracyError, match=message):
        quantize_model(float_model, tmp_path / "q.onnx", dataset, algorithm, method)


def test_dataset_problems_are_clear(tmp_path: Path, float_model: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(AccuracyError, match="lists no inputs"):
        quantize_model(float_model, tmp_path / "q.onnx", empty, "normal", "channel")
    missing = tmp_path / "missing.txt"
    missing.write_text("nowhere.png\n")
    with pytest.raises(AccuracyError, match="no such input file"):
        quantize_model(float_model, tmp_path / "q.onnx", missing, "normal", "channel")
    with pytest.raises(AccuracyError, match="cannot read dataset"):
        quantize_model(float_model, tmp_path / "q.onnx", tmp_path / "no.txt", "normal", "channel")
