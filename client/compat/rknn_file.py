"""What `load_rknn` can tell from a model file before any runtime sees it.

Three kinds of file:
- a real RKNN model (RKNN-Toolkit2's export): magic `RKNN`, four padding bytes, a u64 file-format
  version and a u64 length of the compiled model, then (format 1 and older: 40 more header bytes) the
  compiled model, then a u64 length and a JSON description at the end of the file. The JSON gives the
  target platform(s), the toolkit version that wrote it, and the input tensors (`graph` entries with
  `left == "input"` pointing at `norm_tensor` entries: `url` is the name, `size` the shape). This layout
  comes from public notes on the format (a toolkit 1.6 export of yolov5s); the header offset is found
  by checking that the lengths add up to the file size, so a file that does not fit is reported as
  having no readable description rather than misread. Nothing of the compiled model is decoded.
- a virtual-board model (rknn_proto.model_container): export_rknn's file without the toolkit;
- anything else: handed to the runtime as it is (a board runtime decides).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rknn_proto import model_container

RKNN_MAGIC = b"RKNN"
ENCRYPTED_MAGIC = b"CYPTRKNN"
_U64 = struct.Struct("<Q")
_HEADER_SIZES = (24, 64)
MAX_DESCRIPTION_BYTES = 16 << 20


@dataclass(frozen=True)
class RknnTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class RknnHeader:
    """What a real RKNN file's header and description say; empty fields were not readable."""

    file_format: int
    encrypted: bool
    target_platforms: tuple[str, ...] = ()
    toolkit_version: str = ""
    inputs: tuple[RknnTensor, ...] = ()

    def summary(self) -> str:
        parts = [f"RKNN file format {self.file_format}"]
        if self.encrypted:
            parts.append("encrypted")
        if self.target_platforms:
            parts.append(f"built for {', '.join(self.target_platforms)}")
        if self.toolkit_version:
            parts.append(f"by RKNN-Toolkit2 {self.toolkit_version}")
        for tensor in self.inputs:
            parts.append(f"input {tensor.name} {list(tensor.shape)} {tensor.dtype}")
        if not self.target_platforms and not self.encrypted:
            parts.append("no readable model description")
        return ", ".join(parts)


def _description(fh: Any, size: int, data_length: int) -> dict[str, Any] | None:
    for header_size in _HEADER_SIZES:
        length_at = header_size + data_length
        if length_at + _U64.size > size:
            continue
        fh.seek(length_at)
        (length,) = _U64.unpack(fh.read(_U64.size))
        if length_at + _U64.size + length != size or length > MAX_DESCRIPTION_BYTES:
            continue
        try:
            parsed = json.loads(fh.read(length))
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def _inputs(description: dict[str, Any]) -> tuple[RknnTensor, ...]:
    tensors = {t.get("tensor_id"): t for t in description.get("norm_tensor", []) if isinstance(t, dict)}
    entries = [g for g in description.get("graph", []) if isinstance(g, dict) and g.get("left") == "input"]
    found = []
    for entry in sorted(entries, key=lambda g: int(g.get("left_tensor_id", 0))):
        tensor = tensors.get(entry.get("right_tensor_id"), {})
        dtype = tensor.get("dtype", {})
        found.append(
            RknnTensor(
                str(tensor.get("url", "")),
                tuple(int(d) for d in tensor.get("size", [])),
                str(dtype.get("vx_type", "")) if isinstance(dtype, dict) else "",
            )
        )
    return tuple(found)


def read_rknn_header(path: Path) -> RknnHeader | None:
    """The header of a real RKNN file, or None when the file is not one."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(24)
        if head.startswith(ENCRYPTED_MAGIC):
            return RknnHeader(file_format=0, encrypted=True)
        if not head.startswith(RKNN_MAGIC) or len(head) < 24:
            return None
        (file_format,) = _U64.unpack_from(head, 8)
        (data_length,) = _U64.unpack_from(head, 16)
        try:
            description = _description(fh, size, data_length)
        except (ValueError, TypeError):
            description = None
    if description is None:
        return RknnHeader(int(file_format), False)
    platforms = description.get("target_platform", [])
    if isinstance(platforms, str):
        platforms = [platforms]
    try:
        inputs = _inputs(description)
    except (ValueError, TypeError, AttributeError):
        inputs = ()
    return RknnHeader(
        int(file_format),
        False,
        tuple(str(p).lower() for p in platforms),
        str(description.get("version", "")),
        inputs,
    )


@dataclass(frozen=True)
class ModelFileKind:
    """What load_rknn found: a real RKNN header, a virtual-board model, or neither (`other`)."""

    rknn: RknnHeader | None = None
    virtual: model_container.VirtualModel | None = None

    @property
    def other(self) -> bool:
        return self.rknn is None and self.virtual is None


def inspect(path: Path) -> ModelFileKind:
    """Classify a model file; a damaged virtual-board file raises ContainerError."""
    if model_container.file_is_virtual(path):
        return ModelFileKind(virtual=model_container.read(path))
    return ModelFileKind(rknn=read_rknn_header(path))
