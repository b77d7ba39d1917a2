"""Frames through the data plane: the InferencePipeline stream, the one-frame Inference and the
unary Run, all through the same stages (receive, run, send) and the one framing of rknn_proto.

A pipelined stream joins the stages with small bounded queues: a reader task assembles frames from
the request stream, a runner task runs them one after another in arrival order, and the handler
itself sends each frame's outputs. While frame N runs, frame N+1 is being received and frame N-1's
outputs are being sent, so on a slow link the transfers hide behind compute. The bounded queues
(and gRPC flow control behind them) keep at most a few frames in the daemon's memory, whatever the
client sends. A one-frame call runs the same stages in series, without tasks or queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np

from rknn_proto import framing, rknn_pb2
from rknn_proto.messages import reply_bytes_bound
from rknn_proto.version import MAX_RUN_REPLY_BYTES
from rknn_server.core.data_plane import DataPlane
from rknn_server.core.frames import IncomingFrame, wire_outputs
from rknn_server.errors import InvalidInput
from rknn_server.kit.guard import client_identity
from rknn_server.kit.replies import ReplyRule, ReplyTooLarge
from rknn_server.observe.calls import Call

# Frames assembled but not yet running, and frames run but not yet sent (each besides the one in
# that stage's hands): enough to keep every stage busy, few enough to bound memory.
QUEUE_FRAMES = 1
# One unary Run reply carries what one protobuf message can hold, less room for its header. Larger
# outputs go by the streaming Inference (the client knows their size).
RUN_REPLY = ReplyRule(
    "Run message",
    MAX_RUN_REPLY_BYTES,
    "the most one protobuf message holds",
    "use the streaming Inference",
    headroom=1 << 20,
)
MAX_REPLY_BYTES = RUN_REPLY.most


@dataclass
class Done:
    """A run frame's outputs, ready to send."""

    header: rknn_pb2.OutputsHeader
    wire: list[np.ndarray]


class Pipeline:
    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    # -- The stages ----------------------------------------------------------------------------

    def _start(self, header: rknn_pb2.InferenceHeader, call: Call) -> IncomingFrame:
        """A frame whose header arrived: its session (the caller's own) and its checked intake."""
        session = self._plane.session(header.session_id, client_identity())
        call.session = session.id
        return IncomingFrame.start(header, session, self._plane.tensor_limits, self._plane.frame_memory)

    def _reader(self, call: Call) -> framing.FrameReader[rknn_pb2.InferenceHeader, IncomingFrame]:
        return framing.FrameReader(
            lambda header: self._start(header, call), describe_header="InferenceHeader"
        )

    async def _run(self, frame: IncomingFrame) -> Done:
        ran = await self._plane.run(frame.session, frame.inputs(), frame.formats())
        header = frame.header
        metas, wire = wire_outputs(ran.outputs, frame.session.runtime.outputs, header.native_outputs)
        return Done(
            rknn_pb2.OutputsHeader(outputs=metas, run_time_us=ran.run_time_us, frame_id=header.frame_id),
            wire,
        )

    @staticmethod
    def _send(done: Done, call: Call) -> Iterator[bytes]:
        """A frame's serialized response messages (the frame streams' replies are written by framing)."""
        header = rknn_pb2.InferenceResponse(header=done.header).SerializeToString()
        yield from framing.frame_bytes(header, done.wire)
        call.bytes_out += _nbytes(done.wire)
        call.frames += 1

    # -- One frame -----------------------------------------------------------------------------

    async def receive_one(
        self, requests: AsyncIterator[framing.StreamRequest], call: Call, method: str
    ) -> IncomingFrame:
        """The one frame of a request stream (which must end after it)."""
        reader = self._reader(call)
        try:
            async with aclosing(framing.aread_frames(requests, reader)) as frames:
                frame = await anext(frames, None)
                if frame is None:
                    raise InvalidInput("the request stream was empty; expected an InferenceHeader first")
                try:
                    if await anext(frames, None) is not None:
                        raise InvalidInput(f"{method} takes one frame; InferencePipeline takes many")
                except BaseException:
                    frame.drop()
                    raise
        finally:
            call.bytes_in = reader.bytes
        return frame

    async def one(
        self, requests: AsyncIterator[framing.StreamRequest], call: Call
    ) -> AsyncGenerator[bytes, None]:
        """The Inference RPC: a pipeline of one frame, its stages in series."""
        done = await self._run(await self.receive_one(requests, call, "Inference"))
        for message in self._send(done, call):
            yield message

    async def unary(
        self, header: rknn_pb2.InferenceHeader, inputs: Sequence[framing.Bytes], call: Call
    ) -> Done:
        """The unary Run: a frame whose inputs came in one message. Outputs too large for one reply
        are refused before computing wherever their size is known (the client sends such frames by
        the stream); a frame with outputs of unknown size is answered whatever they come to, up to
        the one hard limit of a protobuf message."""
        frame = framing.whole_frame(self._start(header, call), inputs, len(header.inputs), "input")
        # From the checked header, not len(inputs[i]): each read of a bytes field copies it.
        call.bytes_in = sum([meta.byte_length for meta in header.inputs])
        known = reply_bytes_bound(frame.session.runtime.outputs, header.native_outputs)
        try:
            RUN_REPLY.check_bytes(known or 0)
        except ReplyTooLarge:
            frame.drop()
            raise
        done = await self._run(frame)
        call.bytes_out = _nbytes(done.wire)
        RUN_REPLY.check_bytes(call.bytes_out)
        call.frames = 1
        return done

    # -- Many frames ---------------------------------------------------------------------------

    async def stream(
        self, requests: AsyncIterator[framing.StreamRequest], call: Call
    ) -> AsyncGenerator[bytes, None]:
        """The InferencePipeline response stream; raises the first error of any stage (frames
        before it were sent)."""
        ready: asyncio.Queue[IncomingFrame | BaseException | None] = asyncio.Queue(QUEUE_FRAMES)
        done: asyncio.Queue[Done | BaseException | None] = asyncio.Queue(QUEUE_FRAMES)
        tasks = [
            asyncio.create_task(self._receive(requests, ready, call)),
            asyncio.create_task(self._execute(ready, done)),
        ]
        try:
            while (item := await done.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                for message in self._send(item, call):
                    yield message
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _receive(
        self,
        requests: AsyncIterator[framing.StreamRequest],
        ready: asyncio.Queue[IncomingFrame | BaseException | None],
        call: Call,
    ) -> None:
        reader = self._reader(call)
        try:
            async with aclosing(framing.aread_frames(requests, reader)) as frames:
                async for frame in frames:
                    call.bytes_in = reader.bytes
                    await ready.put(frame)
                    del frame  # a later error's traceback must not keep this frame's buffers alive
            await ready.put(None)
        except Exception as exc:
            await ready.put(exc)
        finally:
            call.bytes_in = reader.bytes

    async def _execute(
        self,
        ready: asyncio.Queue[IncomingFrame | BaseException | None],
        done: asyncio.Queue[Done | BaseException | None],
    ) -> None:
        while (item := await ready.get()) is not None:
            if isinstance(item, BaseException):
                await done.put(item)
                return
            try:
                result = await self._run(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await done.put(exc)
                return
            del item  # its inputs are freed (and their memory budget given back) before the next wait
            await done.put(result)
        await done.put(None)


def _nbytes(arrays: Sequence[np.ndarray]) -> int:
    return sum([a.nbytes for a in arrays])
