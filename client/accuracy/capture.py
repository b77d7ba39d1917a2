"""Capture every intermediate tensor of an ONNX model: expose node outputs as graph outputs and run once.

Layers are listed in the graph's topological order (ONNX requires node lists to be sorted), preceded by
the graph inputs as `InputOperator` layers, like the board's dumps (`000_InputOperator_input_...`).
Tensors that only depend on constants (weights, their DequantizeLinear in QDQ models, Constant nodes)
are not layers. Tensors whose type shape inference cannot tell are left out: ONNX Runtime needs a type
for every graph output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.session import open_session, run_session

INPUT_OP_TYPE = "InputOperator"


@dataclass(frozen=True)
class LayerInfo:
    """Where a captured tensor comes from; `index` is its position in the capture order."""

    index: int
    op_type: str
    node_name: str
    tensor_name: str


def load_model(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """Accept a model or a path to one; a missing or corrupt file is an AccuracyError."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model))
    except OSError as exc:
        raise AccuracyError(f"cannot read ONNX model {model}: {exc}") from exc
    except Exception as exc:  # protobuf's DecodeError for files that are not ONNX
        raise AccuracyError(f"{model} is not an ONNX model: {exc}") from exc


def constant_tensors(graph: onnx.GraphProto) -> set[str]:
    """Names whose value does not depend on the graph inputs (initializers and what is computed from them)."""
    constant = {init.name for init in graph.initializer}
    for node in graph.node:
        if all(not name or name in constant for name in node.input):
            constant.update(name for name in node.output if name)
    return constant


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor shape inference can type, by name."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types: dict[str, int] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        elem_type = info.type.tensor_type.elem_type
        if elem_type != onnx.TensorProto.UNDEFINED:
            types[info.name] = elem_type
    types.update({init.name: init.data_type for init in graph.initializer})
    return types


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The real inputs: old models also list their initializers as graph inputs."""
    initializers = {init.name for init in graph.initializer}
    return [info for info in graph.input if info.name not in initializers]


def list_layers(model: onnx.ModelProto) -> list[LayerInfo]:
    """Graph inputs, then every typed, non-constant node output in topological order."""
    graph = model.graph
    types = tensor_types(model)
    constant = constant_tensors(graph)
    layers = [LayerInfo(0, INPUT_OP_TYPE, info.name, info.name) for info in graph_inputs(graph)]
    for node in graph.node:
        for name in node.output:
            if name and name not in constant and name in types:
                layers.append(LayerInfo(len(layers), node.op_type, node.name, name))
    return [LayerInfo(i, layer.op_type, layer.node_name, layer.tensor_name) for i, layer in enumerate(layers)]


def expose_all_layers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[LayerInfo]]:
    """A copy of `model` whose graph outputs include every layer's tensor, and the layers in order."""
    layers = list_layers(model)
    types = tensor_types(model)
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    existing = {info.name for info in exposed.graph.output}
    inputs = {info.name for info in graph_inputs(model.graph)}
    for layer in layers:
        name = layer.tensor_name
        if name not in existing and name not in inputs:
            exposed.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    return exposed, layers


def run_capture(
    model_path: onnx.ModelProto | str | Path, inputs: Mapping[str, np.ndarray]
) -> list[tuple[LayerInfo, np.ndarray]]:
    """Run the model once and return every layer's tensor, inputs included, in layer order."""
    exposed, layers = expose_all_layers(load_model(model_path))
    input_names = {info.name for info in graph_inputs(exposed.graph)}
    missing = input_names - set(inputs)
    if missing:
        raise AccuracyError(f"no data for model input(s): {', '.join(sorted(missing))}")
    computed = [layer for layer in layers if layer.tensor_name not in input_names]
    session = open_session(exposed)
    feeds = {name: inputs[name] for name in input_names}
    values = run_session(session, feeds, [layer.tensor_name for layer in computed])
    by_name = {layer.tensor_name: value for layer, value in zip(computed, values, strict=True)}
    by_name.update({name: np.asarray(inputs[name]) for name in input_names})
    return [(layer, by_name[layer.tensor_name]) for layer in layers]
