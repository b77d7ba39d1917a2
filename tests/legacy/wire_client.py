"""A minimal client of the toolkit's closed protocol, written from the observed facts (not from the
daemon's code), for the cases the real toolkit cannot produce: bad frames, limits, disconnects."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = 0x05019D62
DATE = 20181212
HEADER = 0x6C
LOAD, LOAD_ACK, UNLOAD, UNLOAD_ACK, RUN, FINISH, IOCTL, IOCTL_ACK, MULTI_INPUT, VERSION, VERSION_ACK = (
    0,
    1,
    2,
    3,
    5,
    7,
    8,
    9,
    10,
    11,
    12,
)
SET_INPUT_SHAPE, SET_INPUT_SHAPE_ACK, SET_INPUT_ACK = 16, 17, 18
CRASH_BYTES = 0x1070
SET_INPUT_SHAPE_BYTES, ATTR_BYTES = 0xB4F0, 0x169
ACK_FAIL, ACK_INVALD_INPUT = 1, 3
# rknn_tensor_type / rknn_tensor_format codes.
TYPE_CODES = {
    np.dtype(np.float32): 0,
    np.dtype(np.float16): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.uint8): 3,
    np.dtype(np.int32): 6,
}
NHWC = 1


def header(command: int, sequence: int, size: int, junk: bytes = b"", context: int = -1) -> bytes:
    """A header as the toolkit writes it: the context id its LOAD ack gave at 0x08 (i64, -1 before),
    and `junk` in 0x30-0x6b like its uninitialised heap memory."""
    head = struct.pack("<IIqIQIIIII", MAGIC, DATE, context, 1, sequence, 0, DATE, command, size, 0)
    return head + (junk * HEADER or bytes(HEADER))[: HEADER - len(head)]


@dataclass
class Reply:
    data: bytes

    @property
    def command(self) -> int:
        return int(struct.unpack_from("<I", self.data, 0x24)[0])

    @property
    def context(self) -> int:
        return int(struct.unpack_from("<q", self.data, 0x08)[0])

    @property
    def ack(self) -> int:
        return int(struct.unpack_from("<I", self.data, 0x6C)[0])

    @property
    def is_crash(self) -> bool:
        return len(self.data) == CRASH_BYTES

    def text(self, at: int = 0x70) -> str:
        return self.data[at:].split(b"\0", 1)[0].decode()


class WireClient:
    def __init__(self, address: str, timeout: float = 60.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(address)
        self.sequence = 0
        self.context = -1  # from the last successful LOAD ack, carried by every later request

    def open(self) -> int:
        self.sock.sendall(struct.pack("<4I", 0, 3, 0xFF, 4242) + b"devid:test".ljust(32, b"\0"))
        return int(struct.unpack("<i", self.recv_exactly(4))[0])

    def recv_exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            part = self.sock.recv(count - len(data))
            if not part:
                raise EOFError(f"the daemon closed after {len(data)} of {count} bytes")
            data += part
        return data

    def send(self, command: int, body: bytes = b"", pad_to: int = 0, junk: bytes = b"") -> None:
        self.sequence += 1
        size = max(HEADER + len(body), pad_to)
        message = (header(command, self.sequence, size, junk, self.context) + body).ljust(size, b"\0")
        self.sock.sendall(struct.pack("<I", size) + message)

    def reply(self) -> Reply:
        (length,) = struct.unpack("<I", self.recv_exactly(4))
        return Reply(self.recv_exactly(length))

    def call(self, command: int, body: bytes = b"", pad_to: int = 0) -> Reply:
        self.send(command, body, pad_to)
        return self.reply()

    def load(self, model: bytes) -> Reply:
        reply = self.call(LOAD, struct.pack("<I", len(model)) + model + bytes(132))
        if reply.command == LOAD_ACK and reply.ack == 0:
            self.context = reply.context
        return reply

    def ioctl(self, subcommand: int) -> Reply:
        return self.call(IOCTL, struct.pack("<I", subcommand), pad_to=0x79)

    def set_inputs(self, arrays: list[np.ndarray], fmt: int = NHWC) -> None:
        body = bytearray(0x5F0 - HEADER)
        struct.pack_into("<I", body, 0, len(arrays))
        offset = 0
        for i, array in enumerate(arrays):
            struct.pack_into("<I", body, 0x70 - HEADER + 4 * i, array.nbytes)
            struct.pack_into("<I", body, 0x270 - HEADER + 4 * i, offset)
            body[0x470 - HEADER + i] = fmt
            body[0x4F0 - HEADER + i] = TYPE_CODES[array.dtype]
            offset += array.nbytes
        self.send(MULTI_INPUT, bytes(body) + b"".join(a.tobytes() for a in arrays))

    def run(self) -> Reply:
        return self.call(RUN, pad_to=0x478)

    def set_input_shapes(self, shapes: list[tuple[int, ...]], fmt: int = NHWC) -> Reply:
        """MsgSetInputShape as the toolkit sends it: u32 n at 0x6c, then one 0x169-byte tensor
        attribute per input from 0x70 (index, n_dims, dims[16], name[256], ..., fmt at +0x150)."""
        body = bytearray(SET_INPUT_SHAPE_BYTES - HEADER)
        struct.pack_into("<I", body, 0, len(shapes))
        for i, shape in enumerate(shapes):
            at = 0x70 - HEADER + i * ATTR_BYTES
            struct.pack_into(f"<II{len(shape)}I", body, at, i, len(shape), *shape)
            body[at + 0x150] = fmt
        return self.call(SET_INPUT_SHAPE, bytes(body))

    def close(self) -> None:
        self.sock.close()


def finish_outputs(reply: Reply, dtypes: list[np.dtype]) -> list[np.ndarray]:
    """The outputs of a MsgFinish: lengths at 0x7c, offsets at 0x27c, data from 0x47c."""
    (count,) = struct.unpack_from("<I", reply.data, 0x78)
    outputs = []
    for i in range(count):
        (length,) = struct.unpack_from("<I", reply.data, 0x7C + 4 * i)
        (offset,) = struct.unpack_from("<I", reply.data, 0x27C + 4 * i)
        outputs.append(np.frombuffer(reply.data, dtypes[i], length // dtypes[i].itemsize, 0x47C + offset))
    return outputs


@dataclass(frozen=True)
class Attr:
    """One tensor attribute of a MsgSetInputShape ack (the protocol's packed rknn_tensor_attr)."""

    index: int
    dims: tuple[int, ...]
    name: str
    n_elems: int
    size: int
    fmt: int
    type: int


def attrs(data: bytes, count_at: int) -> list[Attr]:
    """The u32 count at `count_at` and the 0x169-byte attributes after it."""
    (count,) = struct.unpack_from("<I", data, count_at)
    found = []
    for i in range(count):
        at = count_at + 4 + i * ATTR_BYTES
        index, n_dims = struct.unpack_from("<II", data, at)
        dims = struct.unpack_from(f"<{n_dims}I", data, at + 8)
        name = data[at + 0x48 : at + 0x148].split(b"\0", 1)[0].decode()
        n_elems, size = struct.unpack_from("<II", data, at + 0x148)
        found.append(Attr(index, dims, name, n_elems, size, data[at + 0x150], data[at + 0x151]))
    return found
