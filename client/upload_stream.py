"""The UploadModel request stream: a model's files read chunk by chunk and framed as wire bytes.

Building an `UploadChunk` message per chunk and serializing it copies every byte twice more after
reading it (three times when the sub-message is passed to the constructor, which deep-copies it):
measured here at 0.4-1.0 CPU-seconds per GiB. Here each chunk is read into one buffer kept for the
whole stream, right behind the few bytes of framing put in front of it, and copied once from there
into the message gRPC takes (which must be `bytes`): no fresh buffer to fault in for each read. The
framing is protobuf's own encoding of `UploadModelRequest{chunk: UploadChunk{file_index, offset,
data}}`, field numbers taken from the generated descriptors; the daemon parses it as any other message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from rknn_proto import rknn_pb2
from rknn_proto.chunk_wire import UPLOAD_CHUNKS
from rknn_proto.version import CHUNK_BYTES

_SERVICE = rknn_pb2.DESCRIPTOR.services_by_name["RknnServer"]
# The method the stream is sent to, with no request serializer: its requests are bytes already.
UPLOAD_METHOD = f"/{_SERVICE.full_name}/{_SERVICE.methods_by_name['UploadModel'].name}"
# Chunks this large where the daemon takes them: measured here against 1 and 2 MiB, the fewest CPU
# seconds per GiB on both sides (fewer messages, fewer HTTP/2 frames, fewer executor hops).
UPLOAD_CHUNK_BYTES = 4 << 20
# Room in a message for what is not the chunk's bytes.
_FRAMING_BYTES = 1 << 10
# Room for a chunk's framing in front of it: four one-byte tags and four varints of at most 10 bytes.
PREFIX_ROOM = 64


def chunk_prefix(file_index: int, offset: int, size: int) -> bytes:
    """The bytes of a serialized `UploadModelRequest` that come before its chunk's `size` data bytes,
    as protobuf would write them (fields equal to zero left out)."""
    return UPLOAD_CHUNKS.prefix(file_index, offset, size)


def upload_chunk_bytes(limits: Mapping[str, float]) -> int:
    """The chunk size for a daemon with these limits (GetInfo's; 0 or absent: not told, as by a
    daemon older than the limit, which takes the protocol's `CHUNK_BYTES`)."""
    size = min(UPLOAD_CHUNK_BYTES, int(limits.get("max_chunk_bytes", 0)) or CHUNK_BYTES)
    if limits.get("max_message_bytes"):
        size = min(size, int(limits["max_message_bytes"]) - _FRAMING_BYTES)
    return max(size, 1)


def upload_requests(
    header: rknn_pb2.UploadHeader,
    paths: Sequence[Path],
    chunk_bytes: int,
    sent: Callable[[int], None] | None = None,
) -> Iterator[bytes]:
    """The whole request stream, serialized: the header, then each file from its start offset in
    chunks of `chunk_bytes`; `sent` hears each chunk's size once gRPC has taken it."""
    yield rknn_pb2.UploadModelRequest(header=header).SerializeToString()
    message = memoryview(bytearray(PREFIX_ROOM + chunk_bytes))
    room = message[PREFIX_ROOM:]
    for index, (path, start) in enumerate(zip(paths, header.start_offsets, strict=True)):
        with path.open("rb", buffering=0) as fh:
            fh.seek(start)
            offset = start
            while size := fh.readinto(room):
                prefix = chunk_prefix(index, offset, size)
                message[PREFIX_ROOM - len(prefix) : PREFIX_ROOM] = prefix
                yield bytes(message[PREFIX_ROOM - len(prefix) : PREFIX_ROOM + size])
                offset += size
                if sent is not None:
                    sent(size)
