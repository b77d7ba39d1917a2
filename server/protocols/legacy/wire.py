"""The closed toolkit protocol's bytes: the open handshake, the length framing and the message header.

Every integer is little-endian. A message is `u32 length` then `length` bytes, which begin with a
0x6c-byte header. The client leaves header bytes 0x30-0x6b uninitialised (they can hold fragments of
the PC's memory), so nothing here keeps or logs them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

MAGIC = 0x05019D62
FLAG_COLLECT_PERF = 0x8
FLAG_COLLECT_MEMORY = 0x80000000
PROTOCOL_DATE = 20181212
HEADER_BYTES = 0x6C
OPEN_BYTES = 48
# magic, version, context id (i64), init flags, sequence (u64), an unknown u32, version again, command,
# total size, model id. The context id is -1 until a LOAD ack assigns one (1, 2, 3 ... per daemon
# lifetime); the client then carries it in every request. The flags are the client's rknn_init flags
# (1 = medium priority, 0x8 = collect performance data for eval_perf, 0x80000000 = collect memory data
# for eval_memory); acks carry 1 there.
NO_CONTEXT = -1
_HEADER = struct.Struct("<IIqIQIIIII")
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
    SET_INPUT_SHAPE = 16  # rknn_set_input_shapes of a dynamic-shape model
    SET_INPUT_SHAPE_ACK = 17
    SET_INPUT_ACK = 18  # sent only when inputs are refused


# Each command's name by its code, for log events and call records: looked up per message, where an
# enum's construction would cost a few Python calls each time.
COMMAND_NAMES = {int(command): command.name for command in Command}


class ProtocolError(Exception):
    """The peer broke the protocol; the message says what was expected (it may reach the client)."""


@dataclass(frozen=True)
class Header:
    command: int
    sequence: int
    size: int
    model_id: int
    flags: int = 0
    context: int = NO_CONTEXT

    @classmethod
    def parse(cls, data: bytes) -> Header:
        if len(data) < HEADER_BYTES:
            raise ProtocolError(
                f"a message of {len(data)} bytes; every message starts with a {HEADER_BYTES}-byte header"
            )
        magic, _version, context, flags, sequence, _unknown, _date, command, size, model_id = (
            _HEADER.unpack_from(data)
        )
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {magic:#010x} in a message header; expected {MAGIC:#010x}")
        return cls(command, sequence, size, model_id, flags, context)


def build(command: Command, request: Header, size: int, context: int = NO_CONTEXT) -> bytearray:
    """A zeroed message of `size` bytes answering `request`, its header filled in (the body is the
    caller's). Header bytes 0x30-0x6b stay zero: the real server echoes the request's, which are the
    client's uninitialised memory."""
    message = bytearray(size)
    _HEADER.pack_into(
        message,
        0,
        MAGIC,
        PROTOCOL_DATE,
        context,
        1,
        request.sequence,
        0,
        PROTOCOL_DATE,
        command,
        size,
        request.model_id,
    )
    return message


LENGTH_BYTES = _LENGTH.size


def parse_length(data: bytes) -> int:
    """The length that frames every message."""
    return int(_LENGTH.unpack(data)[0])


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
