"""Static facts about an ONNX graph: weight bytes, tensor sizes and the peak of live intermediates."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, shape_inference


@dataclass(frozen=True)
class ValueInfo:
    """A value of an ONNX graph as shape inference knows it (the graph's ValueInfoProto)."""

    name: str
    elem_type: int
    shape: tuple[int, ...]  # unknown dimensions are -1; an unknown rank is (-1,)

    @property
    def nbytes(self) -> int:
        """Size with unknown dimensions taken as 1 (what a batch-1 run allocates)."""
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type)).itemsize if self.elem_type else 4
        return math.prod(max(d, 1) for d in self.shape) * itemsize


def weight_names(graph: onnx.GraphProto) -> set[str]:
    """Names of the graph's weights: dense and sparse initializers."""
    return {i.name for i in graph.initializer} | {s.values.name for s in graph.sparse_initializer}


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of all weights, counting external data by its declared length (or its dims)."""
    total = 0
    for init in model.graph.initializer:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        total += math.prod(init.dims) * itemsize
    return total


def _tensor_info(value: onnx.ValueInfoProto) -> ValueInfo:
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return ValueInfo(value.name, t.elem_type, (-1,))
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
    return ValueInfo(value.name, t.elem_type, dims)


# Weights bigger than this are left out of the copy shape inference reads. What shape inference reads
# of a weight's values (a Reshape's shape, a Slice's starts, Resize's scales) is a few integers.
_SHAPE_DATA_MAX_BYTES = 4096


def _copy_fields(
    source: onnx.ModelProto | onnx.GraphProto, target: onnx.ModelProto | onnx.GraphProto, skip: str
) -> None:
    """Every field of `source` set on `target`, but `skip`."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its large weights' bytes left out (their name, type and dims kept), for shape
    inference: it serializes the model, parses it in C++ and back, so a 14 MiB MobileNetV2 cost three
    copies of its weights and most of a load's time for shapes that need none of their values."""
    graph = model.graph
    large = {w.name for w in graph.initializer if w.ByteSize() > _SHAPE_DATA_MAX_BYTES}
    if not large:
        return model
    light = onnx.ModelProto()
    _copy_fields(model, light, "graph")
    _copy_fields(graph, light.graph, "initializer")
    for weight in graph.initializer:
        if weight.name not in large:
            light.graph.initializer.append(weight)
            continue
        stub = light.graph.initializer.add(name=weight.name, data_type=weight.data_type, dims=weight.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL  # values unreadable, as with load_external_data=False
        stub.external_data.add(key="location", value="left-out-for-shape-inference")
    return light


def inferred_tensors(model: onnx.ModelProto) -> dict[str, ValueInfo]:
    """Type and shape of every tensor the graph names, from ONNX shape inference."""
    try:
        inferred = shape_inference.infer_shapes(_without_weights(model), strict_mode=False)
    except Exception:  # shape inference is best effort; fall back to what the model declares
        inferred = model
    g = inferred.graph
    return {
        v.name: _tensor_info(v)
        for v in [*g.input, *g.value_info, *g.output]
        if v.type.HasField("tensor_type")
    }


def shapes_static(model: onnx.ModelProto, tensors: dict[str, ValueInfo]) -> bool:
    """Whether every tensor a run reads or computes has a shape known before the run: no dynamic
    input, no shape computed from the data, no subgraph. Then what a run allocates is the model's own
    doing, the same every run, whatever values the caller sends."""
    graph = model.graph
    weights = weight_names(graph)
    names = [i.name for i in graph.input if i.name not in weights]
    for node in graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return False
        names.extend(name for name in node.output if name and name not in weights)
    return all(name in tensors and min(tensors[name].shape, default=0) >= 0 for name in names)


def peak_intermediate_bytes(model: onnx.ModelProto, tensors: dict[str, ValueInfo]) -> int:
    """Peak bytes of intermediate tensors alive at once, running nodes in the graph's order.

    A tensor lives from the node that produces it until its last consumer has run; graph inputs
    and weights are not intermediates, graph outputs live until the end.
    """
    graph = model.graph
    weights = weight_names(graph)
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


def materialized_bytes(model: onnx.ModelProto, tensors: dict[str, ValueInfo]) -> int:
    """A lower bound of what loading and running the model allocates: its weights, plus the larger
    of the tensors constant folding computes at load (a ConstantOfShape of a constant shape is one:
    a few bytes of model, any size in memory) and the peak of live intermediates."""
    constant = {i.name for i in model.graph.initializer}
    folded = 0
    for node in model.graph.node:
        if all(not name or name in constant for name in node.input):
            for name in node.output:
                constant.add(name)
                info = tensors.get(name)
                folded += info.nbytes if info else 0
    return initializer_bytes(model) + max(folded, peak_intermediate_bytes(model, tensors))


@dataclass(frozen=True)
class DumpTensor:
    """One tensor a per-layer dump delivers: which node wrote it (graph inputs: `InputOperator`)."""

    index: int
    op_type: str
    node_name: str
    info: ValueInfo


INPUT_OP_TYPE = "InputOperator"  # the board's name for the layer that holds a model input


def graph_inputs(model: onnx.ModelProto) -> list[str]:
    """Names of the real inputs (old models also list their weights as graph inputs)."""
    weights = weight_names(model.graph)
    return [i.name for i in model.graph.input if i.name not in weights]


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """Fix the model's dynamic input dimensions to those of actual data, in place, so shape inference
    sizes every tensor of a dynamic model."""
    for value in model.graph.input:
        if value.name in shapes and any(
            not d.HasField("dim_value") for d in value.type.tensor_type.shape.dim
        ):
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[value.name]:
                dims.add().dim_value = int(size)


def dump_tensors(model: onnx.ModelProto, tensors: dict[str, ValueInfo]) -> list[DumpTensor]:
    """Graph inputs, then every node output in node (topological) order whose type inference knows.

    Outputs computed from weights alone (constant folding material, e.g. a QDQ model's dequantized
    weights) are not layers: they do not depend on the input and a board's dump has none of them.
    """
    constant = weight_names(model.graph)
    found = [(INPUT_OP_TYPE, name, name) for name in graph_inputs(model)]
    for node in model.graph.node:
        if all(not name or name in constant for name in node.input):
            constant.update(name for name in node.output if name)
            continue
        found.extend((node.op_type, node.name, name) for name in node.output if name)
    typed = [(op, node, name) for op, node, name in found if name in tensors and tensors[name].elem_type]
    return [DumpTensor(i, op, node, tensors[name]) for i, (op, node, name) in enumerate(typed)]


def dump_batches(layers: list[DumpTensor], budget_bytes: int) -> list[list[DumpTensor]]:
    """Consecutive groups of layers of at most `budget_bytes` together (a larger tensor goes alone)."""
    batches: list[list[DumpTensor]] = []
    size = 0
    for layer in layers:
        if not batches or size + layer.info.nbytes > budget_bytes:
            batches.append([])
            size = 0
        batches[-1].append(layer)
        size += layer.info.nbytes
    return batches


def _reads(node: onnx.NodeProto) -> list[str]:
    """Tensors a node reads: its inputs and the outer-scope names its subgraphs (If/Loop bodies) use."""
    names = [name for name in node.input if name]
    for attr in node.attribute:
        for body in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in body.node:
                names.extend(_reads(inner))
    return names


def model_for_outputs(
    model: onnx.ModelProto, names: list[str], tensors: dict[str, ValueInfo]
) -> onnx.ModelProto:
    """A model whose outputs are `names`, holding only the nodes and weights needed to compute them.

    All graph inputs stay (unused ones are harmless), so every batch is fed the same way.
    """
    graph = model.graph
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    needed: set[int] = set()
    pending = list(names)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name not in producer:
            continue
        seen.add(name)
        needed.add(producer[name])
        pending.extend(_reads(graph.node[producer[name]]))
    reads = {n for i in needed for n in _reads(graph.node[i])}
    outputs = [helper.make_tensor_value_info(name, tensors[name].elem_type, None) for name in names]
    subgraph = helper.make_graph(
        [graph.node[i] for i in sorted(needed)],
        graph.name,
        [v for v in graph.input if v.name not in weight_names(graph)],
        outputs,
        [w for w in graph.initializer if w.name in reads],
        sparse_initializer=[s for s in graph.sparse_initializer if s.values.name in reads],
    )
    sub = helper.make_model(subgraph, opset_imports=list(model.opset_import))
    sub.ir_version = model.ir_version
    sub.functions.extend(model.functions)
    return sub
