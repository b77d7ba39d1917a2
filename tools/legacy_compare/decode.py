"""The fields of each recorded unit, decoded from the observed facts (docs/legacy-protocol.md and
/work/shared/reference), independently of the daemon's own code so that a decoding slip of ours
shows up as a difference instead of hiding on both sides.

Only what has a known meaning is decoded; the rest (header bytes 0x30-0x6b, which the client leaves
uninitialised and the real server echoes, name padding, unused records, heap garbage) is not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMMANDS = {
    0: "LOAD", 1: "LOAD_ACK", 2: "UNLOAD", 3: "UNLOAD_ACK", 5: "RUN", 7: "FINISH", 8: "IOCTL",
    9: "IOCTL_ACK", 10: "MULTI_INPUT", 11: "VERSION", 12: "VERSION_ACK", 13: "CRASH", 14: "SET_CORE",
    15: "SET_CORE_ACK", 16: "SET_INPUT_SHAPE", 17: "SET_INPUT_SHAPE_ACK", 18: "SET_INPUT_ACK",
}  # fmt: skip
HEADER = struct.Struct("<IIqIQIIIII")
HEADER_BYTES = 0x6C
RECORD_BYTES = 0x15A
INPUTS_AT, N_OUTPUT_AT, OUTPUTS_AT = 0x7C, 0xAD91, 0xAD95
FINISH_LEN_AT, FINISH_OFFSET_AT, FINISH_DATA_AT = 0x7C, 0x27C, 0x47C
ATTR_BYTES = 0x169  # a packed rknn_tensor_attr (commands 16 and 17)
SHAPE_ACK_INPUTS_AT, SHAPE_ACK_OUTPUTS_AT = 0x70, 0xB4F4
RANGES_AT, RANGE_BYTES = 0xE8, 0x810D  # INPUT_DYNAMIC_RANGE: n_input, is_dynamic, then the records


@dataclass(frozen=True)
class Unit:
    connection: int
    direction: str  # "c2s" or "s2c"
    data: bytes


def read_transcript(path: Path, start: int = 0, stop: int | None = None) -> list[Unit]:
    lines = path.read_text().splitlines()[start:stop]
    return [
        Unit(entry["conn"], entry["dir"], base64.b64decode(entry["data"])) for entry in map(json.loads, lines)
    ]


def mask_times(text: str) -> str:
    """A performance text with its numbers as N: the same shape whatever the runs took."""
    return re.sub(r"\d+(\.\d+)?", "N", text)


def _u32(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<I", data, at)[0]) if at + 4 <= len(data) else -1


def _u64(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<Q", data, at)[0]) if at + 8 <= len(data) else -1


def _text(data: bytes, at: int, most: int | None = None) -> str:
    raw = data[at : None if most is None else at + most]
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _record(data: bytes, at: int) -> dict[str, Any]:
    n_dims = data[at + 0x100]
    return {
        "name": _text(data, at, 256),
        "dims": [_u32(data, at + 0x101 + 4 * i) for i in range(min(n_dims, 16))],
        "fmt": data[at + 0x141],
        "type": data[at + 0x142],
        "qnt": data[at + 0x143],
        "fl": data[at + 0x144],
        "zp": struct.unpack_from("<i", data, at + 0x145)[0],
        "scale": round(struct.unpack_from("<f", data, at + 0x149)[0], 6),
        "w_stride": _u32(data, at + 0x14D),
        "size_with_stride": _u32(data, at + 0x151),
    }


def _attr(data: bytes, at: int) -> dict[str, Any]:
    """A packed rknn_tensor_attr as commands 16 and 17 carry it."""
    n_dims = _u32(data, at + 4)
    return {
        "index": _u32(data, at),
        "dims": [_u32(data, at + 8 + 4 * i) for i in range(min(n_dims, 16))],
        "name": _text(data, at + 0x48, 256),
        "n_elems": _u32(data, at + 0x148),
        "size": _u32(data, at + 0x14C),
        "fmt": data[at + 0x150],
        "type": data[at + 0x151],
        "qnt": data[at + 0x152],
        "fl": data[at + 0x153],
        "zp": struct.unpack_from("<i", data, at + 0x154)[0],
        "scale": round(struct.unpack_from("<f", data, at + 0x158)[0], 6),
        "w_stride": _u32(data, at + 0x15C),
        "size_with_stride": _u32(data, at + 0x160),
        "pass_through": data[at + 0x164],
        "h_stride": _u32(data, at + 0x165),
    }


def _attrs(data: bytes, at: int, prefix: str) -> dict[str, Any]:
    """`u32 n` at `at`, then n packed attributes."""
    n = _u32(data, at)
    fields: dict[str, Any] = {f"n_{prefix}": n}
    for i in range(min(n, 8)):
        fields[f"{prefix}{i}"] = _attr(data, at + 4 + i * ATTR_BYTES)
    return fields


def _dynamic_ranges(data: bytes) -> dict[str, Any]:
    """n_input, is_dynamic, and each input's rknn_input_range (a static model's too: both servers
    fill in what the runtime's query answers, no shapes)."""
    n = _u32(data, RANGES_AT)
    fields: dict[str, Any] = {"n_input": n, "is_dynamic": _u32(data, RANGES_AT + 4)}
    for i in range(min(n, 8)):
        at = RANGES_AT + 8 + i * RANGE_BYTES
        count, n_dims = _u32(data, at + 4), _u32(data, at + 9)
        shapes = [
            [_u32(data, at + 0xD + 64 * s + 4 * d) for d in range(min(n_dims, 16))]
            for s in range(min(count, 512))
        ]
        fields[f"input{i}"] = {
            "index": _u32(data, at),
            "fmt": data[at + 8],
            "n_dims": n_dims,
            "shapes": shapes,
            "name": _text(data, at + 0x800D, 256),
        }
    return fields


def _model_info(data: bytes) -> dict[str, Any]:
    n_in, n_out = _u32(data, INPUTS_AT), _u32(data, N_OUTPUT_AT)
    fields: dict[str, Any] = {"n_input": n_in, "n_output": n_out}
    for i in range(min(n_in, 8)):
        fields[f"input{i}"] = _record(data, INPUTS_AT + 4 + i * RECORD_BYTES)
    for i in range(min(n_out, 8)):
        fields[f"output{i}"] = _record(data, OUTPUTS_AT + i * RECORD_BYTES)
    return fields


def _ioctl_ack(data: bytes) -> dict[str, Any]:
    subcommand = _u32(data, 0x70)
    fields: dict[str, Any] = {"ack": _u32(data, 0x6C), "subcmd": subcommand, "data_len": _u64(data, 0x74)}
    if subcommand == 0:
        fields.update(_model_info(data))
    elif subcommand in (1, 3):  # perf detail, memory detail: u64 then the text
        size = _u64(data, 0x7C)  # the text's buffer (the real server does not end it with a NUL)
        text = _text(data[: 0x84 + size], 0x84)
        # Their lengths as conventions (how far from the text's length), apart from the text itself.
        fields["data_len_minus_u64"] = fields.pop("data_len") - size
        fields["u64_minus_text"] = size - len(text)
        fields["text"] = mask_times(text) if subcommand == 1 else text
    elif subcommand == 2:  # perf run: the run's microseconds
        fields["us"] = _u64(data, 0x7C)
    elif subcommand == 7:
        fields.update(_dynamic_ranges(data))
    return fields


def _finish(data: bytes) -> dict[str, Any]:
    n = _u32(data, 0x78)
    lengths = [_u32(data, FINISH_LEN_AT + 4 * i) for i in range(min(n, 128))]
    offsets = [_u32(data, FINISH_OFFSET_AT + 4 * i) for i in range(min(n, 128))]
    fields: dict[str, Any] = {"frame_id": _u64(data, 0x6C), "result": _u32(data, 0x74), "n_output": n}
    fields.update({"len": lengths, "offset": offsets})
    for i, (length, offset) in enumerate(zip(lengths, offsets, strict=True)):
        fields[f"output{i}"] = _digest(data[FINISH_DATA_AT + offset : FINISH_DATA_AT + offset + length])
    return fields


def _request_body(command: int, data: bytes) -> dict[str, Any]:
    if command == 0:
        size = _u32(data, 0x6C)
        return {"model_size": size, "model": _digest(data[0x70 : 0x70 + size])}
    if command == 8:
        return {
            "subcmd": _u32(data, 0x6C),
            "u64": _u64(data, 0x70),
            "u8": data[0x78] if len(data) > 0x78 else -1,
        }
    if command == 10:
        n = _u32(data, 0x6C)
        return {"n": n, "sizes": [_u32(data, 0x70 + 4 * i) for i in range(min(n, 128))]}
    if command == 16:
        return _attrs(data, 0x6C, "input")
    return {}


def decode(unit: Unit, first: bool) -> dict[str, Any]:
    """A unit's fields; `first` marks the connection's first unit in its direction (open, status)."""
    data = unit.data
    if first and unit.direction == "c2s":
        _zero, _fd, device_type, _pid = struct.unpack_from("<4I", data)
        return {"kind": "OPEN", "length": len(data), "device_type": device_type, "devid": _text(data, 16, 32)}
    if first:
        return {"kind": "STATUS", "length": len(data), "status": struct.unpack_from("<i", data)[0]}
    if len(data) < HEADER_BYTES:
        return {"kind": "SHORT", "length": len(data)}
    magic, version, context, flags, sequence, _, _, command, size, model_id = HEADER.unpack_from(data)
    fields: dict[str, Any] = {"kind": COMMANDS.get(command, f"CMD{command}"), "length": len(data)}
    fields.update({"magic": hex(magic), "version": version, "ctx": context, "flags": hex(flags)})
    fields.update({"seq": sequence, "size": size, "model_id": model_id})
    if unit.direction == "c2s":
        fields.update(_request_body(command, data))
    elif command == 9:
        fields.update(_ioctl_ack(data))
    elif command == 7:
        fields.update(_finish(data))
    elif command == 17:
        fields["ack"] = _u32(data, 0x6C)
        fields.update(_attrs(data, SHAPE_ACK_INPUTS_AT, "input"))
        fields.update(_attrs(data, SHAPE_ACK_OUTPUTS_AT, "output"))
    elif command in (12, 13):
        fields["ack"] = _u32(data, 0x6C)
        fields["text"] = _text(data, 0x70)
    else:
        fields["ack"] = _u32(data, 0x6C)
    return fields
