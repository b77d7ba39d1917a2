"""Static facts about an ONNX graph: weight bytes, tensor sizes and the peak of live intermediates."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, shape_inference


@dataclass(frozen=True)
class TensorInfo:
    name: str
    elem_type: int
    shape: tuple[int, ...]  # unknown dimensions are -1

    @property
    def nbytes(self) -> int:
        """Size with unknown dimensions taken as 1 (what a batch-1 run allocates)."""
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type)).itemsize if self.elem_type else 4
        return math.prod(max(d, 1) for d in self.shape) * itemsize


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of all weights, counting external data by its declared length (or its dims)."""
    total = 0
    for init in model.graph.initializer:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        total += math.prod(init.dims) * itemsize
    return total


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    t = value.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
    return TensorInfo(value.name, t.elem_type, dims)


def inferred_tensors(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    """Type and shape of every tensor the graph names, from ONNX shape inference."""
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # shape inference is best effort; fall back to what the model declares
        inferred = model
    g = inferred.graph
    return {
        v.name: _tensor_info(v)
        for v in [*g.input, *g.value_info, *g.output]
        if v.type.HasField("tensor_type")
    }


def peak_intermediate_bytes(model: onnx.ModelProto, tensors: dict[str, TensorInfo]) -> int:
    """Peak bytes of intermediate tensors alive at once, running nodes in the graph's order.

    A tensor lives from the node that produces it until its last consumer has run; graph inputs
    and weights are not intermediates, graph outputs live until the end.
    """
    graph = model.graph
    weights = {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    last_use: dict[str, int] = {}
    for step, node in enumerate(graph.node):
        for name in node.input:
            last_use[name] = step
    live: dict[str, int] = {}
    peak = 0
    for step, node in enumerate(graph.node):
        for name in node.output:
            if name and name not in weights:
                info = tensors.get(name)
                live[name] = info.nbytes if info else 0
        peak = max(peak, sum(live.values()))
        for name in list(live):
            if name not in outputs and last_use.get(name, step) <= step:
                del live[name]
    return peak
