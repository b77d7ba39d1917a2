"""A model open on a daemon (`Device.load` gives one): its frames, by the route chosen once per
session (shared memory, one unary Run, a one-frame stream), and its per-session calls, all made
through the Device's public calls.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc
import numpy as np

from rknn_client import routes
from rknn_client.errors import InvalidInput, RknnError, SessionLost, from_rpc_error
from rknn_client.frame_spec import FrameSpec
from rknn_client.local import shared_memory
from rknn_client.pipeline import Pipeline, ordered_map
from rknn_client.routes import Progress
from rknn_proto import codec, convert, framing, rknn_pb2
from rknn_proto.buffers import BufferPool
from rknn_proto.messages import EvalMemoryResponse, EvalPerfResponse, LayerDump, QuantType

if TYPE_CHECKING:
    from rknn_client.device import Device, ResponseStream

T = TypeVar("T")
# Re-opens a lost session on a restarted daemon: the new InitRuntime reply and the model bytes re-sent.
Reopen = Callable[[], tuple[rknn_pb2.InitRuntimeResponse, int]]
# The client trusts its daemon but still bounds what it allocates for outputs.
_OUTPUT_LIMITS = codec.TensorLimits(max_tensor_bytes=16 << 30, max_rank=32, max_tensors=4096)
# Set to 0 to have the daemon dequantize quantized outputs instead of sending their native integers.
NATIVE_OUTPUTS_ENV = "RKNN_NATIVE_OUTPUTS"
# Frames kept in flight by Session.map unless told otherwise.
DEFAULT_DEPTH = 4


def native_outputs_default() -> bool:
    """Native (quantized) outputs on the wire unless RKNN_NATIVE_OUTPUTS says 0/false/no/off."""
    return os.environ.get(NATIVE_OUTPUTS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class Session:
    """A model loaded on the daemon. Calls renew its lease; `release()` frees it at once."""

    def __init__(
        self,
        device: Device,
        reply: rknn_pb2.InitRuntimeResponse,
        reopen: Reopen | None = None,
        on_reconnect: Callable[[str], None] | None = None,
        native_outputs: bool | None = None,
    ) -> None:
        self.device = device
        self.shm = shared_memory.SessionState()  # its shared-memory region, once it has one
        self.native_outputs = native_outputs_default() if native_outputs is None else native_outputs
        self.last_run_time_us = 0
        self._released = False
        self._reopen = reopen
        self._reconnect_allowed = True
        self._on_reconnect = on_reconnect
        self._route: routes.Route | None = None  # chosen on the first frame (routes.route_for)
        # The memory of outputs the caller has dropped takes the next frames' (no fresh pages).
        self._output_buffers = BufferPool()
        self._adopt(reply)

    def _adopt(self, reply: rknn_pb2.InitRuntimeResponse) -> None:
        self.id = reply.session_id
        self.inputs = [convert.tensor_attr_from_wire(a) for a in reply.inputs]
        self.outputs = [convert.tensor_attr_from_wire(a) for a in reply.outputs]
        self.runtime_api_version = reply.runtime_api_version
        self.runtime_driver_version = reply.runtime_driver_version
        self._instance = self.device.instance_id
        self._route = None
        self._last_frame: _LastFrame | None = None  # see _frame
        # The last outputs' metas as check_metas passed them (their key, its layouts): the daemon
        # answers frame after frame with the same (new_output_assembler).
        self._last_outputs: tuple[codec.MetasKey, list[tuple[np.dtype, tuple[int, ...]]]] | None = None
        self._quantized = any(s.quant_type is not QuantType.NONE for s in self.outputs)

    def allow_reconnect(self, allowed: bool) -> None:
        """Turn the re-open after a daemon restart on or off (only for sessions loaded with reconnect=True)."""
        self._reconnect_allowed = allowed

    def _daemon_restarted(self) -> bool:
        """Whether the daemon answering now is another run than the one that opened this session."""
        try:
            now = self.device.info(refresh=True).instance_id
        except RknnError:
            return False
        return bool(self._instance) and now != self._instance

    def _guarded(self, call: Callable[[], T]) -> T:
        """One session call; a session lost to a daemon restart is re-opened once when allowed."""
        try:
            return call()
        except SessionLost as exc:
            self._recover(exc)
        return call()

    def _recover(self, exc: SessionLost) -> None:
        """Re-open the session on the restarted daemon, or raise: the daemon did not restart (`exc`
        as it came), or re-opening is not allowed."""
        if not self._daemon_restarted():
            raise exc
        if self._reopen is None or not self._reconnect_allowed:
            raise SessionLost(
                f"daemon restarted, session lost ({self.device.endpoint.description}); load the model "
                f"again, or pass reconnect=True to Device.load: {exc}"
            ) from None
        reply, sent = self._reopen()
        self._adopt(reply)
        if self._on_reconnect is not None:
            self._on_reconnect(
                f"the daemon restarted and the session was lost; re-initialized the runtime "
                f"(model re-sent: {sent} bytes)"
            )

    def _check(self, arrays: Sequence[np.ndarray], strict: bool) -> None:
        """What the client can know (docs/architecture.md): the count and, when strict, the types.
        Shapes are the daemon's intake's to check, once."""
        if len(arrays) != len(self.inputs):
            raise InvalidInput(f"the model has {len(self.inputs)} input(s); {len(arrays)} were given")
        if not strict:
            return
        for spec, array in zip(self.inputs, arrays, strict=True):
            if not isinstance(array, np.ndarray):
                raise InvalidInput(
                    f"input {spec.index} ({spec.name}) is {type(array).__name__}; expected ndarray"
                )
            if array.dtype != spec.dtype:
                raise InvalidInput(
                    f"input {spec.index} ({spec.name}) is {array.dtype}; the model expects {spec.dtype}"
                )

    def run(
        self,
        inputs: Sequence[np.ndarray],
        layouts: Sequence[str] | None = None,
        *,
        pass_through: Sequence[bool] | None = None,
        strict: bool = True,
        progress: Progress | None = None,
    ) -> list[np.ndarray]:
        """Run once. `layouts` says how 4-D inputs are laid out when not in the model's own layout;
        `strict=False` leaves the dtype check to the daemon too (shapes are always its to check; it
        converts layouts).
        `progress` hears (bytes moved, bytes to move) of a frame too big for one message: inputs sent,
        then outputs received (the total grows by the outputs' size once the daemon names it)."""
        return self.run_frame(FrameSpec(inputs, layouts, pass_through, strict), progress)

    def run_frame(self, frame: FrameSpec, progress: Progress | None = None) -> list[np.ndarray]:
        """Run one frame (see `run`), by the session's route."""
        return self._guarded(functools.partial(self._run_once, frame, progress))

    def _run_once(self, frame: FrameSpec, progress: Progress | None) -> list[np.ndarray]:
        header, wire = self._frame(frame, frame_id=0)
        route = self._route
        if route is None:
            route = self._route = routes.route_for(self)
        return route.run(self, header, wire, progress)

    def frame_bytes(self, frame: FrameSpec, frame_id: int = 0) -> Iterator[bytes]:
        """One frame's request messages, serialized (framing.frame_bytes: one copy of each chunk's
        bytes): the header now (inputs are checked here), chunks lazily."""
        header, wire = self._frame(frame, frame_id)
        return framing.frame_bytes(routes.serialized_header(header), wire)

    def _frame(self, frame: FrameSpec, frame_id: int) -> tuple[rknn_pb2.InferenceHeader, list[np.ndarray]]:
        """A checked frame: its header and its wire-ready input arrays. A frame like the last one
        (inputs of the same types, shapes and memory order, the same options) was checked already:
        it gets the same header (the very object, for run()'s frame id 0) and travels as given."""
        inputs = frame.arrays
        signature = frame.signature(self.native_outputs)
        last = self._last_frame
        if last is not None and last.signature == signature:
            wire = list(inputs)
            if frame_id == 0:
                return last.header, wire
            return self._header(last.header.inputs, frame_id), wire
        self._check(inputs, frame.strict)
        wire = [codec.wire_array(a) for a in inputs]
        layout_names = list(frame.layouts) if frame.layouts is not None else [s.layout for s in self.inputs]
        through = list(frame.pass_through) if frame.pass_through is not None else [False] * len(wire)
        metas = [
            codec.meta_of(a, spec.name, layout, p)
            for a, spec, layout, p in zip(wire, self.inputs, layout_names, through, strict=True)
        ]
        header = self._header(metas, frame_id)
        if signature is not None and all(w is a for w, a in zip(wire, inputs, strict=True)):
            self._last_frame = _LastFrame(signature, header if frame_id == 0 else self._header(metas, 0))
        return header, wire

    def _header(self, metas: Sequence[rknn_pb2.TensorMeta], frame_id: int) -> rknn_pb2.InferenceHeader:
        return rknn_pb2.InferenceHeader(
            session_id=self.id, inputs=metas, frame_id=frame_id, native_outputs=self.native_outputs
        )

    def new_output_assembler(self, header: rknn_pb2.OutputsHeader) -> OutputFrame:
        key = codec.metas_key(header.outputs)
        last = self._last_outputs
        if last is None or last[0] != key:
            last = self._last_outputs = (key, codec.check_metas(header.outputs, _OUTPUT_LIMITS, "output"))
        return OutputFrame.receiving(header, last[1], self._output_buffers)

    def real_outputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Received outputs as float32 where they came as quantized integers (native outputs)."""
        if not self._quantized:  # nothing to dequantize: every frame's outputs, as they came
            return arrays
        return [spec.real_values(a) for spec, a in zip(self.outputs, arrays, strict=True)]

    def pipeline(self, depth: int = DEFAULT_DEPTH) -> Pipeline:
        """An InferencePipeline stream on this session: submit() frames, result() them in order."""
        return Pipeline(self, depth)

    def map(
        self,
        inputs: Iterable[Sequence[np.ndarray]],
        depth: int = DEFAULT_DEPTH,
        layouts: Sequence[str] | None = None,
    ) -> Iterator[list[np.ndarray]]:
        """Outputs of each input list, in order, with up to `depth` frames in flight so transfers
        overlap the daemon's compute. Inputs are pulled lazily; closing the generator early
        cancels the frames still in flight (the session stays usable)."""
        return ordered_map(self.pipeline(depth), inputs, layouts)

    def dump_layers(
        self, inputs: Sequence[np.ndarray], layouts: Sequence[str] | None = None
    ) -> Iterator[LayerDump]:
        """Run once with per-layer capture and yield every captured tensor, one layer at a time
        (only one layer's bytes are held here at once). Stopping early cancels the call. With
        `layouts`, 4-D inputs may be in another layout than the model's (the daemon converts them)."""
        requests = self.frame_bytes(FrameSpec(inputs, layouts, strict=layouts is None))
        where = f"DumpLayers on {self.device.endpoint.description}"
        call: ResponseStream[rknn_pb2.DumpLayersResponse] = self.device.frames(
            "DumpLayers", requests, rknn_pb2.DumpLayersResponse.FromString
        )
        reader: framing.FrameReader[rknn_pb2.LayerDumpHeader, LayerFrame] = framing.FrameReader(
            LayerFrame, header="layer", what="layer", describe_header="LayerDumpHeader"
        )
        try:
            for layer in framing.read_frames(call, reader):
                yield layer.dumped()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, where) from None
        except framing.FrameError as exc:
            raise RknnError(f"{where}: {exc}") from None
        finally:
            call.cancel()

    def perf(self, fix_freq: bool = True) -> EvalPerfResponse:
        reply = self._guarded(lambda: self.device.eval_perf(self.id, fix_freq))
        return convert.perf_from_wire(reply)

    def memory(self) -> EvalMemoryResponse:
        reply = self._guarded(lambda: self.device.eval_memory(self.id))
        return convert.memory_from_wire(reply)

    def keep_alive(self) -> float:
        reply = self._guarded(lambda: self.device.keep_alive(self.id))
        return reply.expires_in_s

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.device.release_session(self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class OutputFrame(codec.TensorAssembler):
    """One frame's outputs being received: the daemon's header and the outputs' bytes (in `buffers`)."""

    header: rknn_pb2.OutputsHeader

    @classmethod
    def receiving(
        cls,
        header: rknn_pb2.OutputsHeader,
        layouts: list[tuple[np.dtype, tuple[int, ...]]],
        buffers: BufferPool,
    ) -> OutputFrame:
        """The frame of `header`, whose outputs' metas passed check_metas with `layouts`."""
        frame = cls.of_checked(header.outputs, layouts, "output", buffers.take)
        frame.header = header
        return frame


class LayerFrame(codec.TensorAssembler):
    """One dumped layer being received: its header and its tensor's bytes."""

    def __init__(self, header: rknn_pb2.LayerDumpHeader) -> None:
        super().__init__([header.tensor], _OUTPUT_LIMITS, "layer")
        self.header = header

    def dumped(self) -> LayerDump:
        return convert.layer_dump_from_wire(self.header, self.arrays()[0])


@dataclass(frozen=True)
class _LastFrame:
    """The last checked frame's signature (FrameSpec.signature) and its header for frame id 0."""

    signature: tuple[object, ...]
    header: rknn_pb2.InferenceHeader
