"""protobuf's wire encoding, the few pieces the hand-written fast paths need (`framing`'s Run
messages, the client's upload requests and the daemon's upload reader): one varint writer, one
reader, one tag, so that both sides of the wire encode exactly as protobuf does."""

from __future__ import annotations

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
