"""The adb transport message format (protocol.txt), shared by the emulator and its tests."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

CNXN = 0x4E584E43
OPEN = 0x4E45504F
OKAY = 0x59414B4F
WRTE = 0x45545257
CLSE = 0x45534C43
AUTH = 0x48545541

# The newest transport version; hosts at or above it skip the payload checksum.
VERSION = 0x01000001
# Largest payload the emulator offers: 1 MiB keeps forwards fast (see adb-device-protocol.md).
MAX_PAYLOAD = 1 << 20

_HEADER = struct.Struct("<6I")


@dataclass(frozen=True)
class Message:
    """One transport message: a command, its two arguments and its payload."""

    command: int
    arg0: int
    arg1: int
    data: bytes = b""


def encode(message: Message) -> bytes:
    """Header plus payload, with the checksum older hosts verify."""
    checksum = sum(message.data) & 0xFFFFFFFF
    header = _HEADER.pack(
        message.command,
        message.arg0,
        message.arg1,
        len(message.data),
        checksum,
        message.command ^ 0xFFFFFFFF,
    )
    return header + message.data


async def read_message(reader: asyncio.StreamReader) -> Message:
    """Read one message; raises asyncio.IncompleteReadError when the peer hangs up."""
    command, arg0, arg1, length, _checksum, magic = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if magic != command ^ 0xFFFFFFFF:
        raise ValueError(f"bad adb message magic {magic:#x} for command {command:#x}")
    data = await reader.readexactly(length) if length else b""
    return Message(command, arg0, arg1, data)
