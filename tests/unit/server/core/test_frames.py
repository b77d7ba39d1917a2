"""The frame intake: shapes, sizes and limits are checked once, before any byte is kept."""

from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rknn_proto import codec, framing, rknn_pb2
from rknn_server.core import frames
from rknn_server.core.frames import Declared, IncomingFrame, check_inputs, take_arrays
from rknn_server.core.memory import MemoryBudget
from rknn_server.core.sessions import Session
from rknn_server.errors import InvalidInput, ResourceExhausted
from rknn_server.runtime.base import RuntimeOptions
from rknn_server.runtime.rknnrt import tensors
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


# An NCHW model input of librknnrt, which takes 4-D data in either layout (it is told which).
RKNNRT_INPUT = replace(INPUT, convertible_layouts=tensors.CONVERTIBLE_INPUT_LAYOUTS)


def transposes(x: np.ndarray, layout: str) -> tuple[int, str]:
    """How many times data sent as `layout` is transposed on its way into an rknnrt-like runtime (the
    intake's transpose, then the runtime's own to NHWC), and the layout the runtime is told."""
    runtime = FakeRuntime(Path("m.rknn"), RuntimeOptions())
    runtime.inputs = [RKNNRT_INPUT]
    frame = IncomingFrame.start(
        header(x, layout=layout),
        Session("s" * 32, "d" * 64, RuntimeOptions(), runtime, 60.0),
        codec.TensorLimits(),
        MemoryBudget(0),
    )
    for chunk in codec.iter_chunks([x], chunk_bytes=64):
        frame.add(chunk)
    (received,) = frame.inputs()
    (fmt,) = frame.formats()
    nhwc = tensors.to_nhwc(received, fmt)
    np.testing.assert_array_equal(nhwc, x if layout == "NHWC" else x.transpose(0, 2, 3, 1))
    by_intake = 0 if np.shares_memory(received, frame.assembler.buffers[0]) else 1
    by_runtime = 0 if nhwc is received else 1
    return by_intake + by_runtime, fmt.layout


def test_nhwc_data_for_an_rknnrt_nchw_input_is_not_transposed_at_all() -> None:
    x = np.arange(48, dtype=np.float32).reshape(1, 4, 4, 3)
    assert transposes(x, "NHWC") == (0, "NHWC")


def test_nchw_data_for_an_rknnrt_nchw_input_is_transposed_once_by_the_runtime() -> None:
    x = np.arange(48, dtype=np.float32).reshape(1, 3, 4, 4)
    assert transposes(x, "NCHW") == (1, "NCHW")


def test_a_runtime_that_takes_both_layouts_still_gets_its_shape_checked() -> None:
    with pytest.raises(InvalidInput, match=r"has shape \[1, 4, 4, 2\] \(NHWC\)"):
        check_inputs([RKNNRT_INPUT], [codec.meta_of(np.zeros((1, 4, 4, 2), np.float32), layout="NHWC")])


def test_pass_through_data_is_brought_into_the_models_own_layout() -> None:
    x = np.arange(48, dtype=np.float32).reshape(1, 4, 4, 3)
    (plan,) = check_inputs([RKNNRT_INPUT], [codec.meta_of(x, layout="NHWC", pass_through=True)])
    assert plan.permutation == (0, 3, 1, 2) and plan.format.layout == "NCHW"


def test_a_session_checks_a_frame_declared_like_its_last_one_once_and_every_other_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session keeps its last frame's intake; a frame declaring anything else (shape, dtype,
    layout, byte length) or checked under other limits is checked again, and refused as ever."""
    own, budget, limits = session(), MemoryBudget(0), codec.TensorLimits()
    x = np.zeros((1, 3, 4, 4), np.float32)
    checks: list[str] = []
    real_metas, real_inputs = codec.check_metas, frames.check_inputs

    def counted_metas(*args: object, **kwargs: object) -> object:
        checks.append("limits")
        return real_metas(*args, **kwargs)  # type: ignore[arg-type]

    def counted_inputs(*args: object) -> object:
        checks.append("model")
        return real_inputs(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(codec, "check_metas", counted_metas)
    monkeypatch.setattr(frames, "check_inputs", counted_inputs)
    for _ in range(3):
        IncomingFrame.start(header(x), own, limits, budget)
    assert checks == ["limits", "model"]

    checks.clear()
    nhwc = IncomingFrame.start(header(x.transpose(0, 2, 3, 1), layout="NHWC"), own, limits, budget)
    assert checks == ["limits", "model"] and nhwc.formats()[0].layout == "NCHW"
    assert nhwc.plans[0].permutation == (0, 3, 1, 2)  # not the last frame's plan
    with pytest.raises(InvalidInput, match=r"has shape \[1, 3, 4, 5\]"):
        IncomingFrame.start(header(np.zeros((1, 3, 4, 5), np.float32)), own, limits, budget)
    with pytest.raises(InvalidInput, match="the model expects float32"):
        IncomingFrame.start(header(x.astype(np.float16)), own, limits, budget)
    IncomingFrame.start(header(x), own, limits, budget)
    lying = header(x)
    lying.inputs[0].byte_length -= 4
    with pytest.raises(codec.CodecError, match="byte_length 188 does not match"):
        IncomingFrame.start(lying, own, limits, budget)
    with pytest.raises(codec.LimitExceeded, match="max_tensor_bytes=64"):
        IncomingFrame.start(header(x), own, replace(limits, max_tensor_bytes=64), budget)
    assert IncomingFrame.start(header(x), own, limits, budget).plans[0].permutation is None
