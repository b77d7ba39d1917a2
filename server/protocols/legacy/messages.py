"""The bodies of the legacy messages: tensor descriptions out, inputs in, outputs out.

The toolkit describes tensors with librknnrt's enums (rknn_tensor_type, rknn_tensor_format,
rknn_tensor_qnt_type), so the codes here are the runtime ABI's own. Every count, size and offset the
client sends is checked against the message it came in before any array is made; arrays are views of
the received bytes, never copies.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np
import structlog

from rknn_proto.codec import TensorLimits
from rknn_proto.messages import TensorAttr, in_layout, quantize
from rknn_server.core.frames import Declared, take_arrays
from rknn_server.errors import InvalidInput, ResourceExhausted
from rknn_server.protocols.legacy import layouts
from rknn_server.protocols.legacy.layouts import Layout
from rknn_server.runtime.base import InputFormat, InputShapes
from rknn_server.runtime.rknnrt.abi import QuantType, TensorFormat, TensorType
from rknn_server.runtime.rknnrt.tensors import numpy_dtype, tensor_type

_FORMATS = {"NCHW": TensorFormat.NCHW, "NHWC": TensorFormat.NHWC}
_TYPE_CODES = frozenset(int(t) for t in TensorType)
_LAYOUT_NAMES = {int(code): name for name, code in _FORMATS.items()}
log = structlog.get_logger("rknn_server.legacy")


class InputMismatch(InvalidInput):
    """Inputs that contradict the model as MODEL_INFO described it (count, type, too few bytes): what
    librknnrt's rknn_inputs_set refuses, and the toolkit checks before it sends any."""


def _check_count(specs: Sequence[TensorAttr], what: str, layout: Layout) -> None:
    if len(specs) > layout.max_tensors:
        raise ResourceExhausted(
            f"the model has {len(specs)} {what}s; the toolkit's protocol carries at most {layout.max_tensors}"
        )


def _dims(spec: TensorAttr) -> list[int]:
    """The dims the protocol carries (a dynamic dimension as 0), at most MAX_DIMS of them."""
    if len(spec.shape) > layouts.MAX_DIMS:
        raise ResourceExhausted(
            f"tensor {spec.name!r} has {len(spec.shape)} dims; at most {layouts.MAX_DIMS}"
        )
    return [max(d, 0) for d in spec.shape]


def _pack_name(message: bytearray, at: int, name: str) -> None:
    data = name.encode("utf-8", "replace")[: layouts.NAME_BYTES - 1]
    message[at : at + len(data)] = data


def _pack_record(message: bytearray, at: int, spec: TensorAttr) -> None:
    dims = _dims(spec)
    _pack_name(message, at, spec.name)
    message[at + layouts.N_DIMS_AT] = len(dims)
    struct.pack_into(f"<{len(dims)}I", message, at + layouts.DIMS_AT, *dims)
    kind = tensor_type(spec.dtype)
    message[at + layouts.FORMAT_AT] = _FORMATS.get(spec.layout.upper(), TensorFormat.UNDEFINED)
    message[at + layouts.TYPE_AT] = TensorType.FLOAT32 if kind is None else kind
    message[at + layouts.QUANT_AT] = QuantType[spec.quant_type.name]  # the ABI's names are the contract's
    struct.pack_into("<b", message, at + layouts.FL_AT, spec.fl)
    struct.pack_into("<if", message, at + layouts.ZERO_POINT_AT, spec.zero_point, spec.scale)
    # w_stride as the runtime gives it, as the real server sends it; size_with_stride: the runtime
    # interface has the tensor's size only (the toolkit reads neither).
    struct.pack_into("<II", message, at + layouts.W_STRIDE_AT, spec.w_stride, spec.size_bytes)


def pack_model_info(
    message: bytearray, layout: Layout, inputs: Sequence[TensorAttr], outputs: Sequence[TensorAttr]
) -> None:
    """Fill a MODEL_INFO ack's data with the model's input and output records."""
    _check_count(inputs, "input", layout)
    _check_count(outputs, "output", layout)
    struct.pack_into("<I", message, layout.n_input_at, len(inputs))
    for i, spec in enumerate(inputs):
        _pack_record(message, layout.inputs_at + i * layout.record_bytes, spec)
    struct.pack_into("<I", message, layout.n_output_at, len(outputs))
    for i, spec in enumerate(outputs):
        _pack_record(message, layout.outputs_at + i * layout.record_bytes, spec)


def pack_dynamic_ranges(
    message: bytearray, layout: Layout, inputs: Sequence[TensorAttr], shapes: Sequence[InputShapes]
) -> None:
    """Fill an INPUT_DYNAMIC_RANGE ack's data: each input's shapes as the runtime lists them, and the
    flag that makes the client send the inputs' shapes (MsgSetInputShape) before each inference."""
    _check_count(inputs, "input", layout)
    dynamic = any(s.ranges for s in shapes)
    struct.pack_into("<II", message, layout.dynamic_count_at, len(inputs), int(dynamic))
    for i, (spec, input_shapes) in enumerate(zip(inputs, shapes, strict=True)):
        at = layout.dynamic_records_at + i * layout.dynamic_record_bytes
        ranges = input_shapes.ranges[: layouts.MAX_SHAPES]
        n_dims = len(input_shapes.declared)
        if n_dims > layouts.MAX_DIMS or any(len(shape) != n_dims for shape in ranges):
            raise ResourceExhausted(
                f"input {spec.name!r} has shapes of {n_dims} dims or more than {layouts.MAX_DIMS}: "
                f"{[list(r) for r in ranges]}"
            )
        struct.pack_into("<II", message, at + layouts.DYNAMIC_INDEX_AT, i, len(ranges))
        message[at + layouts.DYNAMIC_FORMAT_AT] = _FORMATS.get(spec.layout.upper(), TensorFormat.UNDEFINED)
        struct.pack_into("<I", message, at + layouts.DYNAMIC_N_DIMS_AT, n_dims)
        for s, shape in enumerate(ranges):
            row = at + layouts.DYNAMIC_RANGE_AT + s * 4 * layouts.MAX_DIMS
            struct.pack_into(f"<{n_dims}I", message, row, *shape)
        _pack_name(message, at + layouts.DYNAMIC_NAME_AT, spec.name)


def unpack_input_shapes(
    message: bytes | memoryview, layout: Layout, specs: Sequence[TensorAttr]
) -> list[tuple[int, ...]]:
    """The shape of each input a MsgSetInputShape asks for (its attributes' dims), checked against the
    model's inputs (count, rank)."""
    (count,) = struct.unpack_from("<I", message, layout.shape_count_at)
    if count != len(specs):
        raise InputMismatch(
            f"shapes for {count} inputs were sent; the model has {len(specs)} ({', '.join(s.name for s in specs)})"
        )
    shapes = []
    for i, spec in enumerate(specs):
        at = layout.shape_records_at + i * layouts.ATTR_BYTES
        (n_dims,) = struct.unpack_from("<I", message, at + layouts.ATTR_INDEX_AT + 4)
        if n_dims != len(spec.shape):
            raise InputMismatch(
                f"input {i} ({spec.name}) was given a shape of {n_dims} dims; it has {len(spec.shape)}"
            )
        shapes.append(struct.unpack_from(f"<{n_dims}I", message, at + layouts.ATTR_DIMS_AT))
    return shapes


def _pack_attr(message: bytearray, at: int, spec: TensorAttr) -> None:
    """One tensor attribute as MsgSetInputShape's ack carries it."""
    dims = _dims(spec)
    struct.pack_into(f"<II{len(dims)}I", message, at, spec.index, len(dims), *dims)
    _pack_name(message, at + layouts.ATTR_NAME_AT, spec.name)
    kind = tensor_type(spec.dtype)
    struct.pack_into(
        "<IIBBBbif",
        message,
        at + layouts.ATTR_N_ELEMS_AT,
        math.prod(dims),
        spec.size_bytes,
        _FORMATS.get(spec.layout.upper(), TensorFormat.UNDEFINED),
        TensorType.FLOAT32 if kind is None else kind,
        QuantType[spec.quant_type.name],
        spec.fl,
        spec.zero_point,
        spec.scale,
    )
    # As in a MODEL_INFO record: the runtime's w_stride at this shape (the toolkit sends it back).
    struct.pack_into("<II", message, at + layouts.ATTR_STRIDES_AT, spec.w_stride, spec.size_bytes)


def pack_attrs(message: bytearray, layout: Layout, count_at: int, specs: Sequence[TensorAttr]) -> None:
    """A count and tensor attributes as MsgSetInputShape's ack carries the inputs' (at
    `shape_ack_inputs_at`) and outputs' (at `shape_ack_outputs_at`); the client takes them as the
    model's from then on: the sizes it checks inputs and outputs against."""
    _check_count(specs, "tensor", layout)
    struct.pack_into("<I", message, count_at, len(specs))
    for i, spec in enumerate(specs):
        _pack_attr(message, count_at + 4 + i * layouts.ATTR_BYTES, spec)


def echo_input_shapes(answer: bytearray, layout: Layout, request: bytes | memoryview) -> None:
    """The inputs' attributes of a refused MsgSetInputShape, as its ack carries them: the request's
    own (Rockchip's server answers with the attributes it was sent)."""
    (count,) = struct.unpack_from("<I", request, layout.shape_count_at)
    end = layout.shape_records_at + min(count, layout.max_tensors) * layouts.ATTR_BYTES
    answer[layout.shape_ack_inputs_at : layout.shape_ack_inputs_at + end - layout.shape_count_at] = request[
        layout.shape_count_at : end
    ]


def unpack_inputs(
    message: bytes | memoryview, layout: Layout, specs: Sequence[TensorAttr], limits: TensorLimits
) -> tuple[list[np.ndarray], list[InputFormat]]:
    """The arrays (views of `message`) and formats of a MsgMultiInput, through the one frame intake.

    What only this protocol needs is read here: the counts, sizes and offsets of the message, and
    the real server's tolerance of an input longer than the model's (librknnrt takes the first
    bytes). Each input is then declared in the layout it was sent in and checked like every other
    door's (`frames.take_arrays`); what that refuses (a type the runtime cannot take) contradicts
    the model as MODEL_INFO described it, as rknn_inputs_set would say."""
    (count,) = struct.unpack_from("<I", message, layout.input_count_at)
    if count != len(specs):
        raise InputMismatch(
            f"{count} inputs were sent; the model has {len(specs)} ({', '.join(s.name for s in specs)})"
        )
    data_bytes = len(message) - layout.input_data_at
    sizes = struct.unpack_from(f"<{count}I", message, layout.input_sizes_at)
    offsets = struct.unpack_from(f"<{count}I", message, layout.input_offsets_at)
    arrays: list[np.ndarray] = []
    declared: list[Declared] = []
    for i, spec in enumerate(specs):
        size, offset = sizes[i], offsets[i]
        kind = message[layout.input_types_at + i]
        if size > limits.max_tensor_bytes:
            raise ResourceExhausted(
                f"input {i} ({spec.name}) is {size} bytes; the limit is max_tensor_bytes={limits.max_tensor_bytes}"
            )
        if offset + size > data_bytes:
            raise InputMismatch(
                f"input {i} ({spec.name}) claims bytes {offset}..{offset + size} of a {data_bytes}-byte data area"
            )
        if kind not in _TYPE_CODES:
            raise InputMismatch(f"input {i} ({spec.name}) has tensor type {kind}, not an rknn_tensor_type")
        if spec.is_dynamic:
            raise InvalidInput(
                f"input {i} ({spec.name}) has a dynamic shape {list(spec.shape)}; not supported here"
            )
        dtype = numpy_dtype(kind)
        sent_layout = _LAYOUT_NAMES.get(message[layout.input_formats_at + i], spec.layout)
        shape = in_layout(spec.shape, spec.layout.upper(), sent_layout)
        needed = math.prod(shape) * dtype.itemsize
        if size < needed:
            raise InputMismatch(
                f"input {i} ({spec.name}) is {size} bytes; shape {list(shape)} of {dtype} takes {needed}"
            )
        if size > needed:  # librknnrt's rule is size >= needed: it takes the first bytes
            log.warning("legacy_input_longer", input=i, name=spec.name, size=size, used=needed)
        array = np.frombuffer(message, dtype, math.prod(shape), layout.input_data_at + offset).reshape(shape)
        arrays.append(array)
        declared.append(Declared.of(array, sent_layout, bool(message[layout.input_pass_through_at + i])))
    try:
        return take_arrays(specs, arrays, declared)
    except InvalidInput as refused:
        raise InputMismatch(str(refused)) from None


def native_outputs(outputs: Sequence[np.ndarray], specs: Sequence[TensorAttr]) -> list[np.ndarray]:
    """Each output in the type MODEL_INFO described (the client converts to float itself)."""
    return [
        np.ascontiguousarray(quantize(array, spec) if array.dtype.kind == "f" else array, dtype=spec.dtype)
        for array, spec in zip(outputs, specs, strict=True)
    ]


def pack_outputs(message: bytearray, layout: Layout, outputs: Sequence[np.ndarray]) -> None:
    offset = 0
    for i, array in enumerate(outputs):
        struct.pack_into("<I", message, layout.finish_lengths_at + 4 * i, array.nbytes)
        struct.pack_into("<I", message, layout.finish_offsets_at + 4 * i, offset)
        start = layout.finish_data_at + offset
        message[start : start + array.nbytes] = array.tobytes()
        offset += array.nbytes
