"""`build(rknn_batch_size=N)` and `config(dynamic_input=...)` emulated for the host runtime.

rknn_batch_size: the batch-1 model is copied N times in one graph (every tensor and node renamed per
copy, weights shared); a Slice hands copy k the k-th item of each input's batch axis, and a Concat
joins the copies' outputs along axis 0. That is right for any batch-1 graph, including graphs that
hard-code a batch of 1 in a Reshape, which merely rewriting the batch dimension would break.
dynamic_input: the shape sets the model must accept; the dimensions that differ between sets become
free in the model's inputs (and every output dimension becomes free), so ONNX Runtime runs each set;
inference then accepts exactly the listed sets, as an RKNN dynamic-shape model does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rknn_client.compat.onnx_build import BuildError


def _inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    weights = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in weights]


def _dims(info: onnx.ValueInfoProto) -> list[Any]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in info.type.tensor_type.shape.dim]


def batched(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """The batch-`batch` model made of `batch` copies of the batch-1 `model`."""
    graph = model.graph
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in graph.node
        for a in n.attribute
    ):
        raise BuildError("rknn_batch_size is not emulated for models with subgraphs (If/Loop/Scan)")
    inputs, outputs = _inputs(model), list(graph.output)
    for info in [*inputs, *outputs]:
        dims = _dims(info)
        if not dims or not (dims[0] == 1 or isinstance(dims[0], str)):
            raise BuildError(
                f"rknn_batch_size needs a batch-1 model: {info.name} has shape {dims}, expected a first dimension of 1"
            )
    shared = {i.name for i in graph.initializer}
    external = {i.name for i in inputs}
    nodes: list[onnx.NodeProto] = []
    axes = numpy_helper.from_array(np.array([0], np.int64), "__batch_axes")
    bounds = [numpy_helper.from_array(np.array([k], np.int64), f"__batch_{k}") for k in range(batch + 1)]

    def renamed(name: str, k: int) -> str:
        return name if not name or name in shared else f"{name}__b{k}"

    for k in range(batch):
        for info in inputs:
            nodes.append(
                helper.make_node(
                    "Slice",
                    [info.name, f"__batch_{k}", f"__batch_{k + 1}", "__batch_axes"],
                    [renamed(info.name, k)],
                    name=f"{info.name}__slice{k}",
                )
            )
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = (
                f"{node.name}__b{k}" if node.name else ""
            )  # unnamed stays unnamed: names must be unique
            copy.input[:] = [renamed(n, k) for n in node.input]
            copy.output[:] = [renamed(n, k) for n in node.output]
            nodes.append(copy)
    for info in outputs:
        if info.name in external:
            raise BuildError(f"{info.name} is both an input and an output; rknn_batch_size cannot copy it")
        nodes.append(
            helper.make_node(
                "Concat",
                [renamed(info.name, k) for k in range(batch)],
                [info.name],
                axis=0,
                name=f"{info.name}__concat",
            )
        )
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    result.graph.initializer.extend([axes, *bounds])
    del result.graph.value_info[:]
    for info in [*_inputs(result), *result.graph.output]:
        first = info.type.tensor_type.shape.dim[0]
        first.Clear()
        first.dim_value = batch
    return result


def dynamic_sets(value: Any, input_count: int) -> list[list[tuple[int, ...]]]:
    """config(dynamic_input=...) checked: a list of shape sets, each with one shape per input."""
    if not isinstance(value, Sequence) or not value:
        raise BuildError(
            "dynamic_input must be a list of shape sets, e.g. [[[1,3,224,224]], [[1,3,160,160]]]"
        )
    sets = []
    for index, shapes in enumerate(value):
        if not isinstance(shapes, Sequence) or len(shapes) != input_count:
            raise BuildError(f"dynamic_input[{index}] must list {input_count} shape(s), one per model input")
        try:
            sets.append([tuple(int(d) for d in shape) for shape in shapes])
        except (TypeError, ValueError):
            raise BuildError(f"dynamic_input[{index}] holds a shape that is not a list of integers") from None
        if any(len(a) != len(b) for a, b in zip(sets[0], sets[-1], strict=True)):
            raise BuildError(f"dynamic_input[{index}] changes the rank of an input")
    return sets


def with_free_dims(model: onnx.ModelProto, sets: Sequence[Sequence[tuple[int, ...]]]) -> onnx.ModelProto:
    """A copy whose input dimensions that differ between the sets are free, and all output dims free."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for position, info in enumerate(_inputs(result)):
        shapes = [shape_set[position] for shape_set in sets]
        dims = info.type.tensor_type.shape.dim
        del dims[:]
        for axis, sizes in enumerate(zip(*shapes, strict=True)):
            dim = dims.add()
            if len(set(sizes)) == 1:
                dim.dim_value = sizes[0]
            else:
                dim.dim_param = f"{info.name}_dim{axis}"
    for info in result.graph.output:
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            dim.Clear()
            dim.dim_param = f"{info.name}_dim{axis}"
    del result.graph.value_info[:]
    return result


def nchw_shape(array: np.ndarray, layout: str) -> tuple[int, ...]:
    """The shape as the model declares it (NCHW for 4-D ONNX inputs), whatever layout it travels in."""
    shape = tuple(int(d) for d in array.shape)
    if layout == "NHWC" and len(shape) == 4:
        return (shape[0], shape[3], shape[1], shape[2])
    return shape


def check_dynamic(shapes: Sequence[tuple[int, ...]], sets: Sequence[Sequence[Sequence[int]]]) -> None:
    """Refuse input shapes that are not one of the configured sets, as a dynamic-shape RKNN model does."""
    allowed = [[tuple(shape) for shape in shape_set] for shape_set in sets]
    if list(shapes) not in allowed:
        listed = "; ".join(str([list(shape) for shape in shape_set]) for shape_set in allowed)
        raise BuildError(
            f"input shape(s) {[list(shape) for shape in shapes]} are not among the dynamic_input shapes: {listed}"
        )
