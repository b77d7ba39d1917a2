"""The contract's messages as plain Python, one dataclass per message, on both sides of the wire.

The daemon's runtimes, its frame intake and data plane, the client API and the accuracy and report
code all use these, under the message's own name and with the message's own field names; the
to/from-wire functions are in `convert`. This module imports no protobuf, so a runtime (or a board
image without the service layer) can use it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


class QuantType(str, enum.Enum):
    """How a tensor's stored integers map to real values (the contract's QuantType, same names)."""

    NONE = "none"
    AFFINE_ASYMMETRIC = "affine"  # real = (q - zero_point) * scale
    DFP = "dfp"  # real = q * 2^-fl


# Axis orders that turn 4-D data laid out as the first layout into the second.
PERMUTATIONS: dict[tuple[str, str], tuple[int, ...]] = {
    ("NHWC", "NCHW"): (0, 3, 1, 2),
    ("NCHW", "NHWC"): (0, 2, 3, 1),
}


def permutation(sent: str, wanted: str, rank: int) -> tuple[int, ...] | None:
    """The transpose that brings `rank`-D data laid out as `sent` into `wanted` (None: none needed)."""
    return PERMUTATIONS.get((sent, wanted)) if rank == 4 else None


def in_layout(shape: Sequence[int], sent: str, wanted: str) -> tuple[int, ...]:
    """`shape` of data laid out as `sent`, as it reads once the data is laid out as `wanted`."""
    order = permutation(sent, wanted, len(shape))
    return tuple(shape[i] for i in order) if order else tuple(shape)


@dataclass(frozen=True)
class TensorAttr:
    """One input or output of a model as its runtime holds it."""

    index: int
    name: str
    shape: tuple[int, ...]  # in `layout` order; <= 0 marks a dynamic dimension
    dtype: np.dtype
    layout: str = "UNDEFINED"  # "NCHW" | "NHWC" | "UNDEFINED"
    quant_type: QuantType = QuantType.NONE
    zero_point: int = 0
    scale: float = 1.0
    fl: int = 0
    # The daemon's side only, never on the wire: what a runtime converts itself for an input that is
    # not passed through (librknnrt quantizes float/uint8 data and takes NCHW or NHWC).
    convertible_dtypes: tuple[np.dtype, ...] = ()
    convertible_layouts: tuple[str, ...] = ()
    w_stride: int = 0  # librknnrt's row stride in elements (0: none given); the toolkit protocol reports it

    @property
    def is_dynamic(self) -> bool:
        return min(self.shape, default=1) <= 0

    @property
    def size_bytes(self) -> int:
        """Bytes of one tensor of this shape and dtype (0 when the shape is dynamic)."""
        return 0 if self.is_dynamic else math.prod(self.shape) * self.dtype.itemsize

    def fits(self, shape: Sequence[int]) -> bool:
        """Whether data of `shape` (in this tensor's layout) fits: same rank, every fixed dimension equal."""
        # A list, not a generator: this runs for every input of every frame.
        return len(shape) == len(self.shape) and all(
            [e <= 0 or e == a for e, a in zip(self.shape, shape, strict=True)]
        )

    def accepts(self, dtype: np.dtype, pass_through: bool) -> bool:
        """Whether data of `dtype` may feed this input; pass_through data must already be the model's."""
        return dtype == self.dtype or (not pass_through and dtype in self.convertible_dtypes)

    def takes_layout(self, layout: str, pass_through: bool) -> bool:
        """Whether the runtime takes this input's data laid out as `layout` without it being transposed
        first; pass_through data must already be in the model's layout."""
        return layout == self.layout or (not pass_through and layout in self.convertible_layouts)

    def real_values(self, array: np.ndarray) -> np.ndarray:
        """The float32 values of `array` when it holds this tensor's stored integers, else `array`."""
        return dequantize(array, self)


def is_native_quantized(array: np.ndarray, attr: TensorAttr) -> bool:
    """True when `array` holds a quantized tensor's stored integers rather than real values."""
    return attr.quant_type is not QuantType.NONE and array.dtype.kind in "iu"


def dequantize(array: np.ndarray, attr: TensorAttr) -> np.ndarray:
    """Stored integers to float32 real values: affine (q - zero_point) * scale, DFP q * 2^-fl; an array
    that holds no stored integers (float data, an unquantized tensor) is returned as it is.

    The arithmetic is ONNX DequantizeLinear's (int to float32, subtract, multiply in float32), so a
    daemon that sends int8 and a client that dequantizes give the float path's values bit for bit.
    """
    if not is_native_quantized(array, attr):
        return array
    values = array.astype(np.float32)
    if attr.quant_type is QuantType.AFFINE_ASYMMETRIC:
        values -= np.float32(attr.zero_point)
        values *= np.float32(attr.scale)
    else:
        values *= np.float32(2.0**-attr.fl)
    return values


def quantize(array: np.ndarray, attr: TensorAttr) -> np.ndarray:
    """Real values to the tensor's stored type, rounded half to even and saturated (the inverse of
    `dequantize`); unquantized or non-integer tensors are only cast."""
    if attr.quant_type is QuantType.NONE or attr.dtype.kind not in "iu":
        return array.astype(attr.dtype)
    values = array.astype(np.float32)
    if attr.quant_type is QuantType.AFFINE_ASYMMETRIC:
        values = np.round(values / np.float32(attr.scale)) + attr.zero_point
    else:
        values = np.round(values * np.float32(2.0**attr.fl))
    info = np.iinfo(attr.dtype)
    return np.clip(values, info.min, info.max).astype(attr.dtype)


def reply_bytes_bound(attrs: Sequence[TensorAttr], native: bool) -> int | None:
    """The most bytes a run's outputs take on the wire, known from the model alone (None when an
    output has a dynamic dimension): a quantized output counts as float32 unless sent native. The
    daemon refuses a unary Run over its limit before computing; the client picks Run or the stream."""
    total = 0
    for attr in attrs:
        if attr.is_dynamic:
            return None
        itemsize = attr.dtype.itemsize
        quantized = attr.quant_type is not QuantType.NONE and not native
        total += math.prod(attr.shape) * (max(itemsize, 4) if quantized else itemsize)
    return total


@dataclass(frozen=True)
class LayerPerf:
    """One row of the per-layer performance table."""

    index: int
    op_type: str
    data_type: str
    target: str
    input_shapes: tuple[str, ...]
    output_shape: str
    time_us: float
    name: str
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FrequencyList:
    """The current frequencies of one kind: "CPU" (kHz), "NPU" or "DDR" (Hz)."""

    kind: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class EvalPerfResponse:
    """A performance measurement: the per-layer table (perf_debug only), the totals, the frequencies."""

    layers: tuple[LayerPerf, ...]
    total_time_us: float
    total_rw_kb: float = 0.0
    frequencies: tuple[FrequencyList, ...] = ()
    frequencies_fixed: bool = False
    frequency_note: str = ""
    raw_text: str = ""
    extra_columns: tuple[str, ...] = ()
    # The layers' sum, computed: a field (not a property) so that asdict() reports it too.
    total_operator_time_us: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_operator_time_us", sum(layer.time_us for layer in self.layers))


@dataclass(frozen=True)
class EvalMemoryResponse:
    """Memory a runtime holds for one model, in bytes."""

    weight_memory: int
    internal_memory: int
    other_memory: int
    model_size: int
    method: str
    # The sum of the three, computed: a field (not a property) so that asdict() reports it too.
    total_memory: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "total_memory", self.weight_memory + self.internal_memory + self.other_memory
        )


@dataclass(frozen=True)
class LayerDump:
    """One captured layer tensor: a LayerDumpHeader's fields with the tensor its chunks carry."""

    index: int
    op_type: str
    node_name: str
    tensor_name: str
    array: np.ndarray
