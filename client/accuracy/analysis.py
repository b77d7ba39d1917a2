"""`accuracy_analysis` as a library call: golden vs simulator (vs runtime), layer by layer.

golden = the float model, simulator = the quantized (QDQ) model, both run here with every layer
captured; runtime = per-layer tensors the daemon sent back (optional). Layers are matched by name
(see `layers` for what a layer is in a QDQ model). A runtime tensor is looked up first under the
simulator's value tensor name (a daemon running the same QDQ model dumps that), then under the layer
name (a board names tensors after the original model), and is compared in NCHW even if delivered NHWC.
Layers that exist on one side only are listed with empty columns, not fatal. Written under output_dir
in the toolkit's layout (see `report`): golden/, simulator/, runtime/ (with a runtime; matched tensors
in the golden layout, unmatched ones as delivered), map_name_to_file.txt and, last,
error_analysis.txt: a folder with that file is complete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from rknn_client.accuracy.capture import load_model, run_capture
from rknn_client.accuracy.compare import ErrorPair, align, compare
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.layers import ModelLayer, model_layers
from rknn_client.accuracy.preprocess import input_specs, load_input
from rknn_client.accuracy.report import (
    LayerLike,
    TableRow,
    format_table,
    remove_side,
    tensor_file_names,
    write_name_map,
    write_side,
    write_text_atomically,
)
from rknn_client.accuracy.single import SingleLayerRunner
from rknn_client.accuracy.steps import Advance, Steps, Written

REPORT_FILE = "error_analysis.txt"
MAP_FILE = "map_name_to_file.txt"

ModelSource = onnx.ModelProto | str | Path
InputSource = str | Path | np.ndarray


@dataclass(frozen=True)
class LayerRow:
    """One layer's line in both tables; a pair is None where a side lacks the layer or its inputs."""

    index: int
    op_type: str
    name: str
    sides: frozenset[str]
    entire: ErrorPair | None
    single: ErrorPair | None
    runtime_entire: ErrorPair | None
    single_sim: ErrorPair | None

    @property
    def label(self) -> str:
        return f"[{self.op_type}] {self.name}"


@dataclass(frozen=True)
class AnalysisResult:
    """Everything accuracy analysis found; `report` is the text the toolkit prints."""

    output_dir: Path
    rows: tuple[LayerRow, ...]
    has_runtime: bool
    only_runtime: tuple[str, ...]
    report: str
    written: Written  # what went into output_dir

    def row(self, name: str) -> LayerRow:
        """The row of the layer with this tensor name."""
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(name)


def prepare_output_dir(output_dir: Path) -> None:
    """Create output_dir and drop an earlier report: nothing claims completeness until the new one lands."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / REPORT_FILE).unlink(missing_ok=True)
        probe = output_dir / ".write_test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise AccuracyError(f"output_dir {output_dir} is not writable: {exc}") from exc


def _feeds(
    model: onnx.ModelProto, inputs: Sequence[InputSource] | Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Model inputs from file paths or arrays (one per input, in order) or a name->array mapping."""
    specs = input_specs(model)
    if isinstance(inputs, Mapping):
        return {spec.name: np.asarray(inputs[spec.name]) for spec in specs if spec.name in inputs}
    if len(inputs) != len(specs):
        raise AccuracyError(f"{len(inputs)} input(s) given, the model has {len(specs)} input(s)")
    return {
        spec.name: item if isinstance(item, np.ndarray) else load_input(item, spec)
        for item, spec in zip(inputs, specs, strict=True)
    }


def _runtime_values(
    sim_layers: Sequence[ModelLayer],
    simulator: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    runtime: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Runtime tensor per layer name, in the other sides' layout; layers it cannot match are absent."""
    found: dict[str, np.ndarray] = {}
    for layer in sim_layers:
        value = runtime.get(layer.value, runtime.get(layer.info.tensor_name))
        aligned = None if value is None else align(simulator[layer.value], value)
        if aligned is not None:
            found[layer.info.tensor_name] = aligned
    for name, reference in golden.items():
        if name not in found and name in runtime:
            aligned = align(reference, runtime[name])
            if aligned is not None:
                found[name] = aligned
    return found


@dataclass(frozen=True)
class _Sides:
    """Per layer name: each side's tensor and the single-layer outputs fed by golden and by runtime."""

    golden: dict[str, np.ndarray]
    simulator: dict[str, np.ndarray]
    single: dict[str, np.ndarray]
    runtime: dict[str, np.ndarray]
    single_runtime: dict[str, np.ndarray]

    def present(self, name: str) -> frozenset[str]:
        named = (("golden", self.golden), ("simulator", self.simulator), ("runtime", self.runtime))
        return frozenset(side for side, values in named if name in values)


def _pair(reference: np.ndarray | None, other: np.ndarray | None) -> ErrorPair | None:
    return None if reference is None or other is None else compare(reference, other)


def _rows(layers: Sequence[ModelLayer], sides: _Sides, advance: Advance) -> tuple[LayerRow, ...]:
    """One row per layer: golden's layers in order, then the simulator's that golden lacks."""
    rows = []
    for position, layer in enumerate(layers):
        name = layer.info.tensor_name
        reference = sides.golden.get(name)
        runtime = sides.runtime.get(name)
        rows.append(
            LayerRow(
                index=position,
                op_type=layer.info.op_type,
                name=name,
                sides=sides.present(name),
                entire=_pair(reference, sides.simulator.get(name)),
                single=_pair(reference, sides.single.get(name)),
                runtime_entire=_pair(reference, runtime),
                single_sim=_pair(sides.single_runtime.get(name), runtime),
            )
        )
        advance(1)
    return tuple(rows)


def analyse(
    float_model: ModelSource,
    quant_model: ModelSource,
    inputs: Sequence[InputSource] | Mapping[str, np.ndarray],
    output_dir: str | Path,
    runtime_layers: Iterable[tuple[LayerLike, np.ndarray]] | None = None,
    steps: Steps | None = None,
) -> AnalysisResult:
    """Compare the float and quantized models (and a runtime's dumps) layer by layer; write output_dir.
    `steps` shows each step's progress (default: none)."""
    steps = steps or Steps.quiet()
    golden_model, sim_model = load_model(float_model), load_model(quant_model)
    out = Path(output_dir)
    feeds = _feeds(golden_model, inputs)
    prepare_output_dir(out)

    golden_layers, sim_layers = model_layers(golden_model), model_layers(sim_model)
    with steps.step("golden: the float model", 1, "run") as advance:
        golden = {info.tensor_name: array for info, array in run_capture(golden_model, feeds)}
        advance(1)
    with steps.step("simulator: the quantized model", 1, "run") as advance:
        simulator = {info.tensor_name: array for info, array in run_capture(sim_model, feeds)}
        advance(1)
    delivered = None if runtime_layers is None else list(runtime_layers)

    golden_by_name = {layer.info.tensor_name: golden[layer.value] for layer in golden_layers}
    sim_by_name = {layer.info.tensor_name: simulator[layer.value] for layer in sim_layers}
    runtime: dict[str, np.ndarray] = {}
    only_runtime: dict[str, np.ndarray] = {}
    if delivered is not None:
        by_name = {info.tensor_name: np.asarray(array) for info, array in delivered}
        runtime = _runtime_values(sim_layers, simulator, golden_by_name, by_name)
        known = {*golden, *simulator, *(name for node in sim_model.graph.node for name in node.output)}
        only_runtime = {name: array for name, array in by_name.items() if name not in known}
    references = [golden_by_name] if delivered is None else [golden_by_name, runtime]
    with steps.step("single-layer runs", len(references), "run") as advance:
        runner = SingleLayerRunner(sim_model, sim_layers)
        singles = []
        for reference in references:
            singles.append(runner.run(reference).values)
            advance(1)
    sides = _Sides(
        golden=golden_by_name,
        simulator=sim_by_name,
        single=singles[0],
        runtime=runtime,
        single_runtime=singles[1] if delivered is not None else {},
    )
    sim_only = [layer for layer in sim_layers if layer.info.tensor_name not in golden_by_name]
    layers = [*golden_layers, *sim_only]
    with steps.step("comparing layers", len(layers)) as advance:
        rows = _rows(layers, sides, advance)

    files = tensor_file_names([*(row.name for row in rows), *only_runtime])
    written = Written()
    written_sides = [("golden", golden_by_name), ("simulator", sim_by_name)]
    if delivered is None:
        remove_side(out / "runtime")
    else:
        written_sides.append(("runtime", {**runtime, **only_runtime}))
    for side, tensors in written_sides:
        with steps.step(f"writing {side}/", len(tensors), "tensor") as advance:
            written += write_side(out / side, tensors, files, advance)
    write_name_map(out / MAP_FILE, files)
    table_rows = [
        TableRow(row.label, row.entire, row.single, row.runtime_entire, row.single_sim) for row in rows
    ]
    report = format_table(table_rows, with_runtime=delivered is not None)
    write_text_atomically(out / REPORT_FILE, report)
    written += Written.of(out / MAP_FILE, out / REPORT_FILE)
    return AnalysisResult(out, rows, delivered is not None, tuple(only_runtime), report, written)
