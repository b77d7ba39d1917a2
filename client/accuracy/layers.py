"""Which tensors count as layers when golden, simulator and runtime are compared, QDQ models included.

In a QDQ model (what `quantize.quantize_model` writes) each quantized layer is `op -> QuantizeLinear ->
DequantizeLinear`: the op writes a float tensor `t` (the float model's name for that layer), the layer's
quantized value is the DequantizeLinear output (`t_DequantizeLinear_Output`), and consumers read that.
A `ModelLayer` keeps both: `raw` (where the op writes, and where a single-layer run feeds reference data)
and `value` (what the layer hands on, compared against the other sides). The layer's name is `raw`,
except when `value` is a graph output: the quantizer then renames the op's output
(`<out>_QuantizeLinear_Input`) so the graph output keeps the float model's name.
QuantizeLinear/DequantizeLinear nodes are never layers of their own. Activations that the emulation
folds into the layer before (Relu, Clip) vanish from the QDQ model: their Conv writes the Relu's output
name, so the float model's Conv output exists only in golden, like the board's fused `ConvRelu`.
A float model has no Q/DQ pairs, so there `raw == value == name`.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from rknn_client.accuracy.capture import (
    INPUT_OP_TYPE,
    LayerInfo,
    constant_tensors,
    graph_inputs,
    tensor_types,
)

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
FLOAT_TYPES = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
)


@dataclass(frozen=True)
class ModelLayer:
    """One layer of a model as the analysis sees it."""

    info: LayerInfo
    raw: str
    value: str


def _quantized_values(graph: onnx.GraphProto) -> dict[str, str]:
    """Map each tensor read by a QuantizeLinear to the DequantizeLinear output that re-reads it."""
    dequantized = {
        str(node.input[0]): str(node.output[0]) for node in graph.node if node.op_type == "DequantizeLinear"
    }
    return {
        str(node.input[0]): dequantized[node.output[0]]
        for node in graph.node
        if node.op_type == "QuantizeLinear" and node.output[0] in dequantized
    }


def model_layers(model: onnx.ModelProto) -> list[ModelLayer]:
    """Graph inputs and floating-point outputs of compute nodes (not Q/DQ, not constant), in graph order."""
    graph = model.graph
    types = tensor_types(model)
    constant = constant_tensors(graph)
    outputs = {info.name for info in graph.output}
    found = [(INPUT_OP_TYPE, info.name, info.name) for info in graph_inputs(graph)]
    for node in graph.node:
        if node.op_type in QDQ_OPS:
            continue
        found.extend(
            (node.op_type, node.name, name)
            for name in node.output
            if name and name not in constant and types.get(name) in FLOAT_TYPES
        )
    quantized = _quantized_values(graph)
    layers = []
    for index, (op_type, node_name, raw) in enumerate(found):
        value = quantized.get(raw, raw)
        name = value if value in outputs else raw
        layers.append(ModelLayer(LayerInfo(index, op_type, node_name, name), raw, value))
    return layers
