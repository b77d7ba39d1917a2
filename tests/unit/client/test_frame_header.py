"""Session._frame keeps the last frame's header while frames stay alike (the per-frame cost of a
shared-memory run is mostly Python): whatever differs from the last frame must still be checked and
described afresh, and frames that travel must be the arrays the daemon is told of."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rknn_client.errors import InvalidInput
from rknn_client.frame_spec import FrameSpec
from rknn_client.session import Session
from rknn_proto import codec, rknn_pb2

SHAPE = (1, 3, 4, 4)


def session() -> Session:
    reply = rknn_pb2.InitRuntimeResponse(
        session_id="s-1",
        inputs=[
            rknn_pb2.TensorAttr(
                index=0, name="x", shape=SHAPE, dtype=codec.dtype_to_wire(np.dtype(np.float32)), layout=1
            )
        ],
        outputs=[
            rknn_pb2.TensorAttr(
                index=0, name="y", shape=[1, 4], dtype=codec.dtype_to_wire(np.dtype(np.float32))
            )
        ],
    )
    return Session(SimpleNamespace(instance_id=""), reply, native_outputs=False)  # type: ignore[arg-type]


def frame(s: Session, x: np.ndarray, **options: object) -> tuple[rknn_pb2.InferenceHeader, list[np.ndarray]]:
    spec = FrameSpec(
        [x],
        options.get("layouts"),  # type: ignore[arg-type]
        options.get("pass_through"),  # type: ignore[arg-type]
        bool(options.get("strict", True)),
    )
    return s._frame(spec, int(options.get("frame_id", 0)))  # type: ignore[call-overload]


def test_a_frame_like_the_last_gets_its_header_and_travels_as_given() -> None:
    s = session()
    first, second = np.zeros(SHAPE, np.float32), np.ones(SHAPE, np.float32)
    header, _ = frame(s, first)
    again, wire_again = frame(s, second)
    assert again is header  # nothing described again
    assert wire_again[0] is second  # the new frame's own array, not the last one's
    assert list(again.inputs[0].shape) == list(SHAPE) and again.inputs[0].byte_length == second.nbytes


def test_a_dtype_unlike_the_models_is_refused_after_frames_that_were_not() -> None:
    s = session()
    frame(s, np.zeros(SHAPE, np.float32))
    with pytest.raises(InvalidInput, match="float64"):
        frame(s, np.zeros(SHAPE, np.float64))
    header, _ = frame(s, np.zeros(SHAPE, np.float64), strict=False)  # the daemon's to convert, then
    assert header.inputs[0].dtype == codec.dtype_to_wire(np.dtype(np.float64))


def test_whatever_changes_the_header_gets_a_new_one() -> None:
    s = session()
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    header, _ = frame(s, x)
    other_shape, _ = frame(s, np.zeros((1, 3, 8, 2), np.float32))
    assert list(other_shape.inputs[0].shape) == [1, 3, 8, 2]
    nhwc, _ = frame(s, x, layouts=["NHWC"])
    assert nhwc.inputs[0].layout == codec.layout_to_wire("NHWC")
    through, _ = frame(s, x, pass_through=[True])
    assert through.inputs[0].pass_through
    back, _ = frame(s, x)
    assert back.inputs[0].layout == header.inputs[0].layout and not back.inputs[0].pass_through


def test_arrays_that_must_be_converted_to_travel_are_converted_every_time() -> None:
    s = session()
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    frame(s, x)
    for _ in range(2):  # the second time as much as the first
        strided = np.arange(np.prod(SHAPE) * 2, dtype=np.float32).reshape(1, 3, 4, 8)[..., ::2]
        _, wire = frame(s, strided)
        assert wire[0].flags.c_contiguous and np.array_equal(wire[0], strided)
        swapped = x.astype(">f4")
        _, wire = frame(s, swapped, strict=False)
        assert wire[0].dtype == np.dtype("<f4") and np.array_equal(wire[0], x)


def test_frames_with_an_id_get_headers_of_their_own() -> None:
    s = session()
    x = np.zeros(SHAPE, np.float32)
    zero, _ = frame(s, x)
    one, _ = frame(s, x, frame_id=1)
    two, _ = frame(s, x, frame_id=2)
    assert (one.frame_id, two.frame_id, zero.frame_id) == (1, 2, 0)
    assert one is not two and one.inputs == zero.inputs


def test_outputs_declared_like_the_last_ones_are_checked_once_and_others_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon answers frame after frame with the same outputs: their metas are checked once, and
    each frame's own bytes are what it reads. Outputs declared otherwise are checked again."""
    s = session()
    checks = []
    real = codec.check_metas
    monkeypatch.setattr(codec, "check_metas", lambda *args: checks.append(1) or real(*args))

    def received(y: np.ndarray, byte_length: int | None = None) -> np.ndarray:
        meta = codec.meta_of(y, "y")
        meta.byte_length = y.nbytes if byte_length is None else byte_length
        assembler = s.new_output_assembler(rknn_pb2.OutputsHeader(outputs=[meta]))
        assembler.add_bytes(0, 0, y.tobytes())
        (out,) = assembler.arrays()
        return out

    for value in range(3):
        y = np.full((1, 4), value, np.float32)
        np.testing.assert_array_equal(received(y), y)
    assert len(checks) == 1
    wider = np.arange(8, dtype=np.float32).reshape(1, 8)
    np.testing.assert_array_equal(received(wider), wider)
    assert len(checks) == 2
    with pytest.raises(codec.CodecError, match="byte_length 12 does not match"):
        received(np.zeros((1, 4), np.float32), byte_length=12)
