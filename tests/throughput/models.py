"""Models for the throughput tests and benchmarks: camera-sized uint8 CNNs, float and int8 QDQ."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from tests.models import save_graph

# A YOLO-style head: 3 anchors x (80 classes + 5) channels at strides 8, 16 and 32.
HEAD_CHANNELS = 255


def _conv(
    nodes: list[onnx.NodeProto],
    weights: list[onnx.TensorProto],
    rng: np.random.Generator,
    x: str,
    c_in: int,
    c_out: int,
    name: str,
    stride: int = 2,
    kernel: int = 3,
    relu: bool = True,
) -> str:
    w = (rng.standard_normal((c_out, c_in, kernel, kernel)) * (2.0 / (c_in * kernel * kernel)) ** 0.5).astype(
        np.float32
    )
    b = (rng.standard_normal(c_out) * 0.1).astype(np.float32)
    weights += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    pad = kernel // 2
    out = f"{name}_out"
    nodes.append(
        helper.make_node(
            "Conv", [x, f"{name}_w", f"{name}_b"], [out], strides=[stride] * 2, pads=[pad] * 4, name=name
        )
    )
    if not relu:
        return out
    nodes.append(helper.make_node("Relu", [out], [f"{name}_relu"], name=f"{name}_relu"))
    return f"{name}_relu"


def _uint8_stem(nodes: list[onnx.NodeProto], weights: list[onnx.TensorProto]) -> str:
    """uint8 pixels -> float in [0, 1], as a camera model's first layers do."""
    weights.append(numpy_helper.from_array(np.array(1 / 255, dtype=np.float32), "inv255"))
    nodes += [
        helper.make_node("Cast", ["images"], ["pixels"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", ["pixels", "inv255"], ["scaled"], name="scale"),
    ]
    return "scaled"


def camera_cnn(
    path: Path,
    size: int = 640,
    layers: Sequence[tuple[int, int]] = ((16, 2), (32, 2), (64, 2), (64, 2)),
    seed: int = 0,
) -> Path:
    """uint8 1x3xSIZExSIZE -> 3x3 convs -> global pool -> 1x10 float scores (a small output).

    `layers` ((width, stride) per conv) sets the work per frame, so a benchmark can match compute
    time to transfer time.
    """
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []
    x, c = _uint8_stem(nodes, weights), 3
    for i, (width, stride) in enumerate(layers):
        x, c = _conv(nodes, weights, rng, x, c, width, f"conv{i}", stride), width
    fc = rng.standard_normal((10, c)).astype(np.float32)
    weights.append(numpy_helper.from_array(fc, "fc"))
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc"], ["scores"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "camera_cnn",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, [1, 3, size, size])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 10])],
        weights,
    )
    return save_graph(graph, path)


def detector(path: Path, size: int = 640, seed: int = 0) -> Path:
    """uint8 1x3xSIZExSIZE -> a strided backbone -> three 255-channel heads at strides 8, 16, 32."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []
    x = _uint8_stem(nodes, weights)
    x = _conv(nodes, weights, rng, x, 3, 8, "stem")  # stride 2
    x = _conv(nodes, weights, rng, x, 8, 16, "down4")  # stride 4
    p3 = _conv(nodes, weights, rng, x, 16, 16, "p3")  # stride 8
    p4 = _conv(nodes, weights, rng, p3, 16, 16, "p4")  # stride 16
    p5 = _conv(nodes, weights, rng, p4, 16, 16, "p5")  # stride 32
    outputs = []
    for level, feature in (("3", p3), ("4", p4), ("5", p5)):
        head = _conv(nodes, weights, rng, feature, 16, HEAD_CHANNELS, f"head{level}", 1, 1, relu=False)
        nodes.append(helper.make_node("Identity", [head], [f"out{level}"], name=f"out{level}"))
        side = size // (8 << (int(level) - 3))
        outputs.append(
            helper.make_tensor_value_info(f"out{level}", TensorProto.FLOAT, [1, HEAD_CHANNELS, side, side])
        )
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, [1, 3, size, size])],
        outputs,
        weights,
    )
    return save_graph(graph, path)


class _Calibration(CalibrationDataReader):
    def __init__(self, name: str, samples: Sequence[np.ndarray]) -> None:
        self._feeds = iter([{name: s} for s in samples])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantized(float_model: Path, path: Path, samples: Sequence[np.ndarray]) -> Path:
    """The int8 QDQ model of `float_model` (per-tensor, as RKNN quantizes outputs), calibrated on
    `samples` of its single input."""
    name = onnx.load(str(float_model)).graph.input[0].name
    quantize_static(
        str(float_model),
        str(path),
        _Calibration(name, samples),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=False,
    )
    return path


def random_images(count: int, size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (1, 3, size, size), dtype=np.uint8) for _ in range(count)]
