"""UploadModel's requests read without copying a chunk's bytes: what is read is always what protobuf
makes of the same bytes, and a plain chunk's data is a view of the received message."""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError

from rknn_proto import rknn_pb2
from rknn_server.protocols.grpc.upload_wire import Chunk, parse_upload_request, upload_chunk


def _chunk_bytes(file_index: int, offset: int, data: bytes) -> bytes:
    return rknn_pb2.UploadModelRequest(
        chunk=rknn_pb2.UploadChunk(file_index=file_index, offset=offset, data=data)
    ).SerializeToString()


def _as_protobuf_reads_it(raw: bytes) -> tuple[int, int, bytes] | str:
    message = rknn_pb2.UploadModelRequest.FromString(raw)
    if message.WhichOneof("part") != "chunk":
        return str(message.WhichOneof("part"))
    return message.chunk.file_index, message.chunk.offset, message.chunk.data


def _as_read_here(raw: bytes) -> tuple[int, int, bytes] | str:
    message = parse_upload_request(raw)
    chunk = upload_chunk(message)
    if chunk is None:
        assert isinstance(message, rknn_pb2.UploadModelRequest)
        return str(message.WhichOneof("part"))
    return chunk.file_index, chunk.offset, bytes(chunk.data)


def test_a_plain_chunk_is_a_view_of_the_received_bytes() -> None:
    raw = _chunk_bytes(3, 1 << 40, b"x" * 5000)
    chunk = parse_upload_request(raw)
    assert isinstance(chunk, Chunk) and isinstance(chunk.data, memoryview)
    assert chunk.data.obj is raw  # no copy
    assert (chunk.file_index, chunk.offset, bytes(chunk.data)) == (3, 1 << 40, b"x" * 5000)


_DATA = b"\x01\x02\x03"


def _wrap(chunk_fields: bytes) -> bytes:
    """An UploadModelRequest whose chunk holds these encoded fields (under 128 bytes)."""
    return b"\x12" + bytes([len(chunk_fields)]) + chunk_fields


IRREGULAR = {
    "fields out of order": _wrap(b"\x10\x05\x08\x02\x1a\x03" + _DATA),
    "a field repeated, the last one wins": _wrap(b"\x08\x01\x08\x02\x10\x05\x1a\x03" + _DATA),
    "data repeated": _wrap(b"\x1a\x03abc\x1a\x03" + _DATA),
    "an unknown field after the data": _wrap(b"\x1a\x03" + _DATA + b"\x20\x07"),
    "an unknown field in the request": _chunk_bytes(1, 2, _DATA) + b"\x18\x01",
    "the chunk twice, merged": _chunk_bytes(1, 0, _DATA) + _chunk_bytes(0, 9, b""),
    "an overlong varint": _wrap(b"\x08\x81\x80\x00\x1a\x03" + _DATA),
    "a file index beyond uint32": _wrap(b"\x08\x80\x80\x80\x80\x10\x1a\x03" + _DATA),
    "no fields at all": _wrap(b""),
    "the header": rknn_pb2.UploadModelRequest(
        header=rknn_pb2.UploadHeader(start_offsets=[1, 2])
    ).SerializeToString(),
    "an empty message": b"",
}


@pytest.mark.parametrize("raw", IRREGULAR.values(), ids=IRREGULAR.keys())
def test_any_other_layout_reads_as_protobuf_reads_it(raw: bytes) -> None:
    assert _as_read_here(raw) == _as_protobuf_reads_it(raw)


def test_mangled_messages_read_as_protobuf_reads_them_or_fail_as_it_does() -> None:
    rng = random.Random(16)
    valid = _chunk_bytes(2, 123456789, bytes(range(40)))
    for _ in range(3000):
        raw = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        raw = raw[: rng.randint(0, len(raw))] if rng.random() < 0.3 else raw
        try:
            expected: object = _as_protobuf_reads_it(bytes(raw))
        except DecodeError:
            with pytest.raises(DecodeError):
                parse_upload_request(bytes(raw))
            continue
        assert _as_read_here(bytes(raw)) == expected, bytes(raw).hex()
