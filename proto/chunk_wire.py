"""A chunk message's bytes, written and read by hand: one layout for every stream that moves chunks.

Tensor frames (`InferenceRequest`/`InferenceResponse{chunk: TensorChunk{tensor_index, offset,
data}}`) and uploads (`UploadModelRequest{chunk: UploadChunk{file_index, offset, data}}`) carry
their bytes the same way. protobuf's constructor, serializer, parser and `data` field each copy a
chunk's bytes; here a message is written with one copy of them (or none: `prefix` is what goes in
front of bytes the caller already holds) and read as a view of the received message. Only protobuf's
plain layout is read here (the chunk part alone, each field at most once and in order); anything
else is left to protobuf's parser, so what is accepted, and what each field means, stays exactly
what protobuf makes of it. Field numbers come from the generated descriptors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rknn_proto import rknn_pb2
from rknn_proto.wire import LENGTH_DELIMITED, VARINT, read_varint, tag, varint

Bytes = bytes | memoryview
_UINT32_END, _UINT64_END = 1 << 32, 1 << 64


@dataclass(frozen=True)
class ChunkLayout:
    """The keys of one message type's chunk part and of its chunk's three fields (one byte each)."""

    chunk: bytes
    index: bytes
    offset: bytes
    data: bytes

    @classmethod
    def of(cls, message_type: Any, index_field: str) -> ChunkLayout:
        """The layout of `message_type`'s `chunk` part, whose index field is called `index_field`."""
        part = message_type.DESCRIPTOR.fields_by_name["chunk"]
        fields = part.message_type.fields_by_name
        return cls(
            tag(part.number, LENGTH_DELIMITED),
            tag(fields[index_field].number, VARINT),
            tag(fields["offset"].number, VARINT),
            tag(fields["data"].number, LENGTH_DELIMITED),
        )

    def prefix(self, index: int, offset: int, size: int) -> bytes:
        """What comes before a chunk's `size` data bytes in its message, as protobuf writes it
        (fields equal to zero left out)."""
        fields = b"".join(
            (
                self.index + varint(index) if index else b"",
                self.offset + varint(offset) if offset else b"",
                self.data + varint(size) if size else b"",
            )
        )
        return b"".join((self.chunk, varint(len(fields) + size), fields))

    def message(self, index: int, offset: int, data: Bytes) -> bytes:
        """A whole chunk message; `data` is copied once, into it."""
        return b"".join((self.prefix(index, offset, len(data)), data))

    def parse(self, raw: bytes) -> tuple[int, int, Bytes] | None:
        """(index, offset, data) of a message in the plain layout, its data a view of `raw`; None for
        any other. Raises DecodeError for a varint cut short."""
        end = len(raw)
        if not end or raw[0] != self.chunk[0]:
            return None
        length, at = read_varint(raw, 1)
        if at + length != end:
            return None
        index = offset = 0
        if at < end and raw[at] == self.index[0]:
            index, at = read_varint(raw, at + 1)
        if at < end and raw[at] == self.offset[0]:
            offset, at = read_varint(raw, at + 1)
        data: Bytes = b""
        if at < end and raw[at] == self.data[0]:
            size, at = read_varint(raw, at + 1)
            if at + size != end:
                return None
            data, at = memoryview(raw)[at:], end
        if at != end or index >= _UINT32_END or offset >= _UINT64_END:
            return None
        return index, offset, data


# The frame streams' messages (InferenceRequest, InferenceResponse, DumpLayersResponse) carry a
# TensorChunk as the same field of their `oneof part`; UploadModel's requests an UploadChunk.
TENSOR_CHUNKS = ChunkLayout.of(rknn_pb2.InferenceRequest, "tensor_index")
UPLOAD_CHUNKS = ChunkLayout.of(rknn_pb2.UploadModelRequest, "file_index")

__all__ = ["TENSOR_CHUNKS", "UPLOAD_CHUNKS", "ChunkLayout"]
