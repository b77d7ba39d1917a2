"""`build(do_quantization=True, dataset=...)` emulated: the toolkit's w8a8 quantizer, as an int8 QDQ model.

What RKNN-Toolkit2 (2.5.0, `quantized_dtype='asymmetric_quantized-8'`) does, and this module with it:
- the graph is first fused as the toolkit fuses it (`fusion`: BN/bias into Conv, Relu/Clip into the
  layer before, PaddlePaddle's decomposed hard_swish into HardSwish, constant folding);
- activations: int8, asymmetric, one scale and zero point per tensor, at the tensors `fusion.quant_points`
  names: scale = (max - min) / 255, zero_point = round(-128 - min / scale), on a range that includes 0
  and is narrowed by a fused activation's bounds and by the dead zone of the op reading it;
- weights of Conv, ConvTranspose, Gemm and MatMul: int8, asymmetric like activations, on each output
  channel's min/max (quantized_method 'channel') or the tensor's ('layer'): on a trained model this
  reproduces the simulator's first-layer int8 outputs exactly but for 0.02% of values, where symmetric
  max|w|/127 weights miss 11%; biases int32 on the grid input scale x weight scale;
- ranges (`calibrate.activation_ranges`): 'normal' = min/max of the calibration data, 'mmse' = the MMSE
  search, 'kl_divergence' = the same search (the toolkit gives both the same ranges).
Each int8 tensor `t` becomes `op -> t -> QuantizeLinear -> DequantizeLinear -> consumers` (a graph
output keeps its name: the op then writes `t_QuantizeLinear_Input`), the naming `layers` reads.
Calibration samples come from dataset.txt through the same input loader as inference, so the model
given here must already have mean/std baked in (`preprocess.bake_normalization`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rknn_client.accuracy.calibrate import activation_ranges
from rknn_client.accuracy.capture import load_model
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.fusion import (
    SHARED_GRID_OPS,
    WEIGHT_OPS,
    consumer_bounds,
    fuse_activations,
    fuse_hardswish,
    optimize,
    quant_points,
    split_global_pools,
)
from rknn_client.accuracy.preprocess import input_specs, load_inputs, read_dataset

ALGORITHMS = ("normal", "kl_divergence", "mmse")
METHODS = {"channel": True, "layer": False}
INT8_MIN, INT8_MAX = -128, 127


@dataclass(frozen=True)
class Grid:
    """An int8 activation grid: value = (q - zero_point) * scale."""

    scale: float
    zero_point: int


def asymmetric_grid(low: float, high: float) -> Grid:
    """The toolkit's asymmetric int8 grid for a range (widened to include 0)."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / (INT8_MAX - INT8_MIN)
    if scale <= 0.0:
        return Grid(1.0, 0)
    return Grid(scale, int(np.clip(np.round(INT8_MIN - low / scale), INT8_MIN, INT8_MAX)))


def load_dataset(
    model: onnx.ModelProto, dataset_txt: str | Path, rgb2bgr: bool = False
) -> list[dict[str, np.ndarray]]:
    """Every sample listed in dataset.txt, read for the model's inputs."""
    specs = input_specs(model)
    return [load_inputs(paths, specs, rgb2bgr) for paths in read_dataset(dataset_txt)]


def _weight_axis(node: onnx.NodeProto, weight: np.ndarray) -> int | None:
    """The output-channel axis of a layer's weight, or None when it has no per-channel form."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1 if attributes.get("group", 1) == 1 else None
    if node.op_type == "Gemm":
        return 0 if attributes.get("transB", 0) else 1
    return weight.ndim - 1 if weight.ndim == 2 else None


def _weight_grid(weight: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Asymmetric int8 (scale, zero point) of a weight, per slice along `axis` (per tensor when None):
    the same rule as activations, on each output channel's min/max."""
    rows = (
        weight.reshape(1, -1)
        if axis is None
        else np.moveaxis(weight, axis, 0).reshape(weight.shape[axis], -1)
    )
    low = np.minimum(rows.min(axis=1), 0.0).astype(np.float64)
    high = np.maximum(rows.max(axis=1), 0.0).astype(np.float64)
    scale = (high - low) / (INT8_MAX - INT8_MIN)
    scale = np.where(scale > 0.0, scale, 1.0)
    zero = np.clip(np.round(INT8_MIN - low / scale), INT8_MIN, INT8_MAX)
    if axis is None:
        return scale.reshape(()), zero.reshape(())
    return scale, zero


class _Builder:
    """Rewrites a fused float model into its QDQ form (see the module docstring)."""

    def __init__(self, model: onnx.ModelProto, grids: Mapping[str, Grid], per_channel: bool) -> None:
        self.model = model
        self.graph = model.graph
        self.grids = grids
        self.per_channel = per_channel
        self.values = {init.name: init for init in self.graph.initializer}
        self.producers = {name: node for node in self.graph.node for name in node.output}
        self.new_initializers: list[onnx.TensorProto] = []
        self.dequantized_weights: dict[str, tuple[str, np.ndarray]] = {}

    def _constant(self, name: str, array: np.ndarray) -> str:
        self.new_initializers.append(numpy_helper.from_array(array, name))
        return name

    def _qdq(self, source: str, target: str, grid: Grid) -> list[onnx.NodeProto]:
        scale = self._constant(f"{target}_scale", np.array(grid.scale, np.float32))
        zero = self._constant(f"{target}_zero_point", np.array(grid.zero_point, np.int8))
        quantized = f"{target}_QuantizeLinear_Output"
        return [
            helper.make_node(
                "QuantizeLinear", [source, scale, zero], [quantized], name=f"{target}_QuantizeLinear"
            ),
            helper.make_node(
                "DequantizeLinear", [quantized, scale, zero], [target], name=f"{target}_DequantizeLinear"
            ),
        ]

    def _input_grid(self, name: str) -> Grid | None:
        """The grid a tensor is on: its own, or its source's through layout ops."""
        while name not in self.grids:
            producer = self.producers.get(name)
            if producer is None or producer.op_type not in SHARED_GRID_OPS:
                return None
            name = producer.input[0]
        return self.grids[name]

    def _dequantize(
        self, name: str, q: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int | None
    ) -> onnx.NodeProto:
        inputs = [
            self._constant(f"{name}_quantized", q),
            self._constant(f"{name}_scale", scale.astype(np.float32)),
            self._constant(f"{name}_zero_point", zero.astype(q.dtype)),
        ]
        node = helper.make_node(
            "DequantizeLinear", inputs, [f"{name}_DequantizeLinear_Output"], name=f"{name}_DequantizeLinear"
        )
        if axis is not None and scale.ndim == 1:
            node.attribute.append(helper.make_attribute("axis", axis))
        return node

    def _weights(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """Per-channel int8 weights and int32 bias for one layer, as DequantizeLinear nodes before it."""
        if node.op_type not in WEIGHT_OPS or len(node.input) < 2 or node.input[1] not in self.values:
            return []
        weight_name = node.input[1]
        weight = numpy_helper.to_array(self.values[weight_name]).astype(np.float32)
        if weight.dtype.kind != "f" or weight.ndim < 2:
            return []
        added = []
        axis = _weight_axis(node, weight) if self.per_channel else None
        if weight_name not in self.dequantized_weights:
            scales, zeros = _weight_grid(weight, axis)
            shape = [1] * weight.ndim
            if axis is not None:
                shape[axis] = -1
            q = np.round(weight / scales.reshape(shape)) + zeros.reshape(shape)
            q = np.clip(q, INT8_MIN, INT8_MAX).astype(np.int8)
            added.append(self._dequantize(weight_name, q, scales, zeros, axis))
            self.dequantized_weights[weight_name] = (added[-1].output[0], scales)
        dequantized, scales = self.dequantized_weights[weight_name]
        node.input[1] = dequantized
        grid = self._input_grid(node.input[0])
        bias_at = 2 if node.op_type in ("Conv", "ConvTranspose", "Gemm") else None
        if (
            grid is not None
            and bias_at is not None
            and len(node.input) > bias_at
            and node.input[bias_at] in self.values
        ):
            bias_name = node.input[bias_at]
            bias = numpy_helper.to_array(self.values[bias_name]).astype(np.float64)
            bias_scale = np.broadcast_to(grid.scale * scales.astype(np.float64), bias.shape)
            if bias.ndim == 1 and (axis is not None or scales.ndim == 0):
                q_bias = np.round(bias / bias_scale).astype(np.int32)
                bias_node = self._dequantize(
                    f"{node.name or bias_name}_{bias_name}", q_bias, bias_scale, np.zeros(bias.shape), 0
                )
                added.append(bias_node)
                node.input[bias_at] = bias_node.output[0]
        return added

    def build(self) -> onnx.ModelProto:
        outputs = {info.name for info in self.graph.output}
        nodes: list[onnx.NodeProto] = []

        def quantize_output(name: str) -> None:
            if name in outputs:
                raw = f"{name}_QuantizeLinear_Input"
                self.producers[name].output[list(self.producers[name].output).index(name)] = raw
                nodes.extend(self._qdq(raw, name, self.grids[name]))
            else:
                nodes.extend(self._qdq(name, f"{name}_DequantizeLinear_Output", self.grids[name]))

        renamed = {name: f"{name}_DequantizeLinear_Output" for name in self.grids if name not in outputs}
        for name in self.grids:
            if name not in self.producers:  # a graph input
                quantize_output(name)
        for node in self.graph.node:
            nodes.extend(self._weights(node))  # before renaming: it looks up the input's grid by name
            for index, name in enumerate(node.input):
                if name in renamed:
                    node.input[index] = renamed[name]
            nodes.append(node)
            for name in list(node.output):
                if name in self.grids:
                    quantize_output(name)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        used = {name for node in nodes for name in node.input}
        kept = [init for init in self.graph.initializer if init.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend([*kept, *self.new_initializers])
        return self.model


def quantize_model(
    float_model_path: str | Path,
    out_path: str | Path,
    dataset_txt: str | Path,
    algorithm: str = "normal",
    method: str = "channel",
    rgb2bgr: bool = False,
    fixed_shapes: bool = True,
) -> None:
    """Write the int8 QDQ model of `float_model_path` to `out_path`, calibrated on dataset.txt.

    `fixed_shapes=False` (a dynamic_input model, calibrated on its first shape set): GlobalAveragePools
    stay whole, since the toolkit's split into 7x7 Convs is laid out for one spatial size only."""
    if algorithm not in ALGORITHMS:
        raise AccuracyError(f"quantized_algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if method not in METHODS:
        raise AccuracyError(f"quantized_method {method!r} is not one of {', '.join(METHODS)}")
    model = load_model(float_model_path)
    samples = load_dataset(model, dataset_txt, rgb2bgr)
    optimized = fuse_hardswish(optimize(model))
    if fixed_shapes:
        optimized = split_global_pools(optimized)
    fused, activation_bounds = fuse_activations(optimized)
    points = quant_points(fused)
    ranges = activation_ranges(optimized, points, samples, algorithm)
    bounds = consumer_bounds(fused, points)
    grids = {}
    for name in points:
        low, high = ranges[name]
        for limits in (activation_bounds.get(name), bounds.get(name)):
            if limits is not None:
                low, high = max(low, limits[0]), min(high, limits[1])
        grids[name] = asymmetric_grid(low, high)
    quantized = _Builder(fused, grids, METHODS[method]).build()
    try:
        onnx.save(quantized, str(out_path))
    except OSError as exc:
        raise AccuracyError(f"cannot write {out_path}: {exc}") from exc
