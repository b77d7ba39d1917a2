"""`load_onnx`'s options applied to the model: input shapes from `input_size_list` and a cut at
`outputs`, the way the toolkit applies them at load time. `build` then hands the result to the
accuracy engine (rknn_client.accuracy.build), which bakes mean/std in and quantizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import utils


class BuildError(ValueError):
    """The model cannot be loaded or built as asked; the message says why."""


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


def prepare_model(
    model_path: Path,
    *,
    inputs: Sequence[str] | None,
    input_size_list: Sequence[Sequence[int]] | None,
    outputs: Sequence[str] | None,
) -> onnx.ModelProto:
    """The loaded model with `load_onnx`'s options applied, checked to be valid ONNX."""
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
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise BuildError(f"the model is not valid ONNX: {exc}") from exc
    return model
