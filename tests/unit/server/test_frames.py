"""The frame intake: shapes, sizes and limits are checked once, before any byte is kept."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from rknn_proto import codec, framing, rknn_pb2
from rknn_server.errors import InvalidInput, ResourceExhausted
from rknn_server.frames import Declared, IncomingFrame, check_inputs, take_arrays
from rknn_server.memory import MemoryBudget
from rknn_server.runtime.base import RuntimeOptions
from rknn_server.sessions import Session
from tests.unit.server.fakes import INPUT, FakeRuntime


def session() -> Session:
    return Session("s" * 32, "d" * 64, RuntimeOptions(), FakeRuntime(Path("m.onnx"), RuntimeOptions()), 60.0)


def header(*arrays: np.ndarray, layout: str = "UNDEFINED") -> rknn_pb2.InferenceHeader:
    return rknn_pb2.InferenceHeader(
        session_id="s" * 32, inputs=[codec.meta_of(a, layout=layout) for a in arrays]
    )


def test_a_nhwc_input_is_transposed_once_into_the_models_nchw() -> None:
    x = np.arange(48, dtype=np.float32).reshape(1, 4, 4, 3)
    frame = IncomingFrame.start(header(x, layout="NHWC"), session(), codec.TensorLimits(), MemoryBudget(0))
    for chunk in codec.iter_chunks([x], chunk_bytes=64):
        frame.add(chunk)
    assert frame.complete
    (received,) = frame.inputs()
    np.testing.assert_array_equal(received, x.transpose(0, 3, 1, 2))
    assert frame.formats()[0].layout == "NCHW"


@pytest.mark.parametrize(
    ("array", "fragment"),
    [
        (np.zeros((1, 3, 4, 5), np.float32), "has shape [1, 3, 4, 5]"),
        (np.zeros((1, 3, 4, 4), np.int32), "the model expects float32"),
    ],
)
def test_an_input_that_does_not_fit_the_model_is_refused_before_its_bytes(array, fragment) -> None:
    with pytest.raises(InvalidInput, match=fragment.replace("[", r"\[")):
        check_inputs([INPUT], [codec.meta_of(array)])
    with pytest.raises(InvalidInput, match="the model has 1 input"):
        check_inputs([INPUT], [codec.meta_of(array), codec.meta_of(array)])


def test_the_memory_budget_refuses_a_frame_and_gets_its_bytes_back_when_a_frame_is_dropped() -> None:
    x = np.zeros((1, 3, 4, 4), np.float32)
    budget = MemoryBudget(x.nbytes)
    frame = IncomingFrame.start(header(x), session(), codec.TensorLimits(), budget)
    assert budget.used == x.nbytes
    with pytest.raises(ResourceExhausted, match="max_memory"):
        IncomingFrame.start(header(x), session(), codec.TensorLimits(), budget)
    del frame
    gc.collect()
    assert budget.used == 0
    # A stream that ends inside a frame gives the frame's bytes back at once, not at a collection.
    reader = framing.FrameReader(lambda h: IncomingFrame.start(h, session(), codec.TensorLimits(), budget))
    half = rknn_pb2.InferenceRequest(chunk=next(codec.iter_chunks([x], chunk_bytes=x.nbytes // 2)))
    with pytest.raises(framing.TruncatedFrame, match="the stream ended inside frame 1"):
        list(framing.read_frames([rknn_pb2.InferenceRequest(header=header(x)), half], reader))
    assert budget.used == 0


def test_a_chunk_over_the_limit_is_refused() -> None:
    x = np.zeros((1, 3, 4, 4), np.float32)
    limits = codec.TensorLimits(max_chunk_bytes=64)
    frame = IncomingFrame.start(header(x), session(), limits, MemoryBudget(0))
    with pytest.raises(ResourceExhausted, match="max_chunk_bytes=64"):
        frame.add(next(codec.iter_chunks([x], chunk_bytes=128)))


def test_whole_arrays_go_through_the_same_intake() -> None:
    x = np.arange(48, dtype=np.float32).reshape(1, 4, 4, 3)
    arrays, formats = take_arrays([INPUT], [x], [Declared.of(x, "NHWC")])
    np.testing.assert_array_equal(arrays[0], x.transpose(0, 3, 1, 2))
    assert formats[0].layout == "NCHW" and arrays[0].flags.c_contiguous
    with pytest.raises(InvalidInput, match="has shape"):
        take_arrays([INPUT], [x], [Declared.of(x, "NCHW")])
    with pytest.raises(InvalidInput, match="not the declared"):
        take_arrays([INPUT], [x[..., :2]], [Declared.of(x, "NHWC")])
    with pytest.raises(InvalidInput, match="the model has 1 input"):
        take_arrays([INPUT], [x, x], [Declared.of(x, "NHWC")] * 2)


def test_a_whole_input_is_read_where_it_arrived_without_a_copy() -> None:
    x = np.arange(48, dtype=np.float32).reshape(1, 3, 4, 4)
    data = x.tobytes()
    frame = framing.whole_frame(
        IncomingFrame.start(header(x), session(), codec.TensorLimits(), MemoryBudget(0)), [data], 1
    )
    (received,) = frame.inputs()
    np.testing.assert_array_equal(received, x)
    assert received.base is not None and not received.flags.writeable  # a view of the message's bytes
    assert memoryview(received).obj is not None and bytes(received.data) == data
