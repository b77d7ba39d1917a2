"""The v2 protocol's datatype names and the numpy dtypes the daemon's runtimes take, what an
element of each takes as JSON, and whether a shape can be a tensor at all.

A datatype without a numpy counterpart the wire codec carries (BYTES, BF16, UINT64) is refused with
a message naming the ones that work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Protocol

import numpy as np

from rknn_server.errors import InvalidInput
from rknn_server.kit.replies import Sized

V2_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
# The most bytes one element takes as JSON text, its separating comma included: "-2147483648," for
# INT32; a float is written as Python's repr of a double, at most "-2.2250738585072014e-308," (NaN
# and -Infinity, as json.dumps writes them, are shorter).
JSON_ELEMENT_BYTES: dict[str, int] = {
    "BOOL": len("false,"),
    "UINT8": len("255,"),
    "UINT16": len("65535,"),
    "UINT32": len("4294967295,"),
    "INT8": len("-128,"),
    "INT16": len("-32768,"),
    "INT32": len("-2147483648,"),
    "INT64": len("-9223372036854775808,"),
    "FP16": len("-2.2250738585072014e-308,"),
    "FP32": len("-2.2250738585072014e-308,"),
    "FP64": len("-2.2250738585072014e-308,"),
}
INT64_MAX = (1 << 63) - 1
_NAMES = {(dtype.kind, dtype.itemsize): name for name, dtype in V2_DTYPES.items()}
_REFUSED = {
    "BYTES": "BYTES (string) tensors are not supported: the daemon's runtimes take numeric tensors",
    "BF16": "BF16 tensors are not supported (no runtime of this daemon takes bfloat16)",
    "UINT64": "UINT64 tensors are not supported (no runtime of this daemon takes them)",
}


def dtype_of(datatype: str, what: str) -> np.dtype:
    """The numpy dtype of a v2 datatype name; InvalidInput naming the known ones otherwise."""
    dtype = V2_DTYPES.get(datatype)
    if dtype is not None:
        return dtype
    known = ", ".join(V2_DTYPES)
    reason = _REFUSED.get(datatype, f"{datatype[:32]!r} is not a v2 datatype")
    raise InvalidInput(f"{what}: {reason}; expected one of {known}")


def datatype_of(dtype: np.dtype) -> str:
    """The v2 name of a numpy dtype the runtimes use."""
    name = _NAMES.get((dtype.kind, dtype.itemsize))
    if name is None:
        raise ValueError(f"dtype {dtype} has no v2 datatype")
    return name


def checked_shape(dims: Sequence[int], dtype: np.dtype, what: str) -> tuple[int, ...]:
    """A shape whose dimensions and byte count fit a signed 64-bit integer (the wire's, numpy's);
    InvalidInput naming it otherwise, before anything multiplies it into a byte count. A negative
    dimension is left to the tensor limits' check, which names it."""
    shape = tuple(map(int, dims))
    elements = math.prod([max(d, 0) for d in shape])
    if max(map(abs, shape), default=0) > INT64_MAX or elements * dtype.itemsize > INT64_MAX:
        raise InvalidInput(
            f"{what}: shape {list(shape)} is no tensor: its dimensions and its size in bytes "
            f"({dtype.itemsize} per element) must fit a 64-bit integer (at most {INT64_MAX}); "
            "expected the model's shape"
        )
    return shape


class Described(Protocol):
    """A tensor as v2 names it: a model's output metadata, or an output that exists."""

    @property
    def name(self) -> str: ...

    @property
    def datatype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


def reply_sizes(
    tensors: Iterable[Described],
    requested: Collection[str] = (),
    as_json: Callable[[str], bool] = lambda name: False,
) -> list[Sized]:
    """The outputs of a v2 reply (those `requested`, all when empty) in the encoding each goes back
    in, JSON where `as_json(name)` says, else raw bytes: what the reply rule weighs."""
    return [
        Sized(
            t.name,
            t.datatype,
            t.shape,
            V2_DTYPES[t.datatype].itemsize,
            JSON_ELEMENT_BYTES[t.datatype] if as_json(t.name) else 0,
        )
        for t in tensors
        if not requested or t.name in requested
    ]


__all__ = [
    "INT64_MAX",
    "JSON_ELEMENT_BYTES",
    "V2_DTYPES",
    "Described",
    "checked_shape",
    "datatype_of",
    "dtype_of",
    "reply_sizes",
]
