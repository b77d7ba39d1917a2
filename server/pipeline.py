"""The InferencePipeline RPC: many frames on one stream, with receive, run and send overlapped.

Three stages joined by small bounded queues: a reader task assembles frames from the request
stream, a runner task runs them one after another in arrival order, and the handler itself sends
each frame's outputs. While frame N runs, frame N+1 is being received and frame N-1's outputs are
being sent, so on a slow link the transfers hide behind compute. The bounded queues (and gRPC flow
control behind them) keep at most a few frames in the daemon's memory, whatever the client sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import numpy as np

from rknn_proto import codec, rknn_pb2
from rknn_server.data_plane import DataPlane
from rknn_server.errors import InvalidInput
from rknn_server.frames import IncomingFrame, wire_outputs
from rknn_server.guard import client_identity
from rknn_server.runtime.base import InputFormat
from rknn_server.sessions import Session

# Frames assembled but not yet running, and frames run but not yet sent (each besides the one in
# that stage's hands): enough to keep every stage busy, few enough to bound memory.
QUEUE_FRAMES = 1


@dataclass
class _Ready:
    """A fully received frame."""

    header: rknn_pb2.InferenceHeader
    session: Session
    inputs: list[np.ndarray]
    formats: list[InputFormat]


@dataclass
class _Done:
    """A run frame's outputs, ready to send."""

    header: rknn_pb2.OutputsHeader
    wire: list[np.ndarray]


@dataclass
class Traffic:
    """Bytes moved by one stream, for the RPC's log event."""

    bytes_in: int = 0
    bytes_out: int = 0
    frames: int = 0
    session: str = ""


class Pipeline:
    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    async def stream(
        self, requests: AsyncIterator[rknn_pb2.InferenceRequest], traffic: Traffic
    ) -> AsyncGenerator[rknn_pb2.InferenceResponse, None]:
        """The response stream; raises the first error of any stage (frames before it were sent)."""
        ready: asyncio.Queue[_Ready | BaseException | None] = asyncio.Queue(QUEUE_FRAMES)
        done: asyncio.Queue[_Done | BaseException | None] = asyncio.Queue(QUEUE_FRAMES)
        tasks = [
            asyncio.create_task(self._receive(requests, ready, traffic)),
            asyncio.create_task(self._execute(ready, done)),
        ]
        try:
            while (item := await done.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield rknn_pb2.InferenceResponse(header=item.header)
                for message in codec.chunk_responses(item.wire):
                    yield message
                traffic.bytes_out += sum(a.nbytes for a in item.wire)
                traffic.frames += 1
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _receive(
        self,
        requests: AsyncIterator[rknn_pb2.InferenceRequest],
        ready: asyncio.Queue[_Ready | BaseException | None],
        traffic: Traffic,
    ) -> None:
        frame: IncomingFrame | None = None
        try:
            async for message in requests:
                if message.WhichOneof("part") == "header":
                    if frame is not None:
                        raise InvalidInput(
                            f"frame {frame.header.frame_id} is incomplete ({'; '.join(frame.assembler.missing())}) "
                            f"but the header of frame {message.header.frame_id} arrived"
                        )
                    session = self._plane.session(message.header.session_id, client_identity())
                    traffic.session = session.id
                    frame = IncomingFrame.start(
                        message.header, session, self._plane.tensor_limits, self._plane.frame_memory
                    )
                elif frame is None:
                    raise InvalidInput("InferencePipeline: a TensorChunk arrived before any InferenceHeader")
                else:
                    traffic.bytes_in += frame.add(message.chunk)
                if frame is not None and frame.assembler.complete:
                    await ready.put(_Ready(frame.header, frame.session, frame.inputs(), frame.formats()))
                    frame = None
            if frame is not None:
                frame.ensure_complete(f"frame {frame.header.frame_id}")
            await ready.put(None)
        except BaseException as exc:
            if frame is not None:
                frame.drop()
            if isinstance(exc, Exception):
                await ready.put(exc)
            else:
                raise

    async def _execute(
        self,
        ready: asyncio.Queue[_Ready | BaseException | None],
        done: asyncio.Queue[_Done | BaseException | None],
    ) -> None:
        while (item := await ready.get()) is not None:
            if isinstance(item, BaseException):
                await done.put(item)
                return
            try:
                ran = await self._plane.run(item.session, item.inputs, item.formats)
                metas, wire = wire_outputs(
                    ran.outputs, item.session.runtime.outputs, item.header.native_outputs
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await done.put(exc)
                return
            header = rknn_pb2.OutputsHeader(
                outputs=metas, run_time_us=ran.run_time_us, frame_id=item.header.frame_id
            )
            await done.put(_Done(header, wire))
        await done.put(None)
