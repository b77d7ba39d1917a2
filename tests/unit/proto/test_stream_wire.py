"""The frame streams' messages written and read by hand (framing.frame_bytes, parse_inference_*):
what is written is protobuf's own bytes, what is read is always what protobuf makes of the same
bytes (a plain chunk's data a view of the received message), and bytes protobuf cannot parse are
a FrameError that says so."""

from __future__ import annotations

import random

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from rknn_proto import codec, framing, rknn_pb2

STREAMS = [
    (rknn_pb2.InferenceRequest, framing.parse_inference_request),
    (rknn_pb2.InferenceResponse, framing.parse_inference_response),
]


def _protobuf_chunk(message_type: type, index: int, offset: int, data: bytes) -> bytes:
    chunk = rknn_pb2.TensorChunk(tensor_index=index, offset=offset, data=data)
    return message_type(chunk=chunk).SerializeToString()  # type: ignore[no-any-return]


def _as_protobuf_reads_it(message_type: type, raw: bytes) -> object:
    message = message_type.FromString(raw)  # type: ignore[attr-defined]
    part = message.WhichOneof("part")
    if part != "chunk":
        return part if part is None else getattr(message, part)
    return message.chunk.tensor_index, message.chunk.offset, message.chunk.data


def _as_read_here(parse: object, raw: bytes) -> object:
    message = parse(raw)  # type: ignore[operator]
    if isinstance(message, framing.WireChunk):
        return message.tensor_index, message.offset, bytes(message.data)
    part = message.WhichOneof("part")
    if part != "chunk":
        return part if part is None else getattr(message, part)
    return message.chunk.tensor_index, message.chunk.offset, message.chunk.data


@pytest.mark.parametrize(
    ("index", "offset", "size"),
    [
        (0, 0, 0),
        (0, 0, 1),
        (3, 0, 127),
        (0, 128, 128),
        (1, 1 << 40, 16384),
        ((1 << 32) - 1, (1 << 64) - 1, 5),
    ],
)
@pytest.mark.parametrize(
    "message_type", [rknn_pb2.InferenceRequest, rknn_pb2.InferenceResponse, rknn_pb2.DumpLayersResponse]
)
def test_a_chunk_message_is_protobufs_own_bytes(
    message_type: type, index: int, offset: int, size: int
) -> None:
    data = bytes(random.Random(size).randbytes(size))
    expected = _protobuf_chunk(message_type, index, offset, data)
    assert framing.chunk_message(index, offset, data) == expected
    assert framing.chunk_message(index, offset, memoryview(data)) == expected


@pytest.mark.parametrize(("message_type", "parse"), STREAMS)
def test_a_plain_chunk_is_a_view_of_the_received_bytes(message_type: type, parse: object) -> None:
    raw = _protobuf_chunk(message_type, 2, 1 << 33, b"x" * 5000)
    chunk = parse(raw)  # type: ignore[operator]
    assert isinstance(chunk, framing.WireChunk) and isinstance(chunk.data, memoryview)
    assert chunk.data.obj is raw  # no copy
    assert (chunk.tensor_index, chunk.offset, bytes(chunk.data)) == (2, 1 << 33, b"x" * 5000)


def _wrap(chunk_fields: bytes) -> bytes:
    """A stream message whose chunk holds these encoded fields (under 128 bytes)."""
    return b"\x12" + bytes([len(chunk_fields)]) + chunk_fields


_DATA = b"\x01\x02\x03"
IRREGULAR = {
    "fields out of order": _wrap(b"\x10\x05\x08\x02\x1a\x03" + _DATA),
    "a field repeated, the last one wins": _wrap(b"\x08\x01\x08\x02\x10\x05\x1a\x03" + _DATA),
    "data repeated": _wrap(b"\x1a\x03abc\x1a\x03" + _DATA),
    "an unknown field after the data": _wrap(b"\x1a\x03" + _DATA + b"\x20\x07"),
    "an unknown field in the message": _protobuf_chunk(rknn_pb2.InferenceRequest, 1, 2, _DATA) + b"\x18\x01",
    "the chunk twice, merged": _protobuf_chunk(rknn_pb2.InferenceRequest, 1, 0, _DATA)
    + _protobuf_chunk(rknn_pb2.InferenceRequest, 0, 9, b""),
    "an overlong varint": _wrap(b"\x08\x81\x80\x00\x1a\x03" + _DATA),
    "a tensor index beyond uint32": _wrap(b"\x08\x80\x80\x80\x80\x10\x1a\x03" + _DATA),
    "no fields at all": _wrap(b""),
    "an empty header": b"\x0a\x00",
    "an empty message": b"",
}


@pytest.mark.parametrize("raw", IRREGULAR.values(), ids=IRREGULAR.keys())
@pytest.mark.parametrize(("message_type", "parse"), STREAMS)
def test_any_other_layout_reads_as_protobuf_reads_it(message_type: type, parse: object, raw: bytes) -> None:
    assert _as_read_here(parse, raw) == _as_protobuf_reads_it(message_type, raw)


@pytest.mark.parametrize(("message_type", "parse"), STREAMS)
def test_mangled_messages_read_as_protobuf_reads_them_or_are_a_frame_error(
    message_type: type, parse: object
) -> None:
    rng = random.Random(16)
    valid = _protobuf_chunk(message_type, 2, 123456789, bytes(range(40)))
    for _ in range(3000):
        raw = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        raw = raw[: rng.randint(0, len(raw))] if rng.random() < 0.3 else raw
        try:
            expected = _as_protobuf_reads_it(message_type, bytes(raw))
        except DecodeError:
            with pytest.raises(framing.FrameError):
                parse(bytes(raw))  # type: ignore[operator]
            continue
        assert _as_read_here(parse, bytes(raw)) == expected, bytes(raw).hex()


@pytest.mark.parametrize(
    "raw",
    [
        b"\x12\x05abc",  # a chunk longer than the message
        b"\x12\xff",  # a length cut short
        _wrap(b"\x1a\x05" + _DATA),  # data longer than its chunk
        b"\x13",  # a group
        b"\x0a\x02\xff\xff",  # a header that is not an InferenceHeader
    ],
)
def test_malformed_bytes_are_a_frame_error_naming_the_message(raw: bytes) -> None:
    with pytest.raises(framing.FrameError, match="a message that is no InferenceRequest arrived"):
        framing.parse_inference_request(raw)


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.standard_normal((3, 5)).astype(np.float32),
        np.zeros((0, 4), np.int8),  # an empty tensor sends no chunk
        rng.integers(0, 255, (5 << 20) + 3, dtype=np.uint8),  # many 1 MiB chunks, the last one odd
    ]


def test_a_frame_written_by_hand_is_protobufs_own_messages_and_reads_back_equal() -> None:
    items = _arrays()
    head = rknn_pb2.OutputsHeader(outputs=[codec.meta_of(a) for a in items], frame_id=3)
    moved: list[int] = []
    written = list(
        framing.frame_bytes(rknn_pb2.InferenceResponse(header=head).SerializeToString(), items, moved.append)
    )
    expected = [
        m.SerializeToString() for m in framing.frame_messages(rknn_pb2.InferenceResponse, head, items)
    ]
    assert written == expected and len(written) == 1 + 1 + 6
    assert moved == [items[0].nbytes] + [items[0].nbytes + min(n << 20, items[2].nbytes) for n in range(1, 7)]
    frames = list(
        framing.read_frames(
            [framing.parse_inference_response(m) for m in written],
            framing.FrameReader(lambda h: codec.TensorAssembler(h.outputs, codec.TensorLimits())),
        )
    )
    assert len(frames) == 1
    for got, want in zip(frames[0].arrays(), items, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("size", [1, 7, 4093, 1 << 20])
def test_chunks_of_any_size_written_by_protobuf_assemble_the_same_bytes(size: int) -> None:
    items = _arrays()
    head = rknn_pb2.OutputsHeader(outputs=[codec.meta_of(a) for a in items[:2]])
    messages = [rknn_pb2.InferenceResponse(header=head).SerializeToString()] + [
        rknn_pb2.InferenceResponse(chunk=c).SerializeToString() for c in codec.iter_chunks(items[:2], size)
    ]
    parsed = [framing.parse_inference_response(m) for m in messages]
    assert all(isinstance(m, framing.WireChunk) for m in parsed[1:])
    reader = framing.FrameReader(lambda h: codec.TensorAssembler(h.outputs, codec.TensorLimits()))
    (frame,) = framing.read_frames(parsed, reader)
    np.testing.assert_array_equal(frame.arrays()[0], items[0])


def test_a_chunk_read_by_hand_breaks_the_framing_as_a_protobuf_one_does() -> None:
    raw = _protobuf_chunk(rknn_pb2.InferenceRequest, 0, 0, b"abc")
    reader = framing.FrameReader(lambda h: codec.TensorAssembler(h.inputs, codec.TensorLimits()))
    with pytest.raises(framing.FrameError, match="a TensorChunk arrived before any header"):
        reader.feed(framing.parse_inference_request(raw))
