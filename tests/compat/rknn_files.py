"""A real RKNN file's outer layout, written from the public notes on the format (see
rknn_client.compat.rknn_file): only the parts load_rknn reads; the compiled model is filler bytes."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def write_rknn_file(path: Path, target: str = "rk3588", header_size: int = 64) -> Path:
    description = {
        "target_platform": [target],
        "version": "2.5.0",
        "graph": [
            {"left": "output", "left_tensor_id": 0, "right": "norm_tensor", "right_tensor_id": 1},
            {"left": "input", "left_tensor_id": 0, "right": "norm_tensor", "right_tensor_id": 0},
        ],
        "norm_tensor": [
            {"tensor_id": 0, "url": "images", "size": [1, 3, 640, 640], "dtype": {"vx_type": "int8"}},
            {"tensor_id": 1, "url": "output0", "size": [1, 255, 80, 80], "dtype": {"vx_type": "int8"}},
        ],
    }
    text = json.dumps(description).encode()
    compiled = bytes(range(256)) * 8
    head = b"RKNN" + b"\0" * 4 + struct.pack("<QQ", 6, len(compiled))
    head += b"\0" * (header_size - len(head))
    path.write_bytes(head + compiled + struct.pack("<Q", len(text)) + text)
    return path
