"""One inference frame on the wire: its header and input chunks in, its outputs out.

Shared by the one-shot Inference RPC and the pipelined InferencePipeline RPC, so both check inputs,
convert layouts and choose the outputs' wire form the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rknn_proto import codec, rknn_pb2
from rknn_proto.messages import TensorAttr, dequantize, in_layout, permutation
from rknn_server.core.memory import MemoryBudget
from rknn_server.core.sessions import Session
from rknn_server.errors import InvalidInput, ResourceExhausted
from rknn_server.runtime.base import InputFormat


@dataclass(frozen=True)
class InputPlan:
    """How one received input reaches the runtime: the axis permutation that brings it into the
    model's layout (None: as is), and the format the runtime is told."""

    permutation: tuple[int, ...] | None
    format: InputFormat


@dataclass(frozen=True)
class Declared:
    """One input as a client declares it, in any protocol's terms: what the intake checks."""

    dtype: np.dtype
    shape: tuple[int, ...]
    layout: str = "UNDEFINED"  # "NCHW" | "NHWC" | "UNDEFINED"
    pass_through: bool = False

    @classmethod
    def of(cls, array: np.ndarray, layout: str = "UNDEFINED", pass_through: bool = False) -> Declared:
        return cls(array.dtype, tuple(array.shape), layout, pass_through)


def check_inputs(specs: Sequence[TensorAttr], metas: Sequence[rknn_pb2.TensorMeta]) -> list[InputPlan]:
    """Check the inputs a frame header declares against the model before any byte is received."""
    return plan_inputs(
        specs,
        [
            Declared(
                codec.dtype_from_wire(m.dtype), tuple(m.shape), codec.layout_name(m.layout), m.pass_through
            )
            for m in metas
        ],
    )


@dataclass(frozen=True, slots=True)
class CheckedInputs:
    """A frame header's inputs as they passed the intake: codec.check_metas's layouts (the daemon's
    limits) and check_inputs's plans (the session's model). A session keeps the last one, and a frame
    whose inputs are declared the same (a client sends the same inputs frame after frame) takes it:
    both checks are pure functions of what the key holds. In place in the daemon, a tiny model's Run
    spent 36 us in the checks and the assembler, and 17 us with the kept result (its key included)."""

    key: codec.MetasKey
    limits: codec.TensorLimits
    layouts: list[tuple[np.dtype, tuple[int, ...]]]
    plans: list[InputPlan]


def checked_inputs(
    session: Session, metas: Sequence[rknn_pb2.TensorMeta], limits: codec.TensorLimits
) -> CheckedInputs:
    """The intake of a frame header's inputs (raises what either check raises): the session's last
    one where the inputs and the limits are the same, else both checks, kept for the next frame."""
    key = codec.metas_key(metas)
    last = session.checked_inputs
    if last is not None and last.key == key and last.limits is limits:
        return last
    checked = CheckedInputs(
        key, limits, codec.check_metas(metas, limits, "input"), check_inputs(session.runtime.inputs, metas)
    )
    session.checked_inputs = checked  # one reference, replaced whole: a doorbell's thread reads it too
    return checked


def _check_count(specs: Sequence[TensorAttr], count: int) -> None:
    if count != len(specs):
        raise InvalidInput(
            f"the model has {len(specs)} input(s) ({', '.join(s.name for s in specs)}); {count} were sent"
        )


def _shape_refusal(spec: TensorAttr, shape: tuple[int, ...], layout: str) -> str:
    """Why data of `shape`, laid out as `layout`, cannot feed `spec`; the expected shape is given in the
    sender's layout too, so the two shapes read side by side."""
    wanted = in_layout(spec.shape, spec.layout, layout)
    as_sent = f", which is {list(wanted)} as {layout}" if wanted != spec.shape else ""
    return (
        f"input {spec.index} ({spec.name}) has shape {list(shape)} ({layout}); the model expects "
        f"{list(spec.shape)} ({spec.layout}){as_sent}"
    )


def plan_inputs(specs: Sequence[TensorAttr], declared: Sequence[Declared]) -> list[InputPlan]:
    """Check declared inputs against the model (count, dtype, shape in the model's layout) and plan
    how each reaches the runtime. Every protocol's intake goes through here, once per frame.

    Data is transposed into the model's layout only when its runtime cannot take the layout it came
    in (`TensorAttr.takes_layout`); data of no stated layout is taken to be in the model's."""
    _check_count(specs, len(declared))
    plans: list[InputPlan] = []
    for spec, item in zip(specs, declared, strict=True):
        dtype, shape = item.dtype, item.shape
        layout = spec.layout if item.layout == "UNDEFINED" else item.layout
        if not spec.accepts(dtype, item.pass_through):
            raise InvalidInput(f"input {spec.index} ({spec.name}) is {dtype}; the model expects {spec.dtype}")
        if not spec.fits(in_layout(shape, layout, spec.layout)):
            raise InvalidInput(_shape_refusal(spec, shape, layout))
        order = (
            None
            if spec.takes_layout(layout, item.pass_through)
            else permutation(layout, spec.layout, len(shape))
        )
        fmt = InputFormat(layout=spec.layout if order else layout, pass_through=item.pass_through)
        plans.append(InputPlan(order, fmt))
    return plans


def arrange(arrays: Sequence[np.ndarray], plans: Sequence[InputPlan]) -> list[np.ndarray]:
    """The inputs in the model's layout (the one transpose, where the plan has one)."""
    return [
        np.ascontiguousarray(a.transpose(plan.permutation)) if plan.permutation else a
        for a, plan in zip(arrays, plans, strict=True)
    ]


def take_arrays(
    specs: Sequence[TensorAttr], arrays: Sequence[np.ndarray], declared: Sequence[Declared]
) -> tuple[list[np.ndarray], list[InputFormat]]:
    """The intake of a frame whose inputs arrived whole (a protocol that reads arrays at once): checked,
    arranged, with the formats for `DataPlane.run`."""
    plans = plan_inputs(specs, declared)
    for array, item in zip(arrays, declared, strict=True):
        if array.dtype != item.dtype or tuple(array.shape) != item.shape:
            raise InvalidInput(
                f"an input array is {array.dtype}{list(array.shape)}, not the declared {item.dtype}{list(item.shape)}"
            )
    return arrange(arrays, plans), [plan.format for plan in plans]


def check_chunk(size: int, limits: codec.TensorLimits) -> None:
    if size > limits.max_chunk_bytes:
        raise ResourceExhausted(
            f"a chunk of {size} bytes arrived, over the limit max_chunk_bytes={limits.max_chunk_bytes}; "
            "send smaller chunks"
        )


@dataclass
class IncomingFrame:
    """A frame whose header arrived and whose input chunks are being collected."""

    header: rknn_pb2.InferenceHeader
    session: Session
    plans: list[InputPlan]
    assembler: codec.TensorAssembler
    limits: codec.TensorLimits

    @classmethod
    def start(
        cls,
        header: rknn_pb2.InferenceHeader,
        session: Session,
        limits: codec.TensorLimits,
        budget: MemoryBudget,
    ) -> IncomingFrame:
        """Check the declared inputs against the limits and then the model (checked_inputs), before
        the assembler's buffers (which np.empty only reserves), and reserve the buffers against the
        daemon's memory budget, before any byte arrives."""
        checked = checked_inputs(session, header.inputs, limits)
        assembler = codec.TensorAssembler.of_checked(
            header.inputs, checked.layouts, "input", session.buffers.take
        )
        budget.hold(assembler.buffers, f"the inputs of frame {header.frame_id}")
        return cls(header, session, checked.plans, assembler, limits)

    # The framing's Assembly (rknn_proto.framing): rknn_proto.framing.FrameReader feeds chunks here.

    @property
    def complete(self) -> bool:
        return self.assembler.complete

    def add(self, chunk: codec.Chunk) -> int:
        """Take one chunk; returns its size."""
        size = self.assembler.add(chunk)
        check_chunk(size, self.limits)
        return size

    def add_bytes(self, i: int, offset: int, data: bytes | memoryview) -> int:
        """Take a whole input's bytes (the unary Run, whose message gRPC already received and bounded):
        the runtime reads them where they are, without a copy (runtimes never write their inputs)."""
        return self.assembler.adopt(i, data) if offset == 0 else self.assembler.add_bytes(i, offset, data)

    def missing(self) -> list[str]:
        return self.assembler.missing()

    def drop(self) -> None:
        """Free the frame's buffers (and give back their memory budget) now: the frame failed."""
        self.assembler.drop()

    def inputs(self) -> list[np.ndarray]:
        """The received inputs in the model's layout (raises if bytes are missing)."""
        return arrange(self.assembler.arrays(), self.plans)

    def formats(self) -> list[InputFormat]:
        """What the runtime is told of each input (layout, pass-through)."""
        return [plan.format for plan in self.plans]


def wire_arrays(outputs: Sequence[np.ndarray], specs: Sequence[TensorAttr], native: bool) -> list[np.ndarray]:
    """A run's outputs ready for the wire. A quantized output the runtime returned as stored
    integers travels as such when the client asked for native outputs (it dequantizes, a quarter of
    the bytes for int8), else it is dequantized to float32 here."""
    return [
        codec.wire_array(array if native else dequantize(array, spec))
        for array, spec in zip(outputs, specs, strict=True)
    ]


def wire_outputs(
    outputs: Sequence[np.ndarray], specs: Sequence[TensorAttr], native: bool
) -> tuple[list[rknn_pb2.TensorMeta], list[np.ndarray]]:
    """Metas and wire-ready arrays of a run's outputs (see wire_arrays), for rknn.v1's replies."""
    wire = wire_arrays(outputs, specs, native)
    return [codec.meta_of(a, s.name, s.layout) for a, s in zip(wire, specs, strict=True)], wire
