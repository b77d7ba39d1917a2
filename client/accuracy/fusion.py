"""The graph as RKNN-Toolkit2's quantizer sees it: fused, and where its int8 tensors are.

What the toolkit does (read off the quantization model and `.quantization.cfg` that its
`hybrid_quantization_step1` writes for trained models):
- BatchNormalization, a constant Add (bias) and a constant Mul are folded into the Conv before them;
  Constant nodes are folded. ONNX Runtime's basic graph optimisations do exactly these, so `optimize`
  runs them (and raises the opset to 14 first, for per-axis DequantizeLinear and HardSwish).
- A Relu or Clip right after a layer is one op with it: the layer's output is quantized once, on the
  activation's range (`fuse_activations` removes the activation and lets the layer write its output;
  quantizing on a range that starts at 0, or ends at the Clip's bound, clamps exactly as it does).
- An op with a dead zone narrows the range of the tensor it reads: HardSwish reads from -3 up,
  HardSigmoid from -beta/alpha to (1 - beta)/alpha, Sigmoid from -7 to 7 (`consumer_bounds`).
- Every other floating-point tensor an op writes is int8 (asymmetric, per tensor), except where the
  toolkit keeps the grid of the op's input (Reshape and the other layout ops, MaxPool) and Softmax,
  which it runs in float16 (`quant_points`). Elementwise steps with a constant fold: back into the
  layer with weights they follow (Conv -> Mul -> Add is one op), forward into a Gemm/MatMul (a
  dropout's scale), and the mean/std front of an image input is one step whose output (the
  normalized image) is int8, while the raw image input is not. A non-grouped Conv and the HardSwish
  after it are one op too (no int8 between them) on feature maps larger than 1x1.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from rknn_client.accuracy.capture import constant_tensors, graph_inputs, tensor_types
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.layers import FLOAT_TYPES

TARGET_OPSET = 14  # per-axis DequantizeLinear (13), HardSwish (14)
FUSED_ACTIVATIONS = frozenset({"Relu", "Clip"})
FUSED_WHEN_SPATIAL = frozenset({"HardSwish", "HardSigmoid", "LeakyRelu"})
SHARED_GRID_OPS = frozenset(
    {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "MaxPool"}
)
FLOAT_OPS = frozenset({"Softmax"})
AFFINE_OPS = frozenset({"Add", "Sub", "Mul", "Div"})
WEIGHT_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` at opset >= 14 with ONNX Runtime's basic optimisations applied (BN/bias/Mul into Conv,
    constant folding); tensor names that survive keep their names."""
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
    if opset < TARGET_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, TARGET_OPSET)
        except Exception as exc:  # the converter raises its own types for ops it cannot convert
            raise AccuracyError(f"cannot convert the model to opset {TARGET_OPSET}: {exc}") from exc
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="rknn-accuracy-") as tmp:
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT's own exception types for graphs it cannot load
            raise AccuracyError(f"ONNX Runtime cannot load the model: {exc}") from exc
        return onnx.load(options.optimized_model_filepath)


def consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """The nodes reading each tensor."""
    found: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            if name:
                found[name].append(node)
    return found


def _initializers(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in graph.initializer}


def _clip_bounds(node: onnx.NodeProto, values: dict[str, np.ndarray]) -> tuple[float, float] | None:
    """A Relu's or Clip's output range, or None for a Clip whose bounds are not constants."""
    if node.op_type == "Relu":
        return 0.0, float("inf")
    bounds = []
    for position, default in ((1, -np.inf), (2, np.inf)):
        name = node.input[position] if len(node.input) > position else ""
        if name and name not in values:
            return None
        bounds.append(float(values[name]) if name else float(default))
    return bounds[0], bounds[1]


def fuse_activations(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, tuple[float, float]]]:
    """A copy of `model` where each Relu/Clip whose input only it reads is merged into the op before it,
    and the fused tensors' (low, high) bounds (the calibration range is clipped to them)."""
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    graph = fused.graph
    readers = consumers(graph)
    values = _initializers(graph)
    producers = {name: node for node in graph.node for name in node.output}
    outputs = {info.name for info in graph.output}
    bounds: dict[str, tuple[float, float]] = {}
    kept = []
    for node in graph.node:
        source = node.input[0] if node.input else ""
        producer = producers.get(source)
        limits = _clip_bounds(node, values) if node.op_type in FUSED_ACTIVATIONS else None
        if (
            limits is None
            or producer is None
            or len(readers[source]) != 1
            or source in outputs
            or not limits[0] <= 0.0 <= limits[1]
        ):
            kept.append(node)
            continue
        producer.output[list(producer.output).index(source)] = node.output[0]
        producers[node.output[0]] = producer
        bounds[node.output[0]] = limits
    del graph.node[:]
    graph.node.extend(kept)
    return fused, bounds


def _constant_value(name: str, values: dict[str, np.ndarray]) -> float | None:
    value = values.get(name)
    return float(value) if value is not None and value.size == 1 else None


def _hardswish_input(
    mul: onnx.NodeProto,
    single: Callable[[str, str], onnx.NodeProto | None],
    values: dict[str, np.ndarray],
) -> tuple[str, list[onnx.NodeProto]] | None:
    """If `mul` ends a decomposed hard_swish, its input x and the nodes before `mul` that make it up:
    `x * (Clip(x + 3, 0, 6) / 6)` or `(x * Clip(x + 3, 0, 6)) / 6` (PaddlePaddle's exports; then `mul`
    is the Div) or `x * HardSigmoid(x, 1/6, 1/2)` (ONNX's HardSwish function body, which ONNX Runtime
    inlines)."""
    if mul.op_type == "Div":
        inner = single(mul.input[0], "Mul")
        if inner is None or _constant_value(mul.input[1], values) != 6.0:
            return None
        for x, other in ((inner.input[0], inner.input[1]), (inner.input[1], inner.input[0])):
            clip = single(other, "Clip")
            add = single(clip.input[0], "Add") if clip is not None else None
            if clip is not None and add is not None and _is_plus_three(add, x, clip, values):
                return x, [inner, clip, add]
        return None
    for x, other in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
        sigmoid = single(other, "HardSigmoid")
        if sigmoid is not None and sigmoid.input[0] == x:
            alpha, beta = _attribute(sigmoid, "alpha", 0.2), _attribute(sigmoid, "beta", 0.5)
            if abs(alpha - 1.0 / 6.0) < 1e-6 and beta == 0.5:
                return x, [sigmoid]
        div = single(other, "Div")
        clip = single(div.input[0], "Clip") if div is not None else None
        add = single(clip.input[0], "Add") if clip is not None else None
        if div is None or clip is None or add is None:
            continue
        if _constant_value(div.input[1], values) == 6.0 and _is_plus_three(add, x, clip, values):
            return x, [div, clip, add]
    return None


def _is_plus_three(add: onnx.NodeProto, x: str, clip: onnx.NodeProto, values: dict[str, np.ndarray]) -> bool:
    """Whether `clip(add)` is Clip(x + 3, 0, 6)."""
    if x not in add.input:
        return False
    three = add.input[1] if add.input[0] == x else add.input[0]
    return _constant_value(three, values) == 3.0 and _clip_bounds(clip, values) == (0.0, 6.0)


def fuse_hardswish(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` where each decomposed hard_swish (see `_hardswish_input`) is one HardSwish
    node, as the toolkit makes it: its intermediates are never int8 there."""
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    graph = fused.graph
    values = _initializers(graph)
    producers = {name: node for node in graph.node for name in node.output}
    readers = consumers(graph)
    removed: set[int] = set()
    replaced: dict[int, onnx.NodeProto] = {}

    def single(name: str, op_type: str) -> onnx.NodeProto | None:
        node = producers.get(name)
        return node if node is not None and node.op_type == op_type and len(readers[name]) == 1 else None

    for node in graph.node:
        ends = node.op_type in ("Mul", "Div") and len(node.input) == 2
        found = _hardswish_input(node, single, values) if ends else None
        if found is not None:
            removed.update(id(part) for part in found[1])
            replaced[id(node)] = onnx.helper.make_node(
                "HardSwish", [found[0]], list(node.output), name=node.name
            )
    nodes = [replaced.get(id(node), node) for node in graph.node if id(node) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    return fused


POOL_WINDOW = 7
SIGMOID_EDGE = 7.0


def _pool_stage(size: int) -> tuple[int, int, int]:
    """(kernel, pad before, pad after) of one stage along one axis: the whole axis when it fits in a
    window, else windows of POOL_WINDOW with the axis zero-padded evenly to a multiple of it."""
    if size <= POOL_WINDOW:
        return size, 0, 0
    padding = -size % POOL_WINDOW
    return POOL_WINDOW, padding // 2, padding - padding // 2


def split_global_pools(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` where each GlobalAveragePool over more than 7x7 is what the toolkit makes of
    it: a chain of depthwise Convs (windows of at most 7x7, stride 7, zero padding spread evenly,
    every weight (1/(H*W))^(1/stages)), whose intermediate outputs are int8 tensors of their own."""
    split = onnx.ModelProto()
    split.CopyFrom(model)
    graph = split.graph
    shapes = _shapes(model)
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        shape = shapes.get(node.input[0], ()) if node.op_type == "GlobalAveragePool" else ()
        if len(shape) != 4 or min(shape) <= 0 or (shape[2] <= POOL_WINDOW and shape[3] <= POOL_WINDOW):
            nodes.append(node)
            continue
        channels, height, width = shape[1], shape[2], shape[3]
        stages = []
        while height > 1 or width > 1:
            rows, cols = _pool_stage(height), _pool_stage(width)
            stages.append((rows, cols))
            height = (height + rows[1] + rows[2]) // rows[0]
            width = (width + cols[1] + cols[2]) // cols[0]
        weight = (1.0 / (shape[2] * shape[3])) ** (1.0 / len(stages))
        source = node.input[0]
        for index, (rows, cols) in enumerate(stages):
            name = f"{node.name or node.output[0]}_2conv{index}"  # the toolkit's names
            kernel = np.full((channels, 1, rows[0], cols[0]), weight, np.float32)
            graph.initializer.append(numpy_helper.from_array(kernel, f"{name}_weight"))
            target = node.output[0] if index == len(stages) - 1 else name
            nodes.append(
                onnx.helper.make_node(
                    "Conv",
                    [source, f"{name}_weight"],
                    [target],
                    name=name,
                    group=channels,
                    kernel_shape=[rows[0], cols[0]],
                    strides=[POOL_WINDOW, POOL_WINDOW],
                    pads=[rows[1], cols[1], rows[2], cols[2]],
                )
            )
            source = target
    del graph.node[:]
    graph.node.extend(nodes)
    return split


def _attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else float(onnx.helper.get_attribute_value(found))


def _dead_zone(node: onnx.NodeProto) -> tuple[float, float]:
    """The input range outside which the op's output no longer changes."""
    if node.op_type == "HardSwish":
        return -3.0, float("inf")
    if node.op_type == "Sigmoid":  # what the toolkit's calibration gives a Sigmoid's input: [-7, 7]
        return -SIGMOID_EDGE, SIGMOID_EDGE
    if node.op_type == "HardSigmoid":
        alpha, beta = _attribute(node, "alpha", 0.2), _attribute(node, "beta", 0.5)
        return -beta / alpha, (1.0 - beta) / alpha
    return float("-inf"), float("inf")


def consumer_bounds(model: onnx.ModelProto, names: list[str]) -> dict[str, tuple[float, float]]:
    """For each tensor, the widest input dead-zone bounds over the ops reading it."""
    readers = consumers(model.graph)
    found = {}
    for name in names:
        zones = [_dead_zone(node) for node in readers.get(name, [])]
        if zones:
            found[name] = (min(z[0] for z in zones), max(z[1] for z in zones))
    return found


def _affine_with_constant(node: onnx.NodeProto, constant: set[str]) -> bool:
    return node.op_type in AFFINE_OPS and sum(name in constant for name in node.input) == 1


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Static shapes shape inference finds (a dimension it cannot tell is 0)."""
    graph = onnx.shape_inference.infer_shapes(model).graph
    return {
        info.name: tuple(dim.dim_value for dim in info.type.tensor_type.shape.dim)
        for info in [*graph.input, *graph.value_info, *graph.output]
        if info.type.tensor_type.HasField("shape")
    }


def quant_points(model: onnx.ModelProto) -> list[str]:
    """The tensors the toolkit holds in int8, in graph order (see the module docstring)."""
    graph = model.graph
    types = tensor_types(model)
    constant = constant_tensors(graph)
    readers = consumers(graph)
    producers = {name: node for node in graph.node for name in node.output}
    shapes = _shapes(model)

    def affine_steps_only(name: str) -> bool:
        """Whether `name` is read by one constant affine step (Mul/Add/... with a constant) and nothing else."""
        following = readers.get(name, [])
        return len(following) == 1 and _affine_with_constant(following[0], constant)

    def into_matmul(name: str) -> bool:
        """Whether every reader is a Gemm/MatMul (through layout ops): a constant scale folds into it."""
        following = readers.get(name, [])
        return bool(following) and all(
            node.op_type in ("Gemm", "MatMul")
            or (node.op_type in SHARED_GRID_OPS and into_matmul(node.output[0]))
            for node in following
        )

    def layer_of(name: str) -> onnx.NodeProto | None:
        """The layer with weights `name` comes from through constant affine steps that fold back into
        it (each step the only reader of the one before), or None."""
        node = producers.get(name)
        while node is not None and _affine_with_constant(node, constant):
            data = next(i for i in node.input if i not in constant)
            if len(readers.get(data, [])) != 1:
                return None
            node = producers.get(data)
        return node if node is not None and node.op_type in WEIGHT_OPS else None

    def fused_into_activation(name: str) -> bool:
        """A (not grouped) Conv's output read only by a HardSwish-like activation on a feature map
        larger than 1x1: the toolkit runs the two as one op. (A depthwise Conv's output is int8 before
        the activation: the simulator's values match that, not the fused form.)"""
        layer, following = layer_of(name), readers.get(name, [])
        shape = shapes.get(name, ())
        return (
            layer is not None
            and layer.op_type in ("Conv", "ConvTranspose")
            and _attribute(layer, "group", 1) == 1
            and len(following) == 1
            and following[0].op_type in FUSED_WHEN_SPATIAL
            and len(shape) == 4
            and shape[2] * shape[3] > 1
        )

    def normalizes(name: str) -> bool:
        """Whether every reader is a constant affine step (the mean/std front of an image input)."""
        following = readers.get(name, [])
        return bool(following) and all(_affine_with_constant(node, constant) for node in following)

    normalizing = {info.name for info in graph_inputs(graph) if normalizes(info.name)}
    points = [
        info.name
        for info in graph_inputs(graph)
        if types.get(info.name) in FLOAT_TYPES and info.name not in normalizing
    ]
    for node in graph.node:
        if node.op_type in SHARED_GRID_OPS or node.op_type in FLOAT_OPS:
            continue
        chained = _affine_with_constant(node, constant)
        from_input = chained and any(name in normalizing for name in node.input)
        for name in node.output:
            if not name or name in constant or types.get(name) not in FLOAT_TYPES:
                continue
            if from_input and normalizes(name):
                normalizing.add(name)
                continue
            folded_back = layer_of(name) is not None and affine_steps_only(name)
            folded_forward = chained and not from_input and into_matmul(name)
            if folded_back or folded_forward or fused_into_activation(name):
                continue
            points.append(name)
    return points
