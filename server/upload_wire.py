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

from google.protobuf.message import DecodeError

from rknn_proto import rknn_pb2
from rknn_proto.wire import LENGTH_DELIMITED, VARINT, read_varint, tag

_CHUNK_FIELDS = rknn_pb2.UploadChunk.DESCRIPTOR.fields_by_name
# Each a one-byte key (field numbers below 16), compared with one byte of the message.
_CHUNK_TAG = tag(rknn_pb2.UploadModelRequest.DESCRIPTOR.fields_by_name["chunk"].number, LENGTH_DELIMITED)[0]
_FILE_INDEX_TAG = tag(_CHUNK_FIELDS["file_index"].number, VARINT)[0]
_OFFSET_TAG = tag(_CHUNK_FIELDS["offset"].number, VARINT)[0]
_DATA_TAG = tag(_CHUNK_FIELDS["data"].number, LENGTH_DELIMITED)[0]
_UINT32_END, _UINT64_END = 1 << 32, 1 << 64


class Chunk(NamedTuple):
    file_index: int
    offset: int
    data: memoryview | bytes


class _Irregular(Exception):
    """Not in the layout read here: protobuf's parser decides."""


def _chunk(raw: bytes) -> Chunk:
    end = len(raw)
    if not end or raw[0] != _CHUNK_TAG:
        raise _Irregular
    length, pos = read_varint(raw, 1)
    if pos + length != end:
        raise _Irregular
    file_index = offset = 0
    if pos < end and raw[pos] == _FILE_INDEX_TAG:
        file_index, pos = read_varint(raw, pos + 1)
    if pos < end and raw[pos] == _OFFSET_TAG:
        offset, pos = read_varint(raw, pos + 1)
    data: memoryview | bytes = b""
    if pos < end and raw[pos] == _DATA_TAG:
        size, pos = read_varint(raw, pos + 1)
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
    except (_Irregular, DecodeError):
        return rknn_pb2.UploadModelRequest.FromString(raw)


def upload_chunk(message: rknn_pb2.UploadModelRequest | Chunk) -> Chunk | None:
    """The chunk a request carries, None if it carries something else."""
    if isinstance(message, Chunk):
        return message
    if message.WhichOneof("part") != "chunk":
        return None
    return Chunk(message.chunk.file_index, message.chunk.offset, message.chunk.data)
