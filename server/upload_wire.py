"""UploadModel's requests read off the wire without copying a chunk's bytes.

protobuf's parser copies a chunk's bytes into its message, and reading the `data` field copies them
again into a new `bytes`: two copies of every uploaded byte on the event loop, while gRPC has made one
already (profiled here: the `data` read alone took a sixth of the event loop's time during an
upload). A chunk message in protobuf's own layout (`UploadModelRequest{chunk: UploadChunk{file_index,
offset, data}}`, each field at most once and in order) is read here into a `Chunk` whose data is a
view of the received message; anything else, the header included, goes to protobuf's parser, so what
is accepted, and what each field means, stays exactly what protobuf makes of it.
"""

from __future__ import annotations

from typing import NamedTuple

from rknn_proto import rknn_pb2

_WIRE_VARINT, _WIRE_LEN = 0, 2
_CHUNK_FIELDS = rknn_pb2.UploadChunk.DESCRIPTOR.fields_by_name
_CHUNK_TAG = rknn_pb2.UploadModelRequest.DESCRIPTOR.fields_by_name["chunk"].number << 3 | _WIRE_LEN
_FILE_INDEX_TAG = _CHUNK_FIELDS["file_index"].number << 3 | _WIRE_VARINT
_OFFSET_TAG = _CHUNK_FIELDS["offset"].number << 3 | _WIRE_VARINT
_DATA_TAG = _CHUNK_FIELDS["data"].number << 3 | _WIRE_LEN
_UINT32_END, _UINT64_END = 1 << 32, 1 << 64


class Chunk(NamedTuple):
    file_index: int
    offset: int
    data: memoryview | bytes


class _Irregular(Exception):
    """Not in the layout read here: protobuf's parser decides."""


def _varint(raw: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at `pos` (at most 10 bytes) and the position after it."""
    value, shift = 0, 0
    while pos < end and shift < 70:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise _Irregular


def _chunk(raw: bytes) -> Chunk:
    end = len(raw)
    if not end or raw[0] != _CHUNK_TAG:
        raise _Irregular
    length, pos = _varint(raw, 1, end)
    if pos + length != end:
        raise _Irregular
    file_index = offset = 0
    if pos < end and raw[pos] == _FILE_INDEX_TAG:
        file_index, pos = _varint(raw, pos + 1, end)
    if pos < end and raw[pos] == _OFFSET_TAG:
        offset, pos = _varint(raw, pos + 1, end)
    data: memoryview | bytes = b""
    if pos < end and raw[pos] == _DATA_TAG:
        size, pos = _varint(raw, pos + 1, end)
        if pos + size != end:
            raise _Irregular
        data = memoryview(raw)[pos:]
        pos = end
    if pos != end or file_index >= _UINT32_END or offset >= _UINT64_END:
        raise _Irregular
    return Chunk(file_index, offset, data)


def parse_upload_request(raw: bytes) -> rknn_pb2.UploadModelRequest | Chunk:
    """UploadModel's request deserializer: a `Chunk` viewing `raw` where the layout is protobuf's
    plain one, else the parsed message."""
    try:
        return _chunk(raw)
    except _Irregular:
        return rknn_pb2.UploadModelRequest.FromString(raw)


def upload_chunk(message: rknn_pb2.UploadModelRequest | Chunk) -> Chunk | None:
    """The chunk a request carries, None if it carries something else."""
    if isinstance(message, Chunk):
        return message
    if message.WhichOneof("part") != "chunk":
        return None
    return Chunk(message.chunk.file_index, message.chunk.offset, message.chunk.data)
