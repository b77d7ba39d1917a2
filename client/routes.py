"""How a session's frames travel, chosen once per session (Session makes its route on the first frame,
and again after re-opening on a restarted daemon): through shared memory when the daemon shares this
host, falling back to the wire frame by frame; on the wire, one unary Run for a small frame or a
one-frame Inference stream for a large one, by a size limit decided from what the daemon said.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc
import numpy as np

from rknn_client.errors import RknnError, from_rpc_error
from rknn_client.local import shared_memory
from rknn_proto import codec, framing, rknn_pb2
from rknn_proto.messages import TensorAttr, reply_bytes_bound
from rknn_proto.version import MAX_MESSAGE_BYTES, RUN_RPC_VERSION, UNBOUNDED_RUN_VERSION

if TYPE_CHECKING:
    from rknn_client.device import DeviceInfo
    from rknn_client.session import OutputFrame, Session

T = TypeVar("T")
Progress = Callable[[int, int], None]
# Room in a unary Run request for its header beside the inputs' bytes.
_HEADER_ROOM = 64 << 10


class Route(Protocol):
    """A session's way for its frames; it holds no reference to the session (which holds it)."""

    def run(
        self,
        session: Session,
        header: rknn_pb2.InferenceHeader,
        wire: Sequence[np.ndarray],
        progress: Progress | None,
    ) -> list[np.ndarray]:
        """One checked frame's outputs (float32 where they came quantized); sets the session's
        last_run_time_us."""
        ...


def route_for(session: Session) -> Route:
    """The session's route, from what its daemon said (GetInfo, InitRuntime's outputs)."""
    wire = WireRoute(unary_limit(session.device.info(), session.outputs, session.native_outputs))
    if shared_memory.usable(session.device):
        return SharedMemoryRoute(wire)
    return wire


def unary_limit(info: DeviceInfo, outputs: Sequence[TensorAttr], native_outputs: bool) -> int:
    """The most input bytes a frame may have to go as one unary Run (-1: never), from the daemon's
    protocol (Run; replies of any size), its message limit and the outputs' sizes. Unary is the faster
    path for small transfers, the stream for large ones (codec.SMALL_TRANSFER_BYTES). Outputs of
    unknown size go unary when the daemon answers a Run whatever its outputs come to (so it never
    computes and then refuses them); outputs known to be large go by the stream."""
    if info.protocol_version < RUN_RPC_VERSION:
        return -1
    message_limit = int(info.limits.get("max_message_bytes") or MAX_MESSAGE_BYTES)
    bound = reply_bytes_bound(outputs, native_outputs)
    if info.protocol_version < UNBOUNDED_RUN_VERSION and (bound is None or bound > message_limit // 2):
        return -1  # an older daemon's Run refuses, after computing, outputs over half its limit
    if bound is not None and bound >= codec.SMALL_TRANSFER_BYTES:
        return -1
    return min(codec.SMALL_TRANSFER_BYTES - 1, message_limit - _HEADER_ROOM)


@dataclass(frozen=True, slots=True)
class WireRoute:
    """Frames over gRPC: one unary Run up to `unary_limit` input bytes, else a one-frame stream."""

    unary_limit: int

    def run(
        self,
        session: Session,
        header: rknn_pb2.InferenceHeader,
        wire: Sequence[np.ndarray],
        progress: Progress | None,
    ) -> list[np.ndarray]:
        sent = sum([a.nbytes for a in wire])
        if sent <= self.unary_limit:
            return _unary(session, header, wire)
        return _stream(session, header, wire, sent, progress)


@dataclass(frozen=True, slots=True)
class SharedMemoryRoute:
    """Frames through the session's shared-memory region; a frame shared memory cannot serve (no
    room known for a dynamic model's outputs yet, the region gone, outputs larger than their slot)
    goes by `wire`, and what its outputs came to is learnt for the next frames like it."""

    wire: WireRoute

    def run(
        self,
        session: Session,
        header: rknn_pb2.InferenceHeader,
        wire: Sequence[np.ndarray],
        progress: Progress | None,
    ) -> list[np.ndarray]:
        shared = shared_memory.run_frame(session, header, wire, progress)
        if shared is not None:
            return shared
        outputs = self.wire.run(session, header, wire, progress)
        shared_memory.learn_room(session, wire, outputs)
        return outputs


def _unary(
    session: Session, header: rknn_pb2.InferenceHeader, wire: Sequence[np.ndarray]
) -> list[np.ndarray]:
    reply = session.device.run(framing.run_request_bytes(header, wire))
    session.last_run_time_us = reply.header.run_time_us
    try:
        frame = framing.whole_frame(
            session.new_output_assembler(reply.header), reply.tensors, len(reply.header.outputs), "output"
        )
    except framing.FrameError as exc:
        raise RknnError(f"Run on {session.device.endpoint.description}: {exc}") from None
    return session.real_outputs(frame.arrays())


def _stream(
    session: Session,
    header: rknn_pb2.InferenceHeader,
    wire: Sequence[np.ndarray],
    sent: int,
    progress: Progress | None,
) -> list[np.ndarray]:
    where = f"Inference on {session.device.endpoint.description}"
    total = sent

    def outputs_named(head: rknn_pb2.OutputsHeader) -> OutputFrame:
        nonlocal total
        total += sum(meta.byte_length for meta in head.outputs)
        return session.new_output_assembler(head)

    reader: framing.FrameReader[rknn_pb2.OutputsHeader, OutputFrame] = framing.FrameReader(
        outputs_named, describe_header="OutputsHeader"
    )
    requests = framing.frame_bytes(
        serialized_header(header), wire, (lambda moved: progress(moved, total)) if progress else None
    )
    try:
        responses: Iterator[framing.StreamResponse] = session.device.frames("Inference", requests)
        if progress:
            responses = _after_each(responses, lambda: progress(sent + reader.bytes, total))
        frames = framing.read_frames(responses, reader)
        frame = next(frames, None)
        # Read on to the end of the stream: the call ends OK on both sides (a stream left unread
        # is cancelled, and the daemon would record a frame it answered as CANCELLED).
        if frame is not None and next(frames, None) is not None:
            raise RknnError(f"{where}: the daemon answered one frame with two")
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, where) from None
    except framing.FrameError as exc:
        raise RknnError(f"{where}: {exc}") from None
    if frame is None:
        raise RknnError(f"{where}: the daemon closed the stream without outputs")
    if progress:  # the frame is whole before the reporter hears of its last chunk
        progress(sent + reader.bytes, total)
    session.last_run_time_us = frame.header.run_time_us
    return session.real_outputs(frame.arrays())


def serialized_header(header: rknn_pb2.InferenceHeader) -> bytes:
    """A frame's first request message, serialized."""
    return rknn_pb2.InferenceRequest(header=header).SerializeToString()


def _after_each(messages: Iterable[T], then: Callable[[], object]) -> Iterator[T]:
    """`messages`, calling `then` after each one has been taken (for a progress display)."""
    for message in messages:
        yield message
        then()
