"""One inference frame on the wire: its header and input chunks in, its outputs out.

Shared by the one-shot Inference RPC and the pipelined InferencePipeline RPC, so both check inputs,
convert layouts and choose the outputs' wire form the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rknn_proto import codec, rknn_pb2
from rknn_server.runtime.base import TensorSpec
from rknn_server.sessions import Session

# QuantInfo.kind -> the contract's QuantType.
QUANT_CODES = {
    "none": rknn_pb2.QUANT_TYPE_NONE,
    "affine": rknn_pb2.QUANT_TYPE_AFFINE_ASYMMETRIC,
    "dfp": rknn_pb2.QUANT_TYPE_DFP,
}

InputChecker = Callable[[Sequence[TensorSpec], Sequence[rknn_pb2.TensorMeta]], list["tuple[int, ...] | None"]]


@dataclass
class IncomingFrame:
    """A frame whose header arrived and whose input chunks are being collected."""

    header: rknn_pb2.InferenceHeader
    session: Session
    permutations: list[tuple[int, ...] | None]
    assembler: codec.TensorAssembler

    @classmethod
    def start(
        cls,
        header: rknn_pb2.InferenceHeader,
        session: Session,
        limits: codec.TensorLimits,
        check: InputChecker,
    ) -> IncomingFrame:
        permutations = check(session.runtime.inputs, header.inputs)
        return cls(header, session, permutations, codec.TensorAssembler(header.inputs, limits, "input"))

    def inputs(self) -> list[np.ndarray]:
        """The received inputs in the model's layout (raises if bytes are missing)."""
        return [
            np.ascontiguousarray(a.transpose(p)) if p else a
            for a, p in zip(self.assembler.arrays(), self.permutations, strict=True)
        ]


def wire_outputs(
    outputs: Sequence[np.ndarray], specs: Sequence[TensorSpec], native: bool
) -> tuple[list[rknn_pb2.TensorMeta], list[np.ndarray]]:
    """Metas and wire-ready arrays of a run's outputs. A quantized output the runtime returned as
    stored integers travels as such when the client asked for native outputs (it dequantizes, a
    quarter of the bytes for int8), else it is dequantized to float32 here."""
    wire = []
    for array, spec in zip(outputs, specs, strict=True):
        code = QUANT_CODES[spec.quant.kind]
        if not native and codec.is_native_quantized(array, code):
            array = codec.dequantize(array, code, spec.quant.zero_point, spec.quant.scale, spec.quant.fl)
        wire.append(codec.wire_array(array))
    metas = [codec.meta_of(a, s.name, s.layout) for a, s in zip(wire, specs, strict=True)]
    return metas, wire
