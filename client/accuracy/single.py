"""Single-layer runs: each layer alone, fed with a reference's values of the layers it reads.

For layer L the runner cuts from the model the nodes that compute L's value from the `raw` tensors of
other layers (graph inputs included), walking backwards from `L.value` and stopping at those tensors;
weights come along as initializers. In a QDQ model the cut therefore starts at the previous layers'
float outputs and contains their QuantizeLinear/DequantizeLinear: a float reference is quantized the
way the simulator would quantize it, and a reference that already holds dequantized values (a runtime
dump) passes through unchanged. Fed with golden values this gives `simulator_error.single`; fed with
runtime values and compared to the runtime it gives `runtime_error.single_sim`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from rknn_client.accuracy.capture import tensor_types
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.layers import ModelLayer
from rknn_client.accuracy.session import open_session, run_session


@dataclass(frozen=True)
class _LayerCut:
    """The part of the model that computes one layer; `feeds` maps its inputs to the layers feeding them."""

    layer: ModelLayer
    feeds: dict[str, str]
    dtypes: dict[str, np.dtype]
    session: ort.InferenceSession | None

    def inputs(self, reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The cut's input tensors, taken from the reference and cast to the model's types."""
        feeds = self.feeds.items()
        return {tensor: np.asarray(reference[source], self.dtypes[tensor]) for tensor, source in feeds}


@dataclass(frozen=True)
class SingleResult:
    """Per layer name: its single-layer output, or why there is none."""

    values: dict[str, np.ndarray]
    skipped: dict[str, str]


class SingleLayerRunner:
    """Builds one small model per layer once, then runs them for as many references as needed."""

    def __init__(self, model: onnx.ModelProto, layers: Sequence[ModelLayer]) -> None:
        self._types = tensor_types(model)
        self._cuts: dict[str, _LayerCut | str] = {}
        for layer in layers:
            try:
                self._cuts[layer.info.tensor_name] = self._cut(model, layers, layer)
            except AccuracyError as exc:
                self._cuts[layer.info.tensor_name] = str(exc)

    def _cut(self, model: onnx.ModelProto, layers: Sequence[ModelLayer], layer: ModelLayer) -> _LayerCut:
        graph = model.graph
        producers = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
        initializers = {init.name: init for init in graph.initializer}
        stops = {other.raw: other.info.tensor_name for other in layers if other is not layer}
        sources = {other.raw: other.info.tensor_name for other in layers}
        feeds: dict[str, str] = {}
        node_indices: set[int] = set()
        used_initializers: set[str] = set()
        pending, seen = [layer.value], set()
        while pending:
            tensor = pending.pop()
            if not tensor or tensor in seen:
                continue
            seen.add(tensor)
            if tensor in stops:
                feeds[tensor] = stops[tensor]
            elif tensor in initializers:
                used_initializers.add(tensor)
            elif tensor in producers:
                node_indices.add(producers[tensor])
                pending.extend(graph.node[producers[tensor]].input)
            elif tensor in sources:
                feeds[tensor] = sources[tensor]
            else:
                raise AccuracyError(f"layer {layer.info.tensor_name} reads {tensor}, which nothing produces")
        dtypes = {name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self._types[name])) for name in feeds}
        if not node_indices:
            return _LayerCut(layer, feeds, dtypes, None)
        sub_graph = onnx.helper.make_graph(
            [graph.node[index] for index in sorted(node_indices)],
            f"single_{layer.info.index}",
            [onnx.helper.make_tensor_value_info(name, self._types[name], None) for name in sorted(feeds)],
            [onnx.helper.make_tensor_value_info(layer.value, self._types[layer.value], None)],
            [initializers[name] for name in sorted(used_initializers)],
        )
        sub_model = onnx.helper.make_model(sub_graph, opset_imports=list(model.opset_import))
        sub_model.ir_version = model.ir_version
        sub_model.functions.extend(model.functions)
        return _LayerCut(layer, feeds, dtypes, open_session(sub_model))

    def run(self, reference: Mapping[str, np.ndarray]) -> SingleResult:
        """Each layer's output when it alone runs on `reference` (keyed by layer name)."""
        values: dict[str, np.ndarray] = {}
        skipped: dict[str, str] = {}
        for name, cut in self._cuts.items():
            if isinstance(cut, str):
                skipped[name] = cut
                continue
            missing = sorted({source for source in cut.feeds.values() if source not in reference})
            if missing:
                skipped[name] = f"no reference value for {', '.join(missing)}"
                continue
            feeds = cut.inputs(reference)
            if cut.session is None:
                values[name] = feeds[cut.layer.value]
                continue
            try:
                values[name] = run_session(cut.session, feeds, [cut.layer.value])[0]
            except AccuracyError as exc:
                skipped[name] = str(exc)
        return SingleResult(values, skipped)
