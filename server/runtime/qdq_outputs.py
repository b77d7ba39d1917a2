"""Let a quantized (QDQ) ONNX model hand out its outputs as the int8 it computes them in.

A QDQ model ends each output with DequantizeLinear, so ONNX Runtime returns float32: four bytes per
value where the runtime held one. Rewriting the graph so that the quantized tensor itself is the
output (under the output's own name) lets the daemon send the int8 bytes and report the zero point
and scale, as an RKNN board reports a quantized model's outputs; `rknn_proto.messages.dequantize`
then gives the float path's values bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rknn_server.runtime.external_data import uses_external_data

_PASS_THROUGH_OPS = ("Identity",)
# An exposed output's affine quantization: (zero_point, scale).
Affine = tuple[int, float]


def _scalar(initializers: dict[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    tensor = initializers.get(name)
    # numpy_helper would read external data against the working directory: a scale is never that big.
    if tensor is None or uses_external_data(tensor):
        return None
    value = numpy_helper.to_array(tensor)
    return value if value.size == 1 else None


def _dequantizer(
    output: str, producers: dict[str, onnx.NodeProto], initializers: dict[str, onnx.TensorProto]
) -> tuple[str, Affine, int] | None:
    """The quantized tensor behind a graph output, its quantization and element type, when the
    output is a per-tensor DequantizeLinear (possibly through Identity nodes) of a computed tensor."""
    node = producers.get(output)
    while node is not None and node.op_type in _PASS_THROUGH_OPS:
        node = producers.get(node.input[0])
    if node is None or node.op_type != "DequantizeLinear" or len(node.input) < 3:
        return None
    quantized, scale_name, zero_name = node.input[:3]
    scale, zero = _scalar(initializers, scale_name), _scalar(initializers, zero_name)
    if scale is None or zero is None or zero.dtype not in (np.int8, np.uint8) or quantized not in producers:
        return None
    info = (int(zero.reshape(())), float(np.float32(scale.reshape(()))))
    return quantized, info, helper.np_dtype_to_tensor_dtype(zero.dtype)


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove nodes none of whose outputs is used any more (the bypassed DequantizeLinear nodes)."""
    while True:
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(out in used for out in n.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)


def _exposable(model: onnx.ModelProto) -> list[tuple[onnx.ValueInfoProto, tuple[str, Affine, int]]]:
    """The graph outputs a rewrite would expose, each with what _dequantizer found behind it."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {t.name: t for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    consumed = {name for node in graph.node for name in node.input}
    found = [(output, _dequantizer(output.name, producers, initializers)) for output in graph.output]
    return [
        (output, behind)
        for output, behind in found
        if behind is not None and behind[0] not in graph_inputs and output.name not in consumed
    ]


def has_quantized_outputs(model: onnx.ModelProto) -> bool:
    """Whether expose_quantized_outputs would rewrite anything: asked first, so that a float model
    is never copied for a rewrite that changes nothing (a copy is the whole model, weights and all)."""
    return bool(_exposable(model))


def expose_quantized_outputs(model: onnx.ModelProto) -> dict[str, Affine]:
    """Rewrite `model` in place so each output computed by a per-tensor DequantizeLinear becomes
    that DequantizeLinear's integer input; returns the quantization of each rewritten output."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    exposed: dict[str, Affine] = {}
    for output, (quantized, info, elem_type) in _exposable(model):
        graph.node.remove(producers[output.name])
        graph.node.append(
            helper.make_node("Identity", [quantized], [output.name], name=f"{output.name}_native")
        )
        output.type.tensor_type.elem_type = elem_type
        exposed[output.name] = info
    if exposed:
        _drop_dead_nodes(graph)
    return exposed
