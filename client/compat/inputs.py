"""The toolkit's input rules, applied before the strict API sees the arrays.

- a bare ndarray is one input (not a list of its rows);
- `data_format` None means NHWC (for an NCHW model, NCHW for an array of its own shape; an array that
  does not fit is refused naming both shapes); a string applies to every input, a list gives one per input; any case;
- a 3-D image for a 4-D input gains its batch dimension;
- inputs are cast to the model's input dtype (a uint8 image into a float model), as the toolkit does;
  a quantized input takes real values (float or uint8 data), which the runtime quantizes itself, so
  only types the runtime cannot read are cast, to float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rknn_client.frame_spec import FrameSpec
from rknn_proto.messages import QuantType, TensorAttr, in_layout

FORMATS = ("nhwc", "nchw")
FORMATS_4D = tuple(f.upper() for f in FORMATS)
# What librknnrt reads (and quantizes) itself for a quantized input (rknn_input.type).
RUNTIME_INPUT_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float16, np.int8, np.uint8, np.int16))


class InputRuleError(ValueError):
    """Inputs that even the toolkit's rules cannot fit to the model."""


@dataclass(frozen=True)
class PreparedInputs:
    """The frame the rules made (its dtype left to the daemon's intake) and what they noted."""

    frame: FrameSpec
    notes: list[str]


def as_input_list(inputs: Any) -> list[Any]:
    if isinstance(inputs, np.ndarray):
        return [inputs]
    if isinstance(inputs, (list, tuple)):
        return list(inputs)
    raise InputRuleError(f"inputs must be a list of numpy arrays (or one array), not {type(inputs).__name__}")


def formats_for(data_format: str | Sequence[str] | None, count: int) -> list[str]:
    if data_format is None:
        return ["nhwc"] * count
    names = [data_format] * count if isinstance(data_format, str) else list(data_format)
    if len(names) != count:
        raise InputRuleError(f"data_format lists {len(names)} format(s) for {count} input(s)")
    lowered = [str(n).lower() for n in names]
    for n in lowered:
        if n not in FORMATS:
            raise InputRuleError(f"data_format {n!r} is not supported; expected 'nhwc' or 'nchw'")
    return lowered


def _send_dtype(spec: TensorAttr, dtype: np.dtype) -> np.dtype:
    if spec.quant_type is QuantType.NONE:
        return spec.dtype
    return dtype if dtype in RUNTIME_INPUT_DTYPES else np.dtype(np.float32)


def _guessed_layout(shape: tuple[int, ...], spec: TensorAttr, notes: list[str]) -> str:
    """The layout of a 4-D array given without data_format: NHWC (the toolkit's default) when its shape
    fits the model's input so; for an NCHW model, NCHW when it has the model's own shape (with a note).
    Any other array is refused here, naming both shapes: the daemon would call it NHWC, the layout it
    merely defaulted to. An NHWC model (a board's .rknn) takes an NCHW array only with
    data_format='nchw', as the toolkit does."""
    if spec.fits(in_layout(shape, "NHWC", spec.layout)):
        return "NHWC"
    fits_nchw = spec.fits(in_layout(shape, "NCHW", spec.layout))
    if fits_nchw and spec.layout == "NCHW":
        notes.append(f"input {spec.index} ({spec.name}) has the model's NCHW shape; sent as NCHW")
        return "NCHW"
    nhwc, nchw = (list(in_layout(spec.shape, spec.layout, wanted)) for wanted in FORMATS_4D)
    if fits_nchw:
        raise InputRuleError(
            f"input {spec.index} ({spec.name}) has shape {list(shape)}, the model's input as NCHW {nchw}, "
            f"but data_format defaults to NHWC, where the model expects {nhwc}: pass data_format='nchw'"
        )
    raise InputRuleError(
        f"input {spec.index} ({spec.name}) has shape {list(shape)}, which fits the model's input in neither "
        f"layout: it expects {nhwc} as NHWC (the default data_format) or {nchw} as NCHW"
    )


def prepare(
    inputs: Any,
    specs: Sequence[TensorAttr],
    data_format: str | Sequence[str] | None,
    pass_through: Sequence[int] | None,
) -> PreparedInputs:
    arrays = [np.asarray(a) for a in as_input_list(inputs)]
    if len(arrays) != len(specs):
        raise InputRuleError(
            f"the model has {len(specs)} input(s) ({', '.join(s.name for s in specs)}); {len(arrays)} were given"
        )
    formats = formats_for(data_format, len(arrays))
    through = [bool(p) for p in pass_through] if pass_through is not None else [False] * len(arrays)
    if len(through) != len(arrays):
        raise InputRuleError(f"inputs_pass_through lists {len(through)} value(s) for {len(arrays)} input(s)")
    prepared: list[np.ndarray] = []
    layouts: list[str] = []
    notes: list[str] = []
    for array, spec, fmt in zip(arrays, specs, formats, strict=True):
        if len(spec.shape) == 4 and array.ndim == 3:
            array = array[np.newaxis, ...]
        layout = spec.layout
        if len(spec.shape) == 4 and array.ndim == 4 and spec.layout in FORMATS_4D:
            layout = fmt.upper() if data_format is not None else _guessed_layout(array.shape, spec, notes)
        if not through[spec.index] and array.dtype != spec.dtype:
            array = array.astype(_send_dtype(spec, array.dtype))
        prepared.append(array)
        layouts.append(layout)
    return PreparedInputs(FrameSpec(prepared, layouts, through, strict=False), notes)
