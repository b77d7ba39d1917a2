"""The one frame reader and writer: frames round-trip whatever the chunking, and a stream that breaks
the framing rules is refused with an error that says what arrived and what was expected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from rknn_proto import codec, framing, rknn_pb2

LIMITS = codec.TensorLimits()


def arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.standard_normal((2, 3, 5)).astype(np.float32),
        np.zeros((0, 4), np.int8),  # an empty tensor sends no chunk
        np.arange(11, dtype=np.uint16),
    ]


def header(*items: np.ndarray, frame_id: int = 0) -> rknn_pb2.OutputsHeader:
    return rknn_pb2.OutputsHeader(outputs=[codec.meta_of(a) for a in items], frame_id=frame_id)


class Outputs(codec.TensorAssembler):
    """A frame as a client assembles it: the header kept beside the bytes."""

    def __init__(self, head: rknn_pb2.OutputsHeader, limits: codec.TensorLimits = LIMITS) -> None:
        super().__init__(head.outputs, limits, "output")
        self.header = head
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True
        super().drop()


def reader() -> framing.FrameReader[rknn_pb2.OutputsHeader, Outputs]:
    return framing.FrameReader(Outputs, describe_header="OutputsHeader")


def chunked(
    head: rknn_pb2.OutputsHeader, items: list[np.ndarray], size: int
) -> list[rknn_pb2.InferenceResponse]:
    """A frame's messages with chunks of `size` bytes (the writer picks its own size)."""
    return [rknn_pb2.InferenceResponse(header=head)] + [
        rknn_pb2.InferenceResponse(chunk=c) for c in codec.iter_chunks(items, chunk_bytes=size)
    ]


def assert_frame(frame: Outputs, items: list[np.ndarray]) -> None:
    for got, want in zip(frame.arrays(), items, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_frames_written_then_read_come_back_equal_and_in_order() -> None:
    first, second = arrays(), [a[::-1].copy() for a in arrays()]
    stream = [
        *framing.frame_messages(rknn_pb2.InferenceResponse, header(*first, frame_id=1), first),
        *framing.frame_messages(rknn_pb2.InferenceResponse, header(*second, frame_id=2), second),
    ]
    frames = list(framing.read_frames(stream, reader()))
    assert [f.header.frame_id for f in frames] == [1, 2]
    assert_frame(frames[0], first)
    assert_frame(frames[1], second)


@pytest.mark.parametrize("size", [1, 7, 64, 120, 1 << 20])
def test_any_chunk_boundary_assembles_the_same_bytes(size: int) -> None:
    items = arrays()
    r = reader()
    (frame,) = framing.read_frames(chunked(header(*items), items, size), r)
    assert_frame(frame, items)
    assert r.bytes == sum(a.nbytes for a in items)


def test_a_frame_of_empty_tensors_is_complete_at_its_header() -> None:
    empty = [np.zeros((0,), np.float32)]
    (frame,) = framing.read_frames([rknn_pb2.InferenceResponse(header=header(*empty))], reader())
    assert frame.arrays()[0].shape == (0,)


def test_the_async_reader_reads_what_the_sync_one_does() -> None:
    items = arrays()

    async def messages(
        stream: Iterable[rknn_pb2.InferenceResponse],
    ) -> AsyncIterator[rknn_pb2.InferenceResponse]:
        for message in stream:
            yield message

    async def main() -> list[Outputs]:
        stream = chunked(header(*items, frame_id=5), items, 9) * 2
        return [f async for f in framing.aread_frames(messages(stream), reader())]

    frames = asyncio.run(main())
    assert [f.header.frame_id for f in frames] == [5, 5]
    for frame in frames:
        assert_frame(frame, items)


def test_a_stream_ending_inside_a_frame_is_refused_and_its_buffers_dropped() -> None:
    items = arrays()
    messages = chunked(header(*items), items, 16)[:-1]
    r = reader()
    frames = framing.read_frames(messages, r)
    with pytest.raises(
        framing.TruncatedFrame, match=r"the stream ended inside frame 1 \(.*output 2: 16 of 22 bytes\)"
    ):
        list(frames)
    assert r.bytes == sum(a.nbytes for a in items) - 6


@pytest.mark.parametrize(
    ("stream", "fragment"),
    [
        (
            [rknn_pb2.InferenceResponse(chunk=rknn_pb2.TensorChunk(data=b"x"))],
            "a TensorChunk arrived before any OutputsHeader",
        ),
        ([rknn_pb2.InferenceResponse()], "part None arrived; expected a OutputsHeader or a chunk"),
        (
            [rknn_pb2.InferenceResponse(header=header(np.zeros(4, np.uint8)))] * 2,
            r"frame 1 is incomplete \(output 0: 0 of 4 bytes\) but the OutputsHeader of the next arrived",
        ),
        (
            [
                rknn_pb2.InferenceResponse(header=header(np.zeros(4, np.uint8))),
                rknn_pb2.InferenceResponse(chunk=rknn_pb2.TensorChunk(offset=2, data=b"ab")),
            ],
            "at offset 2; expected offset 0",
        ),
        (
            [
                rknn_pb2.InferenceResponse(header=header(np.zeros(4, np.uint8), np.zeros(4, np.uint8))),
                rknn_pb2.InferenceResponse(chunk=rknn_pb2.TensorChunk(tensor_index=1, data=b"ab")),
            ],
            "chunk for output 1 arrived out of order; expected a chunk of output 0",
        ),
        (
            [
                rknn_pb2.InferenceResponse(header=header(np.zeros(4, np.uint8))),
                rknn_pb2.InferenceResponse(chunk=rknn_pb2.TensorChunk(data=b"abcdef")),
            ],
            "received 6 bytes; its meta declared 4",
        ),
    ],
)
def test_a_stream_that_breaks_the_framing_is_refused_saying_why(stream, fragment: str) -> None:
    r = reader()
    with pytest.raises(codec.CodecError, match=fragment):
        list(framing.read_frames(stream, r))


def test_a_header_over_the_limits_is_refused_before_any_buffer() -> None:
    huge = rknn_pb2.TensorMeta(
        dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=[1 << 20, 1 << 20], byte_length=4 << 40
    )
    r = framing.FrameReader(lambda h: Outputs(h, codec.TensorLimits(max_tensor_bytes=1 << 20)))
    with pytest.raises(codec.LimitExceeded, match="max_tensor_bytes"):
        list(
            framing.read_frames(
                [rknn_pb2.InferenceResponse(header=rknn_pb2.OutputsHeader(outputs=[huge]))], r
            )
        )


def test_a_frame_that_fails_mid_stream_is_dropped() -> None:
    made: list[Outputs] = []

    def start(head: rknn_pb2.OutputsHeader) -> Outputs:
        made.append(Outputs(head))
        return made[-1]

    stream = [
        rknn_pb2.InferenceResponse(header=header(np.zeros(4, np.uint8))),
        rknn_pb2.InferenceResponse(chunk=rknn_pb2.TensorChunk(offset=1, data=b"a")),
    ]
    with pytest.raises(codec.CodecError):
        list(framing.read_frames(stream, framing.FrameReader(start)))
    assert made[0].dropped


def test_a_whole_frame_takes_each_tensor_at_once_and_checks_the_count_and_sizes() -> None:
    items = arrays()
    head = header(*items)
    frame = framing.whole_frame(Outputs(head), [a.tobytes() for a in items], len(items), "output")
    assert_frame(frame, items)
    with pytest.raises(framing.FrameError, match="2 output byte strings were sent for 3 declared output"):
        framing.whole_frame(Outputs(head), [b"", b""], len(items), "output")
    short = Outputs(head)
    with pytest.raises(framing.TruncatedFrame, match="output 2: 20 of 22 bytes"):
        framing.whole_frame(short, [a.tobytes() for a in items[:2]] + [b"\0" * 20], 3, "output")
    assert short.dropped
    with pytest.raises(codec.CodecError, match="received 23 bytes; its meta declared 22"):
        framing.whole_frame(Outputs(head), [a.tobytes() for a in items[:2]] + [b"\0" * 23], 3, "output")


@pytest.mark.parametrize("session_id", ["", "s", "s" * 32, "s" * 45])  # headers of every length mod 16
def test_a_run_request_written_by_hand_is_what_protobuf_reads_with_each_input_aligned(
    session_id: str,
) -> None:
    items = [*arrays(), np.zeros(300, np.float32), np.ones(7, np.int8)]  # 300: a two-byte varint length
    head = rknn_pb2.InferenceHeader(
        session_id=session_id, inputs=[codec.meta_of(a) for a in items], frame_id=3
    )
    written = framing.run_request_bytes(head, items)
    parsed = rknn_pb2.RunRequest.FromString(written)
    assert parsed.header == head and list(parsed.inputs) == [a.tobytes() for a in items]
    # Only filler beside protobuf's own serialization of the same request:
    plain = rknn_pb2.RunRequest(header=head, inputs=[a.tobytes() for a in items]).SerializeToString()
    parsed.ClearField("padding")
    assert parsed.SerializeToString() == plain
    message = np.frombuffer(written, np.uint8)
    base = message.ctypes.data
    for a, view in zip(items, framing.parse_run_request(written).tensors, strict=True):
        offset = np.frombuffer(view, np.uint8).ctypes.data - base if a.nbytes else 0
        assert offset % framing.ALIGNMENT == 0, (a.dtype, a.shape, offset)


def test_a_run_response_written_by_hand_is_protobufs_own_bytes() -> None:
    items = [*arrays(), np.zeros(300, np.float32)]  # the last: a length that takes a two-byte varint
    head = header(*items, frame_id=7)
    head.run_time_us = 1234
    written = framing.run_response_bytes(head, items)
    assert (
        written == rknn_pb2.RunResponse(header=head, outputs=[a.tobytes() for a in items]).SerializeToString()
    )


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return bytes([(number << 3) | wire_type]) + payload


@pytest.mark.parametrize("parse", [framing.parse_run_request, framing.parse_run_response])
def test_a_unary_frame_is_read_as_protobuf_reads_it(parse) -> None:  # type: ignore[no-untyped-def]
    """Written by protobuf, with what its parser accepts beyond the plain layout: the header in two
    parts (merged), unknown fields of every wire type between the tensors (skipped)."""
    message_type = rknn_pb2.RunRequest if parse is framing.parse_run_request else rknn_pb2.RunResponse
    items = arrays()
    first = message_type(
        header={"frame_id": 9}, **{message_type.DESCRIPTOR.fields[1].name: [items[0].tobytes()]}
    )
    second = message_type(
        header={"session_id": "a"} if message_type is rknn_pb2.RunRequest else {"run_time_us": 5}
    )
    unknown = (
        _field(10, 0, b"\x96\x01")  # varint
        + _field(11, 1, b"\0" * 8)  # 64-bit
        + _field(12, 5, b"\0" * 4)  # 32-bit
        + _field(13, 2, b"\x03abc")  # length-delimited
    )
    third = message_type(**{message_type.DESCRIPTOR.fields[1].name: [a.tobytes() for a in items[1:]]})
    data = first.SerializeToString() + unknown + second.SerializeToString() + third.SerializeToString()
    expected = message_type.FromString(data)
    frame = parse(data)
    assert frame.header == expected.header and frame.header.frame_id == 9
    tensors = getattr(expected, message_type.DESCRIPTOR.fields[1].name)
    assert [bytes(t) for t in frame.tensors] == list(tensors) == [a.tobytes() for a in items]
    assert all(isinstance(t, memoryview) for t in frame.tensors)  # views into the message, not copies


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\x12\x05abc", "declares 5 bytes; 3 remain"),  # a tensor longer than the message
        (b"\x12\xff", "truncated or overlong varint"),  # a length cut short
        (b"\x1d\0\0", "parsing"),  # a 32-bit field cut short (read by protobuf)
        (b"\x00\x01", "parsing"),  # field number 0
        (b"\x13", "parsing"),  # a group
        (b"\x0a\x02\xff\xff", "parsing"),  # a header that is not an InferenceHeader
    ],
)
def test_a_malformed_unary_frame_is_refused_as_protobuf_refuses_it(data: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError):
        rknn_pb2.RunRequest.FromString(data)
    with pytest.raises(DecodeError, match=fragment):
        framing.parse_run_request(data)


def test_a_tensor_is_used_in_place_only_where_any_dtype_may_read_it() -> None:
    buffer = np.zeros(64 + framing.ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % framing.ALIGNMENT
    message = memoryview(buffer)
    aligned, unaligned = message[start : start + 16], message[start + 1 : start + 17]
    kept, copied = framing.in_place([aligned, unaligned])
    assert kept is aligned
    assert isinstance(copied, bytes) and copied == unaligned.tobytes()


def test_a_message_of_many_fields_is_read_by_protobuf_with_the_same_meaning() -> None:
    """Past the fields a sender of this contract writes (or with fields it never writes), protobuf's
    own parser reads the message: the same tensors and header, none of a Python loop per field."""
    many_tensors = rknn_pb2.RunRequest(header={"frame_id": 4}, inputs=[b"", b"x"] * framing.MAX_PLAIN_FIELDS)
    many_unknown = rknn_pb2.RunRequest(inputs=[b"abc"]).SerializeToString() + _field(9, 0, b"\x01") * 100_000
    for data in (many_tensors.SerializeToString(), many_unknown):
        expected = rknn_pb2.RunRequest.FromString(data)
        frame = framing.parse_run_request(data)
        assert frame.header == expected.header
        assert [bytes(t) for t in frame.tensors] == list(expected.inputs)
