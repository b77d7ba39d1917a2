"""A host model's study: its ONNX graph read and checked before ONNX Runtime allocates anything,
for its memory facts (host_facts), and what ONNX Runtime is to load (the file, or a rewrite).

Apart from host_model because it needs the onnx package, which a model whose facts are remembered
does without, and which a dump needs again (graph)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from rknn_proto import model_container
from rknn_server.runtime import onnx_graph
from rknn_server.runtime.external_data import check_external_data
from rknn_server.runtime.host_facts import ModelFacts
from rknn_server.runtime.qdq_outputs import Affine, expose_quantized_outputs, has_quantized_outputs


def read_model(path: Path) -> tuple[onnx.ModelProto, bool]:
    """The model's graph, and whether it came out of a virtual-board container (export_rknn's file)."""
    if model_container.file_is_virtual(path):
        return onnx.load_from_string(model_container.read(path).onnx), True
    return onnx.load(str(path), load_external_data=False), False


def facts_of(graph: onnx.ModelProto, folder: Path) -> ModelFacts:
    """The graph's memory facts, its external data checked to stay in `folder`. Shape inference runs
    once per model: its budget (each open's), its arena and its memory report."""
    check_external_data(graph, folder)
    tensors = onnx_graph.inferred_tensors(graph)
    return ModelFacts(
        need=onnx_graph.materialized_bytes(graph, tensors),
        steady=onnx_graph.shapes_static(graph, tensors),
        weight_bytes=onnx_graph.initializer_bytes(graph),
        internal_bytes=onnx_graph.peak_intermediate_bytes(graph, tensors),
    )


def runnable(path: Path | None, graph: onnx.ModelProto) -> tuple[str | bytes, dict[str, Affine]]:
    """What ONNX Runtime loads: the file itself (its bytes when `path` is None: the graph came from a
    virtual-board container), or, for a QDQ model whose outputs end in DequantizeLinear, the rewritten
    graph that returns them quantized (see qdq_outputs).
    Models with external data are loaded as they are (their bytes cannot move without the data)."""
    if path is not None and any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in graph.graph.initializer
    ):
        return str(path), {}
    if not has_quantized_outputs(graph):  # a float model is never copied: a copy is all its weights
        return (graph.SerializeToString() if path is None else str(path)), {}
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(graph)
    exposed = expose_quantized_outputs(rewritten)
    return rewritten.SerializeToString(), exposed


def dump_elem_types(dtypes: list[type]) -> frozenset[int]:
    """The ONNX element types of these numpy types: the tensors a dump can send."""
    return frozenset(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in dtypes)
