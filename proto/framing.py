"""Frames on the wire, read and written in one place for every RPC that moves tensors, both sides.

A frame is a header part (an InferenceHeader, OutputsHeader or LayerDumpHeader) followed by the
TensorChunk parts of its tensors, on a stream of `oneof part` messages. `FrameReader` holds the
rules (a header first, chunks only inside a frame, no header inside an incomplete frame, no stream
ending inside one) and hands out each frame once its last byte arrived; `read_frames` drives it from
a blocking iterator (the client), `aread_frames` from an async one (the daemon). What a frame's
bytes go into is the caller's: a `TensorAssembler` on the client, the daemon's checked frame intake.
`frame_messages` writes one frame; `whole_frame` takes a frame whose tensors came in one message
(the unary Run), through the same assembly; `run_request_bytes` and `run_response_bytes` write
such a message and `parse_unary_frame` reads one, each tensor's bytes copied once or not at all.
The streams' chunk messages are written and read by hand too (`frame_bytes`, `parse_inference_request`,
`parse_inference_response`): a chunk's bytes copied once into its message, a received chunk a view.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np
from google.protobuf.message import DecodeError

from rknn_proto import rknn_pb2
from rknn_proto.chunk_wire import TENSOR_CHUNKS, Bytes
from rknn_proto.codec import Chunk, CodecError, chunk_views, iter_chunk_fields
from rknn_proto.wire import LENGTH_DELIMITED, read_varint, tag, varint, with_bytes_fields


class FrameError(CodecError):
    """A message stream that breaks the framing rules; the text says what arrived and what was expected."""


class TruncatedFrame(FrameError):
    """A stream that ended inside a frame (or a unary message short of its declared bytes)."""


class Assembly(Protocol):
    """Where one frame's chunks go: `codec.TensorAssembler`, or the daemon's checked intake."""

    @property
    def complete(self) -> bool: ...

    def add(self, chunk: Chunk) -> int: ...

    def add_bytes(self, i: int, offset: int, data: Bytes) -> int: ...

    def missing(self) -> list[str]: ...

    def drop(self) -> None: ...


class Part(Protocol):
    """A framed stream's message: a `oneof part` of a header and a `chunk`."""

    def WhichOneof(self, oneof_group: Any) -> str | None: ...


class WireChunk(NamedTuple):
    """A chunk message read by hand (`parse_inference_request`): its data a view of the message."""

    tensor_index: int
    offset: int
    data: Bytes


H = TypeVar("H")
A = TypeVar("A", bound=Assembly)
M = TypeVar("M", bound=Part)


class FrameReader(Generic[H, A]):
    """The framing state of one stream: `feed` each message; a complete frame comes back once.

    `start` turns a header into the frame's assembly (checking it before any byte is kept: it
    raises to refuse the frame). `header` names the oneof field of the header part; `what` is how
    errors name the stream's frames ("frame", "layer")."""

    def __init__(
        self, start: Callable[[H], A], header: str = "header", what: str = "frame", describe_header: str = ""
    ) -> None:
        self._start = start
        self._header = header
        self._what = what
        self._expected = describe_header or header
        self._current: A | None = None
        self._count = 0
        self.bytes = 0  # chunk bytes taken, for the caller's accounting

    def feed(self, message: Part | WireChunk) -> A | None:
        part = "chunk" if isinstance(message, WireChunk) else message.WhichOneof("part")
        if part == "chunk":
            if self._current is None:
                raise FrameError(
                    f"a TensorChunk arrived before any {self._expected}; the first message of each "
                    f"{self._what} must be an {self._expected}"
                )
            chunk = message if isinstance(message, WireChunk) else message.chunk  # type: ignore[attr-defined]
            self.bytes += self._current.add(chunk)
        elif part == self._header:
            if self._current is not None:
                raise FrameError(
                    f"{self._what} {self._count} is incomplete ({'; '.join(self._current.missing())}) "
                    f"but the {self._expected} of the next arrived"
                )
            self._count += 1
            self._current = self._start(getattr(message, part))
        else:
            raise FrameError(f"a message with part {part!r} arrived; expected a {self._expected} or a chunk")
        frame = self._current
        if frame is not None and frame.complete:
            self._current = None
            return frame
        return None

    def end(self) -> None:
        """The stream ended: raise TruncatedFrame if it ended inside a frame."""
        if self._current is not None:
            missing = "; ".join(self._current.missing())
            self.drop()
            raise TruncatedFrame(f"the stream ended inside {self._what} {self._count} ({missing})")

    def drop(self) -> None:
        """Free the frame being assembled (the stream failed or was given up)."""
        if self._current is not None:
            self._current.drop()
            self._current = None


def read_frames(messages: Iterable[Part | WireChunk], reader: FrameReader[Any, A]) -> Iterator[A]:
    """Each complete frame of a blocking message stream, in order (raises on a framing error)."""
    try:
        for message in messages:
            frame = reader.feed(message)
            if frame is not None:
                yield frame
        reader.end()
    finally:
        reader.drop()


async def aread_frames(
    messages: AsyncIterable[Part | WireChunk], reader: FrameReader[Any, A]
) -> AsyncGenerator[A, None]:
    """Each complete frame of an async message stream, in order (raises on a framing error)."""
    try:
        async for message in messages:
            frame = reader.feed(message)
            if frame is not None:
                yield frame
        reader.end()
    finally:
        reader.drop()


def whole_frame(assembly: A, tensors: Sequence[Bytes], declared: int, what: str = "tensor") -> A:
    """A frame whose tensors' bytes came whole in one message (the unary Run): each into place
    through the same assembly as chunks; raises unless exactly every declared byte is there. Each
    tensor is read once (every read of a protobuf bytes field is a new copy)."""
    if len(tensors) != declared:
        assembly.drop()
        raise FrameError(f"{len(tensors)} {what} byte strings were sent for {declared} declared {what}(s)")
    try:
        for i, data in enumerate(tensors):
            if data:  # an empty tensor has nothing to place (and the assembly is already past it)
                assembly.add_bytes(i, 0, data)
        if not assembly.complete:
            raise TruncatedFrame(f"the stream ended inside the frame ({'; '.join(assembly.missing())})")
    except BaseException:
        assembly.drop()
        raise
    return assembly


# RunRequest and RunResponse share one layout: the header as field 1, each tensor's bytes as field 2,
# filler as field 3.
_HEADER_FIELD = rknn_pb2.RunRequest.HEADER_FIELD_NUMBER
_TENSORS_FIELD = rknn_pb2.RunRequest.INPUTS_FIELD_NUMBER
_PADDING_FIELD = rknn_pb2.RunRequest.PADDING_FIELD_NUMBER
_TENSOR_TAG = tag(_TENSORS_FIELD, LENGTH_DELIMITED)
_PADDING_TAG = tag(_PADDING_FIELD, LENGTH_DELIMITED)
# Where a received tensor may be used in place: any dtype's alignment (a bytes object's data is 16-aligned).
ALIGNMENT = 16


def _padding(at: int) -> bytes:
    """A filler field that, written at offset `at`, ends at the next multiple of ALIGNMENT (its tag
    and one-byte length take 2 bytes, so a gap of one byte takes a whole ALIGNMENT more)."""
    gap = -at % ALIGNMENT
    if gap == 0:
        return b""
    size = gap - 2 if gap >= 2 else gap + ALIGNMENT - 2
    return _PADDING_TAG + varint(size) + bytes(size)


def _bytes_of(array: np.ndarray) -> memoryview:
    """A wire-ready array's bytes, where they lie."""
    return array.reshape(-1).view(np.uint8).data


def run_request_bytes(header: rknn_pb2.InferenceHeader, arrays: Sequence[np.ndarray]) -> bytes:
    """A serialized RunRequest of wire-ready arrays, their bytes appended as field 2 as
    `wire.with_bytes_fields` appends them (each copied once), with a filler field before each that
    starts its bytes at a multiple of ALIGNMENT, for the daemon to run it where it lies; send it on a
    call whose request serializer passes bytes through."""
    head = rknn_pb2.RunRequest(header=header).SerializeToString()
    parts: list[bytes | memoryview] = [head]
    at = len(head)
    for array in arrays:
        length = varint(array.nbytes)
        if array.nbytes:
            filler = _padding(at + len(_TENSOR_TAG) + len(length))
            parts.append(filler)
            at += len(filler)
        parts += (_TENSOR_TAG, length, _bytes_of(array))
        at += len(_TENSOR_TAG) + len(length) + array.nbytes
    return b"".join(parts)


def run_response_bytes(header: rknn_pb2.OutputsHeader, arrays: Sequence[np.ndarray]) -> bytes:
    """A serialized RunResponse of wire-ready arrays (the daemon's Run reply): the same bytes as
    `RunResponse(header, [a.tobytes()...]).SerializeToString()` (the client copies its outputs)."""
    head = rknn_pb2.RunResponse(header=header).SerializeToString()
    return with_bytes_fields(head, _TENSORS_FIELD, [_bytes_of(a) for a in arrays])


def in_place(tensors: Sequence[memoryview]) -> list[Bytes]:
    """Each tensor where it lies in the received message when its address suits any dtype, else
    one copy of it (runtimes read their inputs as typed arrays)."""
    return [
        view if np.frombuffer(view, np.uint8).ctypes.data % ALIGNMENT == 0 else view.tobytes()
        for view in tensors
    ]


class UnaryFrame(Generic[H]):
    """A parsed RunRequest or RunResponse: its header, and its tensors as views into the received
    message (no copy: protobuf's parser would copy each tensor once, and each read of the field again)."""

    __slots__ = ("header", "tensors")

    def __init__(self, header: H, tensors: list[memoryview]) -> None:
        self.header = header
        self.tensors = tensors


# The fields a message as this contract's senders write it has at most: its header, then a filler
# and a tensor per input. Beyond them, or any other field, protobuf's own parser reads the message
# (a hostile message of millions of tiny fields must not hold the event loop in a Python loop).
MAX_PLAIN_FIELDS = 1 + 2 * 1024


class _Unusual(Exception):
    """A message outside the plain layout: protobuf's parser decides what it means."""


def _plain_frame(data: bytes, header: Any) -> list[memoryview]:
    """The tensors of a message of the plain layout (fields 1, 2 and 3, each length-delimited), the
    header merged into `header`; raises _Unusual for anything else, DecodeError if it is cut short."""
    view = memoryview(data)
    tensors: list[memoryview] = []
    at, end, fields = 0, len(view), 0
    while at < end:
        key, at = read_varint(view, at)
        fields += 1
        if (
            key & 7 != LENGTH_DELIMITED
            or not _HEADER_FIELD <= key >> 3 <= _PADDING_FIELD
            or fields > MAX_PLAIN_FIELDS
        ):
            raise _Unusual
        length, at = read_varint(view, at)
        if at + length > end:
            raise DecodeError(f"field {key >> 3} declares {length} bytes; {end - at} remain")
        if key >> 3 == _TENSORS_FIELD:
            tensors.append(view[at : at + length])
        elif key >> 3 == _HEADER_FIELD:
            header.MergeFromString(view[at : at + length])  # repeated parts merge, as protobuf's
        at += length
    return tensors


def parse_unary_frame(data: bytes, message_type: Any, header: H) -> UnaryFrame[H]:
    """Parse a RunRequest or RunResponse (`message_type`; `header` an empty one of its header type)
    as protobuf would, its tensors as views into `data`. A message outside the plain layout (unknown
    fields, too many fields) is read by protobuf itself, its tensors then copies; raises DecodeError
    on a malformed message, as protobuf's FromString."""
    try:
        return UnaryFrame(header, _plain_frame(data, header))
    except _Unusual:
        pass
    message = message_type.FromString(data)
    header.CopyFrom(message.header)  # type: ignore[attr-defined]
    tensors = getattr(message, message_type.DESCRIPTOR.fields_by_number[_TENSORS_FIELD].name)
    return UnaryFrame(header, [memoryview(t) for t in tensors])


def parse_run_request(data: bytes) -> UnaryFrame[rknn_pb2.InferenceHeader]:
    """The daemon's Run request deserializer."""
    return parse_unary_frame(data, rknn_pb2.RunRequest, rknn_pb2.InferenceHeader())


def parse_run_response(data: bytes) -> UnaryFrame[rknn_pb2.OutputsHeader]:
    """The client's Run reply deserializer."""
    return parse_unary_frame(data, rknn_pb2.RunResponse, rknn_pb2.OutputsHeader())


def frame_messages(
    message: Callable[..., M], header: Any, arrays: Sequence[np.ndarray], header_part: str = "header"
) -> Iterator[M]:
    """One frame's messages of type `message`: the header, then its wire-ready arrays' chunks, built
    lazily (see codec.iter_chunk_fields: chunk fields as dicts, no sub-message copies)."""
    yield message(**{header_part: header})
    for fields in iter_chunk_fields(arrays):
        yield message(chunk=fields)


def chunk_message(tensor_index: int, offset: int, data: Bytes) -> bytes:
    """A serialized stream message carrying one chunk, exactly as protobuf writes it; `data` (a byte
    view) is copied once, into the result."""
    return TENSOR_CHUNKS.message(tensor_index, offset, data)


def frame_bytes(
    header: bytes, arrays: Sequence[np.ndarray], moved: Callable[[int], object] | None = None
) -> Iterator[bytes]:
    """One frame's serialized messages: `header` (a serialized header part), then its wire-ready
    arrays' chunks, built lazily, each chunk's bytes copied once (protobuf's constructor and
    serializer copy them two more times); `moved` hears the chunk bytes taken so far after each."""
    yield header
    total = 0
    for index, offset, data in chunk_views(arrays):
        yield chunk_message(index, offset, data)
        total += len(data)
        if moved is not None:
            moved(total)


def _parse_stream_message(raw: bytes, message_type: Any) -> Any:
    """A received stream message: a WireChunk where it is a plain chunk, else what protobuf's parser
    makes of it (a header, or a chunk written otherwise), so what is accepted stays protobuf's.
    Raises FrameError for bytes protobuf cannot parse."""
    try:
        chunk = TENSOR_CHUNKS.parse(raw)
    except DecodeError:
        chunk = None
    if chunk is not None:
        return WireChunk(*chunk)
    try:
        return message_type.FromString(raw)
    except DecodeError as exc:
        raise FrameError(f"a message that is no {message_type.DESCRIPTOR.name} arrived ({exc})") from None


# A frame stream's message as read by the deserializers below.
StreamRequest = rknn_pb2.InferenceRequest | WireChunk
StreamResponse = rknn_pb2.InferenceResponse | WireChunk


def parse_inference_request(raw: bytes) -> StreamRequest:
    """The daemon's request deserializer of the frame streams (Inference, InferencePipeline, DumpLayers)."""
    return _parse_stream_message(raw, rknn_pb2.InferenceRequest)


def parse_inference_response(raw: bytes) -> StreamResponse:
    """The client's response deserializer of Inference and InferencePipeline."""
    return _parse_stream_message(raw, rknn_pb2.InferenceResponse)


__all__ = [
    "Assembly",
    "Chunk",
    "FrameError",
    "FrameReader",
    "StreamRequest",
    "StreamResponse",
    "TruncatedFrame",
    "UnaryFrame",
    "WireChunk",
    "aread_frames",
    "chunk_message",
    "frame_bytes",
    "frame_messages",
    "in_place",
    "parse_inference_request",
    "parse_inference_response",
    "parse_run_request",
    "parse_run_response",
    "parse_unary_frame",
    "read_frames",
    "run_request_bytes",
    "run_response_bytes",
    "whole_frame",
]
