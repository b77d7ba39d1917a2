"""`accuracy_analysis` as a library call: golden vs simulator (vs runtime), layer by layer.

golden = the float model, simulator = the quantized (QDQ) model, both run here with every layer
captured; runtime = per-layer tensors the daemon sent back (optional). Layers are matched by name
(see `layers` for what a layer is in a QDQ model). A runtime tensor is looked up first under the
simulator's value tensor name (a daemon running the same QDQ model dumps that), then under the layer
name (a board names tensors after the original model), and is compared in NCHW even if delivered NHWC.
Layers that exist on one side only are listed, not fatal. Written under output_dir: golden/,
simulator/, runtime/ (with a runtime) and, last, error_analysis.txt: a folder with that file is complete.
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
    RUNTIME_TABLE,
    SIMULATOR_TABLE,
    LayerLike,
    TableRow,
    format_table,
    remove_layers,
    write_layers,
    write_text_atomically,
)
from rknn_client.accuracy.single import SingleLayerRunner

REPORT_FILE = "error_analysis.txt"
FORMULAS = (
    "# cos = sum(a*b) / (||a|| * ||b||), euc = ||a - b|| = sqrt(sum((a - b)^2)),",
    "# over the flattened tensors in float64 (cos is 1.0 when both are all zero).",
)

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


def _rows(layers: Sequence[ModelLayer], sides: _Sides) -> tuple[LayerRow, ...]:
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
    return tuple(rows)


def _notes(rows: Sequence[LayerRow], only_runtime: Sequence[str], has_runtime: bool) -> str:
    """Formulas and one-sided layers, for error_analysis.txt."""
    lines = ["", *FORMULAS]
    golden_only = [row.name for row in rows if "golden" in row.sides and "simulator" not in row.sides]
    simulator_only = [row.name for row in rows if "golden" not in row.sides]
    if golden_only:
        lines.append("# only in golden (fused or removed in the quantized model): " + ", ".join(golden_only))
    if simulator_only:
        lines.append("# only in simulator: " + ", ".join(simulator_only))
    if has_runtime:
        missing = [row.name for row in rows if "runtime" not in row.sides]
        if missing:
            lines.append("# not matched in runtime: " + ", ".join(missing))
        if only_runtime:
            lines.append("# only in runtime: " + ", ".join(only_runtime))
    return "\n".join(lines) + "\n"


def analyse(
    float_model: ModelSource,
    quant_model: ModelSource,
    inputs: Sequence[InputSource] | Mapping[str, np.ndarray],
    output_dir: str | Path,
    runtime_layers: Iterable[tuple[LayerLike, np.ndarray]] | None = None,
) -> AnalysisResult:
    """Compare the float and quantized models (and a runtime's dumps) layer by layer; write output_dir."""
    golden_model, sim_model = load_model(float_model), load_model(quant_model)
    out = Path(output_dir)
    feeds = _feeds(golden_model, inputs)
    prepare_output_dir(out)

    golden_layers, sim_layers = model_layers(golden_model), model_layers(sim_model)
    golden = {info.tensor_name: array for info, array in run_capture(golden_model, feeds)}
    simulator = {info.tensor_name: array for info, array in run_capture(sim_model, feeds)}
    write_layers(out / "golden", [(layer.info, golden[layer.value]) for layer in golden_layers])
    write_layers(out / "simulator", [(layer.info, simulator[layer.value]) for layer in sim_layers])
    delivered = None if runtime_layers is None else list(runtime_layers)
    if delivered is None:
        remove_layers(out / "runtime")
    else:
        write_layers(out / "runtime", delivered)

    golden_by_name = {layer.info.tensor_name: golden[layer.value] for layer in golden_layers}
    runner = SingleLayerRunner(sim_model, sim_layers)
    runtime: dict[str, np.ndarray] = {}
    only_runtime: tuple[str, ...] = ()
    if delivered is not None:
        by_name = {info.tensor_name: np.asarray(array) for info, array in delivered}
        runtime = _runtime_values(sim_layers, simulator, golden_by_name, by_name)
        known = {*golden, *simulator, *(name for node in sim_model.graph.node for name in node.output)}
        only_runtime = tuple(name for name in by_name if name not in known)
    sides = _Sides(
        golden=golden_by_name,
        simulator={layer.info.tensor_name: simulator[layer.value] for layer in sim_layers},
        single=runner.run(golden_by_name).values,
        runtime=runtime,
        single_runtime=runner.run(runtime).values if delivered is not None else {},
    )
    sim_only = [layer for layer in sim_layers if layer.info.tensor_name not in golden_by_name]
    row_layers = [*golden_layers, *sim_only]
    rows = _rows(row_layers, sides)
    report = format_table(SIMULATOR_TABLE, [TableRow(row.label, row.entire, row.single) for row in rows])
    if delivered is not None:
        runtime_rows = [TableRow(row.label, row.runtime_entire, row.single_sim) for row in rows]
        report += "\n" + format_table(RUNTIME_TABLE, runtime_rows)
    write_text_atomically(out / REPORT_FILE, report + _notes(rows, only_runtime, delivered is not None))
    return AnalysisResult(out, rows, delivered is not None, only_runtime, report)
