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
from rknn_proto.chunk_wire import UPLOAD_CHUNKS


class Chunk(NamedTuple):
    file_index: int
    offset: int
    data: memoryview | bytes


def parse_upload_request(raw: bytes) -> rknn_pb2.UploadModelRequest | Chunk:
    """UploadModel's request deserializer: a `Chunk` viewing `raw` where the layout is protobuf's
    plain one, else the parsed message."""
    try:
        chunk = UPLOAD_CHUNKS.parse(raw)
    except DecodeError:
        chunk = None
    return Chunk(*chunk) if chunk is not None else rknn_pb2.UploadModelRequest.FromString(raw)


def upload_chunk(message: rknn_pb2.UploadModelRequest | Chunk) -> Chunk | None:
    """The chunk a request carries, None if it carries something else."""
    if isinstance(message, Chunk):
        return message
    if message.WhichOneof("part") != "chunk":
        return None
    return Chunk(message.chunk.file_index, message.chunk.offset, message.chunk.data)
