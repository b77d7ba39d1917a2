"""One inference over shared memory (RunShared): inputs read from, outputs written into, regions.

The intake is the wire's: the header's metas are checked against the tensor limits and the model
(frames.check_inputs) and the inputs' buffers are held against the frame memory budget before a
byte is read; the one layout transpose is frames.arrange's. Only where the bytes come from differs:
each input's slot is checked to lie inside its region and has the meta's exact length; it is read
in place from a mapped region (a sealed memfd) or copied with pread from a /dev/shm file (shm.py
says why such a file is never mapped). Every output is checked to fit its slot before the first
one is written, so a slot too small leaves the client's region as it was.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rknn_proto import codec, rknn_pb2
from rknn_server.data_plane import DataPlane
from rknn_server.errors import InvalidInput, ResourceExhausted
from rknn_server.frames import arrange, check_inputs, wire_outputs
from rknn_server.sessions import Session
from rknn_server.shm import Region, SharedMemoryRegistry


@dataclass(frozen=True)
class Slot:
    region: Region
    offset: int
    length: int


@dataclass(frozen=True)
class SharedResult:
    metas: list[rknn_pb2.TensorMeta]
    run_time_us: int


def _slots(
    registry: SharedMemoryRegistry, owner: str, regions: Sequence[rknn_pb2.TensorRegion], what: str
) -> list[Slot]:
    slots = []
    for i, r in enumerate(regions):
        region = registry.get(owner, r.key)
        region.check_slot(r.offset, r.byte_length, f"{what} {i}")
        slots.append(Slot(region, r.offset, r.byte_length))
    return slots


def _plan(
    header: rknn_pb2.InferenceHeader, session: Session, registry: SharedMemoryRegistry, owner: str
) -> tuple[list[Slot], list[Slot]]:
    """Check the header's slots against the model and the regions; nothing is read yet."""
    if len(header.input_regions) != len(header.inputs):
        raise InvalidInput(
            f"{len(header.input_regions)} input regions were named for {len(header.inputs)} input(s); "
            "RunShared takes one per input"
        )
    outputs = session.runtime.outputs
    if len(header.output_regions) != len(outputs):
        raise InvalidInput(
            f"{len(header.output_regions)} output regions were named; the model has {len(outputs)} output(s)"
        )
    inputs = _slots(registry, owner, header.input_regions, "input")
    for i, (slot, meta) in enumerate(zip(inputs, header.inputs, strict=True)):
        if slot.length != meta.byte_length:
            raise InvalidInput(
                f"input {i}: its region slot holds {slot.length} bytes, its meta declares {meta.byte_length}"
            )
    return inputs, _slots(registry, owner, header.output_regions, "output")


def _inputs(
    slots: Sequence[Slot],
    buffers: Sequence[np.ndarray | None],
    layouts: Sequence[tuple[np.dtype, tuple[int, ...]]],
) -> list[np.ndarray]:
    """Each input as an array: a view of a mapped region, else its bytes read into its buffer."""
    arrays = []
    for i, (slot, buffer, (dtype, shape)) in enumerate(zip(slots, buffers, layouts, strict=True)):
        if buffer is None:
            data = slot.region.view(slot.offset, slot.length)
        else:
            slot.region.read_into(buffer, slot.offset, f"input {i}")
            data = buffer
        arrays.append(data.view(dtype).reshape(shape))
    return arrays


async def run_shared(
    plane: DataPlane,
    registry: SharedMemoryRegistry,
    session: Session,
    header: rknn_pb2.InferenceHeader,
    owner: str,
) -> SharedResult:
    """Run one frame whose tensors live in the owner's regions.

    Reading the inputs, the run and writing the outputs are one job in the executor under the
    session's lock (DataPlane.in_session): one thread hop per frame, as on the wire."""
    layouts = codec.check_metas(header.inputs, plane.tensor_limits, "input")
    plans = check_inputs(session.runtime.inputs, header.inputs)
    inputs, outputs = _plan(header, session, registry, owner)
    # A mapped region is read in place; a file's bytes need a buffer, held against --max-memory.
    buffers = [
        None if slot.region.map is not None else np.empty(m.byte_length, dtype=np.uint8)
        for slot, m in zip(inputs, header.inputs, strict=True)
    ]
    plane.frame_memory.hold([b for b in buffers if b is not None], f"the inputs of frame {header.frame_id}")
    specs = session.runtime.outputs

    def work() -> list[rknn_pb2.TensorMeta]:
        arrays = _inputs(inputs, buffers, layouts)
        buffers.clear()  # the arrays hold them now, and go (with their budget) once the run is done
        ran = session.runtime.run(arrange(arrays, plans), [p.format for p in plans])
        del arrays
        metas, wire = wire_outputs(ran, specs, header.native_outputs)
        for i, (slot, array) in enumerate(zip(outputs, wire, strict=True)):
            if array.nbytes > slot.length:
                raise ResourceExhausted(
                    f"output {i} is {array.nbytes} bytes; its region slot holds {slot.length}. Nothing "
                    "was written; give it a larger slot"
                )
        for slot, array in zip(outputs, wire, strict=True):
            slot.region.write(array, slot.offset)
        return metas

    used = [slot.region for slot in inputs + outputs]
    registry.acquire(used)
    start = time.perf_counter()
    try:
        metas = await plane.in_session(session, work, timed=True)
    finally:
        registry.release(used)
    return SharedResult(metas, int((time.perf_counter() - start) * 1e6))


__all__ = ["SharedResult", "run_shared"]
