"""One inference over shared memory (RunShared): inputs read from, outputs written into, regions.

The intake is the wire's: the header's metas are checked against the tensor limits and the model
(frames.checked_inputs) and the inputs' buffers are held against the frame memory budget before a
byte is read; the one layout transpose is frames.arrange's. Only where the bytes come from differs:
each input's slot is checked to lie inside its region and has the meta's exact length; it is read
in place from a mapped region (a sealed memfd) or copied with pread from a /dev/shm file (shm.py
says why such a file is never mapped). Every output is checked to fit its slot before the first
one is written, so a slot too small leaves the client's region as it was. Where the runtime can,
it writes the outputs straight into a mapped region (ModelRuntime.run_into: ONNX Runtime's
IOBinding), each slot checked to hold its output before the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rknn_proto import rknn_pb2
from rknn_proto.messages import QuantType, TensorAttr
from rknn_proto.reasons import Reason
from rknn_server.core.data_plane import DataPlane, RunTimes
from rknn_server.core.frames import InputPlan, arrange, checked_inputs, wire_outputs
from rknn_server.core.sessions import Session
from rknn_server.core.shm import Region, SharedMemoryRegistry
from rknn_server.errors import InvalidInput, ResourceExhausted


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


def _check_fits(i: int, nbytes: int, slot: Slot) -> None:
    if nbytes > slot.length:
        raise ResourceExhausted(
            f"output {i} is {nbytes} bytes; its region slot holds {slot.length}. Nothing was written; "
            "give it a larger slot",
            reason=Reason.OUTPUT_SLOT_TOO_SMALL,
        )


def _in_place(slots: Sequence[Slot], specs: Sequence[TensorAttr], native: bool) -> list[np.ndarray] | None:
    """Arrays over the output slots for the runtime to write into (ModelRuntime.run_into), or None
    when the outputs must be copied in after the run. In place only when every slot is in a mapped
    region (a sealed memfd: a /dev/shm file is never mapped, shm.py says why) at an offset aligned
    for its dtype, and every output has a static shape and travels as the runtime makes it (not
    dequantized here). Each slot is checked to hold its output before the run: nothing is written
    into a slot too small."""
    if not all(slot.region.map is not None for slot in slots):
        return None
    if any(spec.is_dynamic or (spec.quant_type is not QuantType.NONE and not native) for spec in specs):
        return None
    if any(slot.offset % spec.dtype.alignment for slot, spec in zip(slots, specs, strict=True)):
        return None
    targets = []
    for i, (slot, spec) in enumerate(zip(slots, specs, strict=True)):
        nbytes = math.prod(spec.shape) * spec.dtype.itemsize
        _check_fits(i, nbytes, slot)
        targets.append(slot.region.view(slot.offset, nbytes).view(spec.dtype).reshape(spec.shape))
    return targets


def _read_files(slots: Sequence[Slot], buffers: Sequence[np.ndarray | None]) -> None:
    """Read each input kept in a /dev/shm file into its buffer (a mapped region's is read in place)."""
    for i, (slot, buffer) in enumerate(zip(slots, buffers, strict=True)):
        if buffer is not None:
            slot.region.read_into(buffer, slot.offset, f"input {i}")


def _inputs(
    slots: Sequence[Slot],
    buffers: Sequence[np.ndarray | None],
    layouts: Sequence[tuple[np.dtype, tuple[int, ...]]],
) -> list[np.ndarray]:
    """Each input as an array: a view of a mapped region, else its bytes read into its buffer."""
    _read_files(slots, buffers)
    arrays = []
    for slot, buffer, (dtype, shape) in zip(slots, buffers, layouts, strict=True):
        data = slot.region.view(slot.offset, slot.length) if buffer is None else buffer
        arrays.append(data.view(dtype).reshape(shape))
    return arrays


@dataclass
class SharedFrame:
    """A RunShared header checked against its session and regions, ready to run: once for a
    RunShared call, once per ring for a doorbell (server/protocols/local/doorbell.py), inputs read afresh each time."""

    session: Session
    inputs: list[Slot]
    outputs: list[Slot]
    layouts: list[tuple[np.dtype, tuple[int, ...]]]
    plans: list[InputPlan]
    buffers: list[np.ndarray | None]  # a /dev/shm file's input bytes are read into these
    targets: list[np.ndarray] | None  # where the runtime writes the outputs, when it can in place
    native: bool
    bound: Callable[[], list[np.ndarray]] | None = None  # the runtime's run of these arrays, once made
    placed: list[rknn_pb2.TensorMeta] = field(default_factory=list)  # metas of outputs written in place
    regions: list[Region] = field(init=False)  # each region its slots lie in, once
    files: bool = field(init=False)  # whether an input is read from a /dev/shm file (into a buffer)

    def __post_init__(self) -> None:
        self.regions = list(dict.fromkeys(slot.region for slot in self.inputs + self.outputs))
        self.files = any(b is not None for b in self.buffers)

    def let_go(self) -> None:
        """Drop what views the regions' memory and the input buffers: its session closed, so it never
        runs again; closing a mapped region then unmaps it at once, and the buffers' bytes go back to
        --max-memory now, not when the frame itself is freed."""
        self.targets = None
        self.bound = None
        self.buffers = []
        self.files = False

    def run(self) -> list[rknn_pb2.TensorMeta]:
        """Read the inputs, run, write the outputs (on the thread that holds the session)."""
        if self.bound is not None:  # a doorbell's next frame: the same memory, the run bound already
            if self.files:
                _read_files(self.inputs, self.buffers)
            return self._place(self.bound())
        arrays = _inputs(self.inputs, self.buffers, self.layouts)
        formats = [p.format for p in self.plans]
        runtime = self.session.runtime
        if self.targets is None:
            ran = runtime.run(arrange(arrays, self.plans), formats)
        elif any(p.permutation for p in self.plans):  # the transposed inputs are new arrays each frame
            ran = runtime.run_into(arrange(arrays, self.plans), self.targets, formats)
        else:  # the same memory each frame (the slots, or the buffers read into): bound once
            self.bound = runtime.bind(arrays, self.targets, formats)
            ran = self.bound()
        return self._place(ran)

    def _place(self, ran: list[np.ndarray]) -> list[rknn_pb2.TensorMeta]:
        """The outputs' metas, each output written into its slot unless the runtime wrote it there;
        outputs written in place have the metas of the last frame that was (same arrays, same metas)."""
        targets = self.targets
        in_place = targets is not None and all([a is t for a, t in zip(ran, targets, strict=True)])
        if in_place and self.placed:
            return self.placed
        metas, wire = wire_outputs(ran, self.session.runtime.outputs, self.native)
        for i, (slot, array) in enumerate(zip(self.outputs, wire, strict=True)):
            _check_fits(i, array.nbytes, slot)
        for i, (slot, array) in enumerate(zip(self.outputs, wire, strict=True)):
            if targets is None or array is not targets[i]:  # else the runtime wrote it there
                slot.region.write(array, slot.offset)
        self.placed = metas if in_place else []
        return metas


def prepare(
    plane: DataPlane,
    registry: SharedMemoryRegistry,
    session: Session,
    header: rknn_pb2.InferenceHeader,
    owner: str,
) -> SharedFrame:
    """Check a frame whose tensors live in the owner's regions; nothing is read yet. A /dev/shm
    file's inputs need buffers, held against --max-memory for as long as the frame is kept."""
    checked = checked_inputs(session, header.inputs, plane.tensor_limits)
    layouts, plans = checked.layouts, checked.plans
    inputs, outputs = _plan(header, session, registry, owner)
    buffers = [
        None if slot.region.map is not None else np.empty(m.byte_length, dtype=np.uint8)
        for slot, m in zip(inputs, header.inputs, strict=True)
    ]
    plane.frame_memory.hold([b for b in buffers if b is not None], f"the inputs of frame {header.frame_id}")
    targets = _in_place(outputs, session.runtime.outputs, header.native_outputs)
    return SharedFrame(session, inputs, outputs, layouts, plans, buffers, targets, header.native_outputs)


async def run_shared(
    plane: DataPlane,
    registry: SharedMemoryRegistry,
    session: Session,
    header: rknn_pb2.InferenceHeader,
    owner: str,
) -> SharedResult:
    """Run one frame whose tensors live in the owner's regions: reading the inputs, the run and
    writing the outputs are one job in the executor under the session's lock (DataPlane.in_session),
    one thread hop per frame, as on the wire."""
    frame = prepare(plane, registry, session, header, owner)
    registry.acquire(frame.regions)
    start = time.perf_counter()
    try:
        metas = await plane.in_session(session, frame.run, timed=RunTimes())
    finally:
        registry.release(frame.regions)
    return SharedResult(metas, int((time.perf_counter() - start) * 1e6))


__all__ = ["SharedFrame", "SharedResult", "prepare", "run_shared"]
