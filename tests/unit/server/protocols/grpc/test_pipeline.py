"""Frames through the data plane in-process (fake backend): the one-frame Inference, the unary Run
and the pipelined stream share one intake, and a frame is refused before it computes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rknn_proto import codec, framing, rknn_pb2
from rknn_server.core.data_plane import DataPlane, OpenRequest
from rknn_server.errors import InvalidInput, ResourceExhausted
from rknn_server.observe.calls import Call
from rknn_server.protocols.grpc.pipeline import MAX_REPLY_BYTES, Pipeline
from tests.unit.server.core.test_data_plane import make_plane
from tests.unit.server.fakes import OUTPUT, FakeRuntime


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as pool:
        yield pool


def image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 4, 4)).astype(np.float32)


def frame(session_id: str, x: np.ndarray, frame_id: int = 0) -> list[rknn_pb2.InferenceRequest]:
    head = rknn_pb2.InferenceHeader(session_id=session_id, inputs=[codec.meta_of(x)], frame_id=frame_id)
    return list(framing.frame_messages(rknn_pb2.InferenceRequest, head, [x]))


async def all_given_back(plane: DataPlane, timeout_s: float = 10.0) -> None:
    """Wait until every frame buffer's memory budget is given back. A buffer is freed when its last
    reference goes, and the executor's worker drops the arguments of a run only after the caller
    has its result: the release may trail the call by a moment, never by much."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while plane.frame_memory.used and loop.time() < deadline:
        await asyncio.sleep(0.005)
    assert plane.frame_memory.used == 0


async def stream(messages: Iterable[rknn_pb2.InferenceRequest]) -> AsyncIterator[rknn_pb2.InferenceRequest]:
    for message in messages:
        yield message


def outputs(responses: list[bytes]) -> list[tuple[int, np.ndarray]]:
    """Each answered frame's id and output, read back with the client's own framing."""

    class Out(codec.TensorAssembler):
        def __init__(self, head: rknn_pb2.OutputsHeader) -> None:
            super().__init__(head.outputs, codec.TensorLimits(), "output")
            self.frame_id = head.frame_id

    messages = [framing.parse_inference_response(r) for r in responses]
    return [(f.frame_id, f.arrays()[0]) for f in framing.read_frames(messages, framing.FrameReader(Out))]


async def opened(tmp_path: Path, executor: ThreadPoolExecutor) -> tuple[DataPlane, Pipeline, str]:
    plane, digest = make_plane(tmp_path, executor)
    session = await plane.open(OpenRequest(digest, ""))  # "" is the caller outside an RPC
    return plane, Pipeline(plane), session.id


def test_inference_is_a_one_frame_pipeline(tmp_path, executor) -> None:
    async def main() -> None:
        _, pipeline, sid = await opened(tmp_path, executor)
        x = image()
        call = Call("Inference", "uid:0")
        one = [m async for m in pipeline.one(stream(frame(sid, x, 7)), call)]
        many = [
            m async for m in pipeline.stream(stream(frame(sid, x, 7)), Call("InferencePipeline", "uid:0"))
        ]
        assert [(i, a.tobytes()) for i, a in outputs(one)] == [(i, a.tobytes()) for i, a in outputs(many)]
        ((frame_id, y),) = outputs(one)
        assert frame_id == 7
        np.testing.assert_array_equal(y, x * 2)
        assert (call.bytes_in, call.bytes_out, call.frames) == (x.nbytes, x.nbytes, 1)

    asyncio.run(main())


def test_inference_refuses_a_second_frame_and_an_empty_stream(tmp_path, executor) -> None:
    async def main() -> None:
        plane, pipeline, sid = await opened(tmp_path, executor)
        runtime = plane.session(sid, "").runtime
        assert isinstance(runtime, FakeRuntime)
        runtime.running.clear()
        two = frame(sid, image(0), 1) + frame(sid, image(1), 2)
        with pytest.raises(InvalidInput, match="Inference takes one frame"):
            [m async for m in pipeline.one(stream(two), Call("InferencePipeline", "uid:0"))]
        with pytest.raises(InvalidInput, match="empty; expected an InferenceHeader"):
            [m async for m in pipeline.one(stream([]), Call("InferencePipeline", "uid:0"))]
        assert not runtime.running.is_set()  # nothing was computed
        await all_given_back(plane)

    asyncio.run(main())


def test_the_pipeline_answers_every_frame_in_order(tmp_path, executor) -> None:
    async def main() -> None:
        _, pipeline, sid = await opened(tmp_path, executor)
        xs = [image(i) for i in range(5)]
        messages = [m for i, x in enumerate(xs) for m in frame(sid, x, i + 1)]
        call = Call("Inference", "uid:0")
        got = outputs([m async for m in pipeline.stream(stream(messages), call)])
        assert [i for i, _ in got] == [1, 2, 3, 4, 5]
        for (_, y), x in zip(got, xs, strict=True):
            np.testing.assert_array_equal(y, x * 2)
        assert call.frames == 5 and call.bytes_in == sum(x.nbytes for x in xs)

    asyncio.run(main())


def test_a_stream_ending_inside_a_frame_answers_the_earlier_ones_then_fails(tmp_path, executor) -> None:
    async def main() -> None:
        plane, pipeline, sid = await opened(tmp_path, executor)
        messages = frame(sid, image(0), 1) + frame(sid, image(1), 2)[:1]
        got: list[bytes] = []
        with pytest.raises(framing.TruncatedFrame, match="the stream ended inside frame 2"):
            async for message in pipeline.stream(stream(messages), Call("InferencePipeline", "uid:0")):
                got.append(message)
        assert [i for i, _ in outputs(got)] == [1]
        await all_given_back(plane)

    asyncio.run(main())


def test_unary_run_goes_through_the_same_intake(tmp_path, executor) -> None:
    async def main() -> None:
        plane, pipeline, sid = await opened(tmp_path, executor)
        x = image()
        head = frame(sid, x)[0].header
        done = await pipeline.unary(head, [x.tobytes()], Call("InferencePipeline", "uid:0"))
        np.testing.assert_array_equal(done.wire[0], x * 2)
        with pytest.raises(InvalidInput, match="has shape"):
            wrong = np.zeros((1, 3, 4, 5), np.float32)
            await pipeline.unary(
                frame(sid, wrong)[0].header, [wrong.tobytes()], Call("InferencePipeline", "uid:0")
            )
        with pytest.raises(framing.TruncatedFrame, match="input 0: 100 of 192 bytes"):
            await pipeline.unary(head, [x.tobytes()[:100]], Call("InferencePipeline", "uid:0"))
        await all_given_back(plane)

    asyncio.run(main())


def test_unary_run_refuses_outputs_known_too_large_before_computing(tmp_path, executor) -> None:
    async def main() -> None:
        plane, pipeline, sid = await opened(tmp_path, executor)
        runtime = plane.session(sid, "").runtime
        assert isinstance(runtime, FakeRuntime)
        runtime.outputs = [replace(OUTPUT, shape=(1, MAX_REPLY_BYTES // 4 + 1))]
        runtime.running.clear()
        x = image()
        with pytest.raises(ResourceExhausted, match=r"too large for one Run message.*streaming Inference"):
            await pipeline.unary(frame(sid, x)[0].header, [x.tobytes()], Call("InferencePipeline", "uid:0"))
        assert not runtime.running.is_set()
        # An output of unknown size is computed and answered, whatever its size turns out to be.
        runtime.outputs = [replace(OUTPUT, shape=(1, -1, 4, 4))]
        done = await pipeline.unary(
            frame(sid, x)[0].header, [x.tobytes()], Call("InferencePipeline", "uid:0")
        )
        assert runtime.running.is_set() and done.wire[0].nbytes == x.nbytes

    asyncio.run(main())
