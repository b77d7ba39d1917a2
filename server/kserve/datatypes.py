"""The v2 protocol's datatype names and the numpy dtypes the daemon's runtimes take.

A datatype without a numpy counterpart the wire codec carries (BYTES, BF16, UINT64) is refused with
a message naming the ones that work.
"""

from __future__ import annotations

import numpy as np

from rknn_server.errors import InvalidInput

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


__all__ = ["V2_DTYPES", "datatype_of", "dtype_of"]
