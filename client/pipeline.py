"""Pipelined inference on one session: frames in flight on an InferencePipeline stream.

The request stream is fed from a queue by gRPC's own sending thread, so `submit()` returns at once
and a frame's chunks are built and sent while the caller waits for an earlier frame's outputs;
`result()` reads the outputs of the oldest frame not yet answered. The daemon answers in order.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, cast

import grpc
import numpy as np

from rknn_client.errors import InvalidInput, RknnError, from_rpc_error
from rknn_client.frame_spec import FrameSpec
from rknn_proto import framing, rknn_pb2

if TYPE_CHECKING:
    from rknn_client.session import OutputFrame, Session

_END = object()
# How long closing a drained pipeline waits for the daemon to end the call before cancelling it.
_END_WAIT_S = 10.0


class Pipeline:
    """One stream of frames. Frame ids count from 1. Not thread-safe: one caller drives it."""

    def __init__(self, session: Session, depth: int) -> None:
        if depth < 1:
            raise InvalidInput(f"depth must be at least 1 frame; {depth} was given")
        self.session = session
        self.depth = depth
        self._where = f"InferencePipeline on {session.device.endpoint.description}"
        self._outbox: queue.Queue[Iterator[bytes] | None] = queue.Queue()
        self._pending: collections.deque[int] = collections.deque()
        self._last_id = 0
        self._closed = False
        self._call = session.device.inference_pipeline(self._requests())
        reader: framing.FrameReader[rknn_pb2.OutputsHeader, OutputFrame] = framing.FrameReader(
            session.new_output_assembler, describe_header="OutputsHeader"
        )
        self._frames = framing.read_frames(self._call, reader)

    def _requests(self) -> Iterator[bytes]:
        while (frame := self._outbox.get()) is not None:
            yield from frame

    @property
    def accepting(self) -> bool:
        """Whether submit() still takes frames (not after finish() or close())."""
        return not self._closed

    @property
    def in_flight(self) -> int:
        """Frames submitted whose outputs have not been read yet."""
        return len(self._pending)

    def submit(
        self,
        inputs: Sequence[np.ndarray],
        layouts: Sequence[str] | None = None,
        *,
        pass_through: Sequence[bool] | None = None,
        strict: bool = True,
    ) -> int:
        """Queue a frame for sending and return its id at once (inputs are checked here)."""
        return self.submit_frame(FrameSpec(inputs, layouts, pass_through, strict))

    def submit_frame(self, frame: FrameSpec) -> int:
        """Queue one frame (see `submit`)."""
        if self._closed:
            raise RknnError(f"{self._where}: the pipeline is closed")
        frame_id = self._last_id + 1
        messages = self.session.frame_bytes(frame, frame_id)
        self._last_id = frame_id
        self._pending.append(frame_id)
        self._outbox.put(messages)
        return frame_id

    def result(self) -> tuple[int, list[np.ndarray]]:
        """The oldest unanswered frame's id and outputs (float32 where they came quantized)."""
        if not self._pending:
            raise RknnError(f"{self._where}: no frame is in flight")
        expected = self._pending.popleft()
        try:
            frame = next(self._frames, None)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self._where) from None
        except framing.FrameError as exc:
            raise RknnError(f"{self._where}: {exc}") from None
        if frame is None:
            raise RknnError(f"{self._where}: the daemon closed the stream before frame {expected}")
        if frame.header.frame_id != expected:
            raise RknnError(
                f"{self._where}: the daemon answered frame {frame.header.frame_id}; expected {expected}"
            )
        self.session.last_run_time_us = frame.header.run_time_us
        return expected, self.session.real_outputs(frame.arrays())

    def finish(self) -> None:
        """Send no more frames (the frames in flight are still answered)."""
        if not self._closed:
            self._closed = True
            self._outbox.put(None)

    def close(self) -> None:
        """End the stream; frames still in flight are cancelled and their outputs dropped. With none
        in flight, wait (briefly) for the daemon to end the call: a channel closed right after
        would otherwise cancel a stream whose every frame was answered."""
        if self._pending:
            # Cancelled before the request stream ends: an end sent first tells the daemon "no more
            # frames", and it would answer the ones in flight and end the call well before the
            # cancellation reached it.
            self._call.cancel()
            self._pending.clear()
            self.finish()
            return
        self.finish()
        ended = threading.Event()
        cast(grpc.Future, self._call).add_done_callback(lambda _: ended.set())  # a rendezvous is both
        if not ended.wait(_END_WAIT_S):
            self._call.cancel()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ordered_map(
    pipeline: Pipeline, inputs: Iterable[Sequence[np.ndarray]], layouts: Sequence[str] | None = None
) -> Iterator[list[np.ndarray]]:
    """Each input list's outputs in order, keeping up to `pipeline.depth` frames in flight."""
    source = iter(inputs)
    with pipeline:
        while True:
            while pipeline.accepting and pipeline.in_flight < pipeline.depth:
                item = next(source, _END)
                if item is _END:
                    pipeline.finish()
                else:
                    pipeline.submit(cast(Sequence[np.ndarray], item), layouts)
            if not pipeline.in_flight:
                return
            yield pipeline.result()[1]
