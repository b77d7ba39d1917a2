"""protobuf's wire encoding, the few pieces the hand-written fast paths need (`framing`'s Run
messages, the client's upload requests and the daemon's upload reader, KServe v2's ModelInfer): one
varint writer, one reader, one tag, a field's values read in place and bytes fields appended, so that
both sides of the wire encode exactly as protobuf does."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

VARINT, LENGTH_DELIMITED = 0, 2


def varint(value: int) -> bytes:
    """`value` (non-negative) as a base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    """The key that starts field `number` of `wire_type`."""
    return varint(number << 3 | wire_type)


def read_varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """The varint at `at` (at most 10 bytes) and the position after it; raises DecodeError if it is
    cut short or longer."""
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise DecodeError("a truncated or overlong varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


FIXED64, FIXED32 = 1, 5


class Unusual(Exception):
    """A message outside what `split_field` reads (a group, too many fields): protobuf's own parser
    decides what it means."""


def split_field(data: bytes, number: int, max_fields: int) -> tuple[bytes, list[memoryview]]:
    """The values of length-delimited field `number` of a serialized message, as views of `data`, and
    the message's other fields as they came (what protobuf's parser then reads, the values left out):
    a message's large bytes fields are not copied (protobuf's parser would copy each value once, and
    every read of the field again). Raises Unusual beyond `max_fields` fields (a hostile message of
    millions of tiny fields must not hold the caller in a Python loop) or at a group; DecodeError for a
    message cut short."""
    view = memoryview(data)
    values: list[memoryview] = []
    rest: list[memoryview] = []
    at, end, kept, fields = 0, len(view), 0, 0
    while at < end:
        start = at
        key, at = read_varint(view, at)
        fields += 1
        if fields > max_fields:
            raise Unusual
        wire_type = key & 7
        if wire_type == VARINT:
            _, at = read_varint(view, at)
        elif wire_type == FIXED64:
            at += 8
        elif wire_type == FIXED32:
            at += 4
        elif wire_type == LENGTH_DELIMITED:
            length, at = read_varint(view, at)
            at += length
        else:
            raise Unusual
        if at > end:
            raise DecodeError(f"field {key >> 3} runs past the end of the message")
        if key >> 3 == number and wire_type == LENGTH_DELIMITED:
            rest.append(view[kept:start])
            values.append(view[at - length : at])
            kept = at
    rest.append(view[kept:end])
    return b"".join(rest), values


def with_bytes_fields(head: bytes, number: int, values: Sequence[bytes | memoryview]) -> bytes:
    """The serialized message `head` with `values` (bytes, or views of bytes) appended as length-delimited field `number`, in
    order, each copied once, into the result (protobuf would copy each into the message and again
    into its serialization). Field order does not change what a parser reads."""
    key = tag(number, LENGTH_DELIMITED)
    parts: list[bytes | memoryview] = [head]
    for value in values:
        parts += (key, varint(len(value)), value)
    return b"".join(parts)
