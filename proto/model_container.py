"""The virtual-board model file: what `export_rknn` writes when no RKNN-Toolkit2 converts the model.

It carries the built ONNX model and the build's settings, so `load_rknn` and the host runtime can run
it as the toolkit's scripts expect. It must never pass for a real RKNN model: Rockchip's tools read the
first four bytes as `RKNN` (or eight as `CYPTRKNN`), so this magic starts with a byte no text magic has.

Layout: MAGIC, a little-endian u32 header length, a UTF-8 JSON header (an object), the ONNX bytes.
Shared by the client (writes and reads it) and the daemon (runs it on the host runtime, refuses it
on a board runtime with the same explanation).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"\x89RKNN-OSS-VIRTUAL\r\n\x1a\n"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 1 << 20
_LENGTH = struct.Struct("<I")
VIRTUAL_ONLY = (
    "it was written by rknn_client's export_rknn without RKNN-Toolkit2 and runs on the virtual board "
    "(the host runtime) only; a board's librknnrt cannot run it. To make a real .rknn, convert the model "
    "with Rockchip's RKNN-Toolkit2 (rknn-client toolkit install) and export again"
)


class ContainerError(ValueError):
    """A file that starts like a virtual-board model but is not a valid one."""


@dataclass(frozen=True)
class VirtualModel:
    """The header's settings and the ONNX model bytes."""

    header: dict[str, Any]
    onnx: bytes


def is_virtual(head: bytes) -> bool:
    """Whether the file's first bytes are the virtual-board magic."""
    return head.startswith(MAGIC)


def pack(onnx_bytes: bytes, header: dict[str, Any]) -> bytes:
    text = json.dumps({"format": FORMAT_VERSION, **header}, sort_keys=True).encode()
    if len(text) > MAX_HEADER_BYTES:
        raise ContainerError(f"the header is {len(text)} bytes, over {MAX_HEADER_BYTES}")
    return MAGIC + _LENGTH.pack(len(text)) + text + onnx_bytes


def unpack(data: bytes) -> VirtualModel:
    """Parse a whole file's bytes; anything malformed is a ContainerError saying what."""
    if not is_virtual(data):
        raise ContainerError("not a virtual-board model (no magic)")
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start:
        raise ContainerError("the file ends inside its header length")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    if length > MAX_HEADER_BYTES or start + length > len(data):
        raise ContainerError(f"the header length {length} does not fit the file ({len(data)} bytes)")
    try:
        header = json.loads(data[start : start + length])
    except ValueError as exc:
        raise ContainerError(f"the header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        raise ContainerError(f"the header is not a format-{FORMAT_VERSION} object")
    body = data[start + length :]
    if not body:
        raise ContainerError("the file holds no model after its header")
    return VirtualModel(header, body)


def read(path: Path) -> VirtualModel:
    return unpack(path.read_bytes())


def file_is_virtual(path: Path) -> bool:
    with path.open("rb") as fh:
        return is_virtual(fh.read(len(MAGIC)))
