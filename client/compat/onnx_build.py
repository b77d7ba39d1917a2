"""`load_onnx` + `config` + `build` for the host runtime: the ONNX model the daemon will run.

The toolkit bakes mean/std into the RKNN model, so at inference the user feeds raw images. Here
they become a Sub and a Div in front of each 4-D input (channel axis 1, as ONNX models are NCHW),
so the daemon receives raw pixels too. Input shapes from `input_size_list` and a cut at `outputs`
are applied the same way the toolkit applies them at load time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, utils


class BuildError(ValueError):
    """The model cannot be loaded or built as asked; the message says why."""


def _channel_values(values: Sequence[float], channels: int, what: str, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float32).reshape(-1)
    if array.size == 1:
        array = np.repeat(array, channels)
    if array.size != channels:
        raise BuildError(
            f"{what} for input {name!r} has {array.size} value(s); the input has {channels} channel(s)"
        )
    return array.reshape(1, channels, 1, 1)


def bake_normalization(
    model: onnx.ModelProto,
    mean_values: Sequence[Sequence[float]] | None,
    std_values: Sequence[Sequence[float]] | None,
) -> onnx.ModelProto:
    """Insert (x - mean) / std in front of each input that has mean/std values (toolkit contract:
    subtract mean, divide by std, no channel swap)."""
    if not mean_values and not std_values:
        return model
    graph = model.graph
    weights = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    means: list[Sequence[float] | None] = list(mean_values) if mean_values else [None] * len(inputs)
    stds: list[Sequence[float] | None] = list(std_values) if std_values else [None] * len(inputs)
    if len(means) != len(inputs) or len(stds) != len(inputs):
        raise BuildError(
            f"mean_values/std_values give {len(means)}/{len(stds)} list(s); the model has {len(inputs)} input(s)"
        )
    new_nodes = []
    for value, mean, std in zip(inputs, means, stds, strict=True):
        if mean is None and std is None:
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims) != 4 or not dims[1].HasField("dim_value"):
            raise BuildError(
                f"mean/std need a 4-D NCHW input with a known channel count; {value.name!r} is not"
            )
        channels = dims[1].dim_value
        mean_arr = _channel_values(mean if mean is not None else [0.0], channels, "mean_values", value.name)
        std_arr = _channel_values(std if std is not None else [1.0], channels, "std_values", value.name)
        if np.any(std_arr == 0):
            raise BuildError(f"std_values for input {value.name!r} contain 0; division by zero")
        normalized = f"{value.name}__rknn_normalized"
        for node in graph.node:
            node.input[:] = [normalized if n == value.name else n for n in node.input]
        for out in graph.output:
            if out.name == value.name:
                raise BuildError(f"input {value.name!r} is also a model output; cannot insert mean/std")
        graph.initializer.extend(
            [
                numpy_helper.from_array(mean_arr, f"{value.name}__rknn_mean"),
                numpy_helper.from_array(std_arr, f"{value.name}__rknn_std"),
            ]
        )
        new_nodes += [
            helper.make_node(
                "Sub",
                [value.name, f"{value.name}__rknn_mean"],
                [f"{value.name}__rknn_centered"],
                name=f"{value.name}__rknn_sub_mean",
            ),
            helper.make_node(
                "Div",
                [f"{value.name}__rknn_centered", f"{value.name}__rknn_std"],
                [normalized],
                name=f"{value.name}__rknn_div_std",
            ),
        ]
    nodes = [*new_nodes, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def set_input_shapes(
    model: onnx.ModelProto, names: Sequence[str] | None, sizes: Sequence[Sequence[int]]
) -> None:
    weights = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in weights]
    if names is not None:
        by_name = {i.name: i for i in inputs}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise BuildError(f"inputs {missing} are not in the model; its inputs are {sorted(by_name)}")
        inputs = [by_name[n] for n in names]
    if len(sizes) != len(inputs):
        raise BuildError(f"input_size_list has {len(sizes)} shape(s) for {len(inputs)} input(s)")
    for value, size in zip(inputs, sizes, strict=True):
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for d in size:
            dims.add().dim_value = int(d)


def load_and_build(
    model_path: Path,
    out_path: Path,
    *,
    inputs: Sequence[str] | None,
    input_size_list: Sequence[Sequence[int]] | None,
    outputs: Sequence[str] | None,
    mean_values: Sequence[Sequence[float]] | None,
    std_values: Sequence[Sequence[float]] | None,
) -> Path:
    """Write the host-runtime model for `model_path` to `out_path` (weights stay inside it)."""
    if not model_path.is_file():
        raise BuildError(f"model file {model_path} does not exist")
    try:
        model = onnx.load(str(model_path))
    except Exception as exc:
        raise BuildError(f"{model_path} is not a readable ONNX model: {exc}") from exc
    if input_size_list is not None:
        set_input_shapes(model, inputs, input_size_list)
    if outputs:
        known = {o for n in model.graph.node for o in n.output}
        missing = [o for o in outputs if o not in known]
        if missing:
            raise BuildError(f"outputs {missing} are not tensors of the model")
        input_names = (
            list(inputs)
            if inputs
            else [
                i.name for i in model.graph.input if i.name not in {w.name for w in model.graph.initializer}
            ]
        )
        extractor = utils.Extractor(model)
        model = extractor.extract_model(input_names, list(outputs))
    model = bake_normalization(model, mean_values, std_values)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise BuildError(f"the built model is not valid ONNX: {exc}") from exc
    onnx.save(model, str(out_path))
    return out_path
