"""Between numpy arrays and the runtime's tensor descriptions: dtypes, layouts, quantization."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from rknn_proto.messages import QuantType, TensorAttr
from rknn_server.runtime.base import InputError, InputFormat
from rknn_server.runtime.rknnrt import abi
from rknn_server.runtime.rknnrt.abi import TensorFormat, TensorType

_DTYPES: dict[TensorType, np.dtype] = {
    TensorType.FLOAT32: np.dtype(np.float32),
    TensorType.FLOAT16: np.dtype(np.float16),
    TensorType.INT8: np.dtype(np.int8),
    TensorType.UINT8: np.dtype(np.uint8),
    TensorType.INT16: np.dtype(np.int16),
    TensorType.UINT16: np.dtype(np.uint16),
    TensorType.INT32: np.dtype(np.int32),
    TensorType.UINT32: np.dtype(np.uint32),
    TensorType.INT64: np.dtype(np.int64),
    TensorType.BOOL: np.dtype(np.bool_),
    TensorType.INT4: np.dtype(np.int8),
}
_TYPES_BY_DTYPE = {dtype: kind for kind, dtype in _DTYPES.items() if kind != TensorType.INT4}

# What the runtime converts (and quantizes) itself when an input is not passed through.
CONVERTIBLE_INPUT_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float16, np.int8, np.uint8, np.int16))
# The layouts the runtime takes 4-D data in (it is told which: rknn_input.fmt, or to_nhwc here).
CONVERTIBLE_INPUT_LAYOUTS = ("NCHW", "NHWC")


def numpy_dtype(kind: int) -> np.dtype:
    """The numpy type of a runtime tensor type (bfloat16 and unknown types are reported as float32)."""
    try:
        return _DTYPES.get(TensorType(kind), np.dtype(np.float32))
    except ValueError:
        return np.dtype(np.float32)


def tensor_type(dtype: np.dtype) -> TensorType | None:
    """The runtime tensor type of a numpy dtype (None when the runtime has no such type)."""
    return _TYPES_BY_DTYPE.get(np.dtype(dtype))


def runtime_type(array: np.ndarray) -> tuple[np.ndarray, TensorType]:
    """The array in a dtype the runtime takes, and that type (float64 travels as float32)."""
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
    kind = _TYPES_BY_DTYPE.get(array.dtype)
    if kind is None:
        raise InputError(f"input dtype {array.dtype} is not supported by the RKNN runtime")
    return array, kind


def attr_dims(attr: ctypes.Structure) -> tuple[int, ...]:
    return tuple(int(d) for d in attr.dims[: attr.n_dims])


def quant_type(code: int) -> QuantType:
    """The quantization kind of an rknn_tensor_qnt_type (the ABI's names are the contract's)."""
    try:
        return QuantType[abi.QuantType(code).name]
    except ValueError:
        return QuantType.NONE


def layout_name(fmt: int) -> str:
    if fmt in (TensorFormat.NCHW, TensorFormat.NHWC, TensorFormat.NC1HWC2):
        return TensorFormat(fmt).name
    return "UNDEFINED"


def tensor_attr(
    attr: ctypes.Structure, ranges: Sequence[tuple[int, ...]] = (), is_input: bool = False
) -> TensorAttr:
    """A TensorAttr from the runtime's; dims that differ across a dynamic input's shapes become -1."""
    shape = attr_dims(attr)
    if ranges:
        shape = tuple(-1 if len({r[i] for r in ranges}) > 1 else ranges[0][i] for i in range(len(ranges[0])))
    return TensorAttr(
        index=int(attr.index),
        name=attr.name.decode(errors="replace"),
        shape=shape,
        dtype=numpy_dtype(attr.type),
        layout=layout_name(attr.fmt),
        quant_type=quant_type(attr.qnt_type),
        zero_point=int(attr.zp),
        scale=float(attr.scale),
        fl=int(attr.fl),
        convertible_dtypes=CONVERTIBLE_INPUT_DTYPES if is_input else (),
        convertible_layouts=CONVERTIBLE_INPUT_LAYOUTS if is_input and len(shape) == 4 else (),
        w_stride=int(attr.w_stride),
    )


def runtime_shape(array: np.ndarray, fmt: InputFormat) -> tuple[int, ...]:
    """The shape the runtime sees: 4-D inputs are described in NHWC order."""
    if array.ndim == 4 and fmt.layout.upper() == "NCHW" and not fmt.pass_through:
        n, c, h, w = array.shape
        return (n, h, w, c)
    return tuple(array.shape)


def to_nhwc(array: np.ndarray, fmt: InputFormat) -> np.ndarray:
    if array.ndim == 4 and fmt.layout.upper() == "NCHW" and not fmt.pass_through:
        return np.ascontiguousarray(array.transpose(0, 2, 3, 1))
    return array


def travels_quantized(attr: ctypes.Structure) -> bool:
    """An affine 8-bit output: fetched as its stored integers (want_float=0) so that it can cross
    the wire at a quarter of the bytes; the daemon or the client dequantizes it."""
    return attr.qnt_type == abi.QuantType.AFFINE_ASYMMETRIC and attr.type in (
        TensorType.INT8,
        TensorType.UINT8,
    )


def nc1hwc2_to_nchw(array: np.ndarray, channels: int) -> np.ndarray:
    """(N, C1, H, W, C2) -> (N, C, H, W), dropping the padding channels of the last block."""
    n, c1, h, w, c2 = array.shape
    return np.ascontiguousarray(array.transpose(0, 1, 4, 2, 3).reshape(n, c1 * c2, h, w)[:, :channels])


def native_to_model_layout(
    array: np.ndarray, native: ctypes.Structure, model: ctypes.Structure
) -> np.ndarray:
    """A native (zero-copy) output in the layout of the model's own output attr."""
    dims = attr_dims(model)
    if native.fmt == TensorFormat.NC1HWC2 and len(dims) == 4:
        nchw = nc1hwc2_to_nchw(array.reshape(attr_dims(native)), dims[1])
        return nchw if model.fmt != TensorFormat.NHWC else np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))
    if native.fmt == TensorFormat.NHWC and model.fmt == TensorFormat.NCHW and len(dims) == 4:
        n, c, h, w = dims
        return np.ascontiguousarray(array.reshape(n, h, w, c).transpose(0, 3, 1, 2))
    return array.reshape(dims)
