"""Single-layer runs: each layer alone, fed with a reference's values of the layers it reads.

For layer L the runner cuts from the model the nodes that compute L's value from the `raw` tensors of
other layers (graph inputs included), walking backwards from `L.value` and stopping at those tensors;
weights come along as initializers. In a QDQ model the cut therefore starts at the previous layers'
float outputs and contains their QuantizeLinear/DequantizeLinear: a float reference is quantized the
way the simulator would quantize it, and a reference that already holds dequantized values (a runtime
dump) passes through unchanged. Fed with golden values this gives `simulator_error.single`; fed with
runtime values and compared to the runtime it gives `runtime_error.single_sim`.

All the cuts run side by side in one model and one ONNX Runtime session (each cut's own tensors
renamed `<name>#<cut>`, the layers it reads and the weights shared): a session per layer cost more
to create and to start than the layers cost to compute. A cut that fails alone is found by running
the cuts one by one only when the combined run fails.
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

SEPARATOR = "#"


@dataclass(frozen=True)
class _LayerCut:
    """The nodes that compute one layer; `feeds` maps the tensors they read to the layers feeding them."""

    layer: ModelLayer
    feeds: dict[str, str]
    nodes: tuple[onnx.NodeProto, ...]
    initializers: frozenset[str]

    def renamed_nodes(self, suffix: str) -> list[onnx.NodeProto]:
        """The cut's nodes with the tensors it computes renamed, so that cuts can share one graph."""
        shared = {*self.feeds, *self.initializers, ""}
        copies = []
        for node in self.nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name}{suffix}"
            copy.input[:] = [name if name in shared else f"{name}{suffix}" for name in node.input]
            copy.output[:] = [name if name == "" else f"{name}{suffix}" for name in node.output]
            copies.append(copy)
        return copies


@dataclass(frozen=True)
class SingleResult:
    """Per layer name: its single-layer output, or why there is none."""

    values: dict[str, np.ndarray]
    skipped: dict[str, str]


class SingleLayerRunner:
    """Cuts one small graph per layer once, then runs them (together) for as many references as needed."""

    def __init__(self, model: onnx.ModelProto, layers: Sequence[ModelLayer]) -> None:
        self._model = model
        self._types = tensor_types(model)
        graph = model.graph
        self._producers = {
            name: index for index, node in enumerate(graph.node) for name in node.output if name
        }
        self._initializers = {init.name: init for init in graph.initializer}
        self._cuts: dict[str, _LayerCut | str] = {}
        for layer in layers:
            try:
                self._cuts[layer.info.tensor_name] = self._cut(layers, layer)
            except AccuracyError as exc:
                self._cuts[layer.info.tensor_name] = str(exc)
        self._sessions: dict[frozenset[str], ort.InferenceSession] = {}

    def _cut(self, layers: Sequence[ModelLayer], layer: ModelLayer) -> _LayerCut:
        graph = self._model.graph
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
            elif tensor in self._initializers:
                used_initializers.add(tensor)
            elif tensor in self._producers:
                node_indices.add(self._producers[tensor])
                pending.extend(graph.node[self._producers[tensor]].input)
            elif tensor in sources:
                feeds[tensor] = sources[tensor]
            else:
                raise AccuracyError(f"layer {layer.info.tensor_name} reads {tensor}, which nothing produces")
        nodes = tuple(graph.node[index] for index in sorted(node_indices))
        return _LayerCut(layer, feeds, nodes, frozenset(used_initializers))

    def _session(self, names: Sequence[str]) -> ort.InferenceSession:
        """One session computing the cuts of `names` side by side (made once per set of cuts)."""
        key = frozenset(names)
        if key not in self._sessions:
            cuts = [cut for name in names if isinstance(cut := self._cuts[name], _LayerCut)]
            feeds = sorted({tensor for cut in cuts for tensor in cut.feeds})
            weights = sorted({name for cut in cuts for name in cut.initializers})
            graph = onnx.helper.make_graph(
                [node for index, cut in enumerate(cuts) for node in cut.renamed_nodes(f"{SEPARATOR}{index}")],
                "single_layers",
                [onnx.helper.make_tensor_value_info(name, self._types[name], None) for name in feeds],
                [
                    onnx.helper.make_tensor_value_info(
                        f"{cut.layer.value}{SEPARATOR}{index}", self._types[cut.layer.value], None
                    )
                    for index, cut in enumerate(cuts)
                ],
                [self._initializers[name] for name in weights],
            )
            combined = onnx.helper.make_model(graph, opset_imports=list(self._model.opset_import))
            combined.ir_version = self._model.ir_version
            combined.functions.extend(self._model.functions)
            self._sessions[key] = open_session(combined)
        return self._sessions[key]

    def _feeds(self, cuts: Sequence[_LayerCut], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The cuts' input tensors, taken from the reference and cast to the model's types."""
        dtype = onnx.helper.tensor_dtype_to_np_dtype
        return {
            tensor: np.asarray(reference[source], dtype(self._types[tensor]))
            for cut in cuts
            for tensor, source in cut.feeds.items()
        }

    def _run(self, names: Sequence[str], reference: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        cuts = [cut for name in names if isinstance(cut := self._cuts[name], _LayerCut)]
        outputs = [f"{cut.layer.value}{SEPARATOR}{index}" for index, cut in enumerate(cuts)]
        return run_session(self._session(names), self._feeds(cuts, reference), outputs)

    def run(self, reference: Mapping[str, np.ndarray]) -> SingleResult:
        """Each layer's output when it alone runs on `reference` (keyed by layer name)."""
        values: dict[str, np.ndarray] = {}
        skipped: dict[str, str] = {}
        runnable: list[str] = []
        for name, cut in self._cuts.items():
            if isinstance(cut, str):
                skipped[name] = cut
                continue
            missing = sorted({source for source in cut.feeds.values() if source not in reference})
            if missing:
                skipped[name] = f"no reference value for {', '.join(missing)}"
            elif not cut.nodes:  # the layer is what it reads (a graph input): its reference value
                values[name] = self._feeds([cut], reference)[cut.layer.value]
            else:
                runnable.append(name)
        if not runnable:
            return SingleResult(values, skipped)
        try:
            values.update(zip(runnable, self._run(runnable, reference), strict=True))
        except AccuracyError:  # some cut cannot run: find which, one at a time
            for name in runnable:
                try:
                    values[name] = self._run([name], reference)[0]
                except AccuracyError as exc:
                    skipped[name] = str(exc)
        return SingleResult(values, skipped)
