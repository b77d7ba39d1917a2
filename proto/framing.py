"""Frames on the wire, read and written in one place for every RPC that moves tensors, both sides.

A frame is a header part (an InferenceHeader, OutputsHeader or LayerDumpHeader) followed by the
TensorChunk parts of its tensors, on a stream of `oneof part` messages. `FrameReader` holds the
rules (a header first, chunks only inside a frame, no header inside an incomplete frame, no stream
ending inside one) and hands out each frame once its last byte arrived; `read_frames` drives it from
a blocking iterator (the client), `aread_frames` from an async one (the daemon). What a frame's
bytes go into is the caller's: a `TensorAssembler` on the client, the daemon's checked frame intake.
`frame_messages` writes one frame; `whole_frame` takes a frame whose tensors came in one message
(the unary Run), through the same assembly, and `run_request_bytes` writes that message.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from rknn_proto import rknn_pb2
from rknn_proto.codec import CodecError, iter_chunk_fields


class FrameError(CodecError):
    """A message stream that breaks the framing rules; the text says what arrived and what was expected."""


class TruncatedFrame(FrameError):
    """A stream that ended inside a frame (or a unary message short of its declared bytes)."""


class Assembly(Protocol):
    """Where one frame's chunks go: `codec.TensorAssembler`, or the daemon's checked intake."""

    @property
    def complete(self) -> bool: ...

    def add(self, chunk: rknn_pb2.TensorChunk) -> int: ...

    def add_bytes(self, i: int, offset: int, data: bytes) -> int: ...

    def missing(self) -> list[str]: ...

    def drop(self) -> None: ...


class Part(Protocol):
    """A framed stream's message: a `oneof part` of a header and a `chunk`."""

    def WhichOneof(self, oneof_group: Any) -> str | None: ...


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

    def feed(self, message: Part) -> A | None:
        part = message.WhichOneof("part")
        if part == "chunk":
            if self._current is None:
                raise FrameError(
                    f"a TensorChunk arrived before any {self._expected}; the first message of each "
                    f"{self._what} must be an {self._expected}"
                )
            self.bytes += self._current.add(message.chunk)  # type: ignore[attr-defined]
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


def read_frames(messages: Iterable[Part], reader: FrameReader[Any, A]) -> Iterator[A]:
    """Each complete frame of a blocking message stream, in order (raises on a framing error)."""
    try:
        for message in messages:
            frame = reader.feed(message)
            if frame is not None:
                yield frame
        reader.end()
    finally:
        reader.drop()


async def aread_frames(messages: AsyncIterable[Part], reader: FrameReader[Any, A]) -> AsyncGenerator[A, None]:
    """Each complete frame of an async message stream, in order (raises on a framing error)."""
    try:
        async for message in messages:
            frame = reader.feed(message)
            if frame is not None:
                yield frame
        reader.end()
    finally:
        reader.drop()


def whole_frame(assembly: A, tensors: Sequence[bytes], declared: int, what: str = "tensor") -> A:
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


# RunRequest.inputs (field 2, length-delimited): its tag byte on the wire.
_RUN_INPUTS_TAG = bytes([(rknn_pb2.RunRequest.INPUTS_FIELD_NUMBER << 3) | 2])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def run_request_bytes(header: rknn_pb2.InferenceHeader, arrays: Sequence[np.ndarray]) -> bytes:
    """A serialized RunRequest of wire-ready arrays, their bytes copied once, straight from their
    buffers into the message (protobuf would copy them three times: `tobytes()`, into the message,
    into its serialization). The same bytes as `RunRequest(header, [a.tobytes()...]).SerializeToString()`;
    send it on a call whose request serializer passes bytes through."""
    parts: list[bytes | memoryview] = [rknn_pb2.RunRequest(header=header).SerializeToString()]
    for array in arrays:
        parts += (_RUN_INPUTS_TAG, _varint(array.nbytes), array.reshape(-1).view(np.uint8).data)
    return b"".join(parts)


def frame_messages(
    message: Callable[..., M], header: Any, arrays: Sequence[np.ndarray], header_part: str = "header"
) -> Iterator[M]:
    """One frame's messages of type `message`: the header, then its wire-ready arrays' chunks, built
    lazily (see codec.iter_chunk_fields: chunk fields as dicts, no sub-message copies)."""
    yield message(**{header_part: header})
    for fields in iter_chunk_fields(arrays):
        yield message(chunk=fields)


__all__ = [
    "Assembly",
    "FrameError",
    "FrameReader",
    "TruncatedFrame",
    "aread_frames",
    "frame_messages",
    "read_frames",
    "run_request_bytes",
    "whole_frame",
]
