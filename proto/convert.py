"""The plain messages (`messages`) to protobuf and back: one function each way per message, used
by the daemon's handlers and the client alike.

A dataclass and its message share their field names, so the fields are copied by name; only the
enums and derived values are converted. Element types and layouts use `codec`'s maps (the chunking
code needs them too); the quantization kind's map follows from the names, which are the contract's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeAlias

import numpy as np

from rknn_proto import codec, messages, rknn_pb2

QuantTypeCode: TypeAlias = rknn_pb2.QuantType.ValueType

QUANT_TYPE_CODES: dict[messages.QuantType, QuantTypeCode] = {
    kind: rknn_pb2.QuantType.Value(f"QUANT_TYPE_{kind.name}") for kind in messages.QuantType
}
QUANT_TYPES: dict[int, messages.QuantType] = {code: kind for kind, code in QUANT_TYPE_CODES.items()}


def quant_type_from_wire(code: int) -> messages.QuantType:
    """The quantization kind of a wire code; a code this side does not know reads as none."""
    return QUANT_TYPES.get(code, messages.QuantType.NONE)


def _plain(value: Any) -> Any:
    """A message field's value as plain Python: repeated fields as tuples, maps as dicts."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return tuple(value)
    return value


def _from_message(message: Any, plain: type) -> dict[str, Any]:
    """The fields of dataclass `plain` that `message` has too, by name (not those `plain` computes)."""
    names = message.DESCRIPTOR.fields_by_name
    return {f.name: _plain(getattr(message, f.name)) for f in fields(plain) if f.init and f.name in names}


def _to_message(plain: Any, message: type) -> dict[str, Any]:
    """The fields of the dataclass instance `plain` that `message` has too, by name."""
    names = message.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
    return {f.name: getattr(plain, f.name) for f in fields(plain) if f.name in names}


def tensor_attr_to_wire(attr: messages.TensorAttr) -> rknn_pb2.TensorAttr:
    return rknn_pb2.TensorAttr(
        **{
            **_to_message(attr, rknn_pb2.TensorAttr),
            "dtype": codec.dtype_to_wire(attr.dtype),
            "layout": codec.layout_to_wire(attr.layout),
            "quant_type": QUANT_TYPE_CODES[attr.quant_type],
            "size_bytes": attr.size_bytes,
        }
    )


def tensor_attr_from_wire(attr: rknn_pb2.TensorAttr) -> messages.TensorAttr:
    return messages.TensorAttr(
        **{
            **_from_message(attr, messages.TensorAttr),
            "dtype": codec.dtype_from_wire(attr.dtype),
            "layout": codec.layout_name(attr.layout),
            "quant_type": quant_type_from_wire(attr.quant_type),
        }
    )


def layer_perf_to_wire(row: messages.LayerPerf) -> rknn_pb2.LayerPerf:
    return rknn_pb2.LayerPerf(**_to_message(row, rknn_pb2.LayerPerf))


def layer_perf_from_wire(row: rknn_pb2.LayerPerf) -> messages.LayerPerf:
    return messages.LayerPerf(**_from_message(row, messages.LayerPerf))


def perf_to_wire(perf: messages.EvalPerfResponse) -> rknn_pb2.EvalPerfResponse:
    return rknn_pb2.EvalPerfResponse(
        **{
            **_to_message(perf, rknn_pb2.EvalPerfResponse),
            "layers": [layer_perf_to_wire(row) for row in perf.layers],
            "frequencies": [rknn_pb2.FrequencyList(kind=f.kind, values=f.values) for f in perf.frequencies],
        }
    )


def perf_from_wire(reply: rknn_pb2.EvalPerfResponse) -> messages.EvalPerfResponse:
    """The reply's measurement (its total_operator_time_us is the layers' sum, computed again)."""
    return messages.EvalPerfResponse(
        **{
            **_from_message(reply, messages.EvalPerfResponse),
            "layers": tuple(layer_perf_from_wire(row) for row in reply.layers),
            "frequencies": tuple(messages.FrequencyList(f.kind, tuple(f.values)) for f in reply.frequencies),
        }
    )


def memory_to_wire(memory: messages.EvalMemoryResponse) -> rknn_pb2.EvalMemoryResponse:
    return rknn_pb2.EvalMemoryResponse(**_to_message(memory, rknn_pb2.EvalMemoryResponse))


def memory_from_wire(reply: rknn_pb2.EvalMemoryResponse) -> messages.EvalMemoryResponse:
    """The reply's figures (its total_memory is their sum, which the dataclass computes again)."""
    return messages.EvalMemoryResponse(**_from_message(reply, messages.EvalMemoryResponse))


def layer_dump_to_wire(layer: messages.LayerDump, wire: np.ndarray) -> rknn_pb2.LayerDumpHeader:
    """The header that starts a dumped layer whose bytes travel as `wire` (see codec.wire_array)."""
    return rknn_pb2.LayerDumpHeader(
        **_to_message(layer, rknn_pb2.LayerDumpHeader), tensor=codec.meta_of(wire, layer.tensor_name)
    )


def layer_dump_from_wire(header: rknn_pb2.LayerDumpHeader, array: np.ndarray) -> messages.LayerDump:
    """A dumped layer from its header and the array its chunks assembled into."""
    return messages.LayerDump(**_from_message(header, messages.LayerDump), array=array)
