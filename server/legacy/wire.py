"""The closed toolkit protocol's bytes: the open handshake, the length framing and the message header.

Every integer is little-endian. A message is `u32 length` then `length` bytes, which begin with a
0x6c-byte header. The client leaves header bytes 0x30-0x6b uninitialised (they can hold fragments of
the PC's memory), so nothing here keeps or logs them.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from enum import IntEnum

MAGIC = 0x05019D62
FLAG_COLLECT_PERF = 0x8
FLAG_COLLECT_MEMORY = 0x80000000
PROTOCOL_DATE = 20181212
HEADER_BYTES = 0x6C
OPEN_BYTES = 48
# magic, version, -1, -1, init flags, sequence (u64), an unknown u32, version again, command, total size,
# model id. The flags are the client's rknn_init flags (1 = medium priority, 0x8 = collect performance
# data for eval_perf, 0x80000000 = collect memory data for eval_memory); acks carry 1 there.
_HEADER = struct.Struct("<IIiiIQIIIII")
_LENGTH = struct.Struct("<I")


class Command(IntEnum):
    LOAD = 0
    LOAD_ACK = 1
    UNLOAD = 2
    UNLOAD_ACK = 3
    RUN = 5
    FINISH = 7
    IOCTL = 8
    IOCTL_ACK = 9
    MULTI_INPUT = 10
    VERSION = 11
    VERSION_ACK = 12
    CRASH = 13
    SET_CORE = 14
    SET_CORE_ACK = 15


class ProtocolError(Exception):
    """The peer broke the protocol; the message says what was expected (it may reach the client)."""


@dataclass(frozen=True)
class Header:
    command: int
    sequence: int
    size: int
    model_id: int
    flags: int = 0

    @classmethod
    def parse(cls, data: bytes) -> Header:
        if len(data) < HEADER_BYTES:
            raise ProtocolError(
                f"a message of {len(data)} bytes; every message starts with a {HEADER_BYTES}-byte header"
            )
        magic, _version, _a, _b, flags, sequence, _unknown, _date, command, size, model_id = (
            _HEADER.unpack_from(data)
        )
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {magic:#010x} in a message header; expected {MAGIC:#010x}")
        return cls(command, sequence, size, model_id, flags)


def build(command: Command, sequence: int, model_id: int, size: int) -> bytearray:
    """A zeroed message of `size` bytes with its header filled in (the body is the caller's)."""
    message = bytearray(size)
    _HEADER.pack_into(
        message, 0, MAGIC, PROTOCOL_DATE, -1, -1, 1, sequence, 0, PROTOCOL_DATE, command, size, model_id
    )
    return message


async def read_exactly(reader: asyncio.StreamReader, count: int, what: str) -> bytes:
    try:
        return await reader.readexactly(count)
    except asyncio.IncompleteReadError as exc:
        raise EOFError(
            f"the client hung up after {len(exc.partial)} of the {count} bytes of {what}"
        ) from None


async def read_length(reader: asyncio.StreamReader) -> int:
    return int(_LENGTH.unpack(await read_exactly(reader, _LENGTH.size, "a frame length"))[0])


def frame(message: bytes | bytearray) -> bytes:
    return _LENGTH.pack(len(message)) + bytes(message)


@dataclass(frozen=True)
class OpenRequest:
    """The 48 bytes a client sends first: u32 0, u32 client fd, u32 device type, u32 pid, char devid[32]."""

    device_type: int
    pid: int
    device_id: str

    @classmethod
    def parse(cls, data: bytes) -> OpenRequest:
        _zero, _fd, device_type, pid = struct.unpack_from("<4I", data)
        device_id = data[16:48].split(b"\0", 1)[0].decode("ascii", "replace")
        return cls(device_type, pid, device_id)


OPEN_ACCEPTED = struct.pack("<i", 0)
