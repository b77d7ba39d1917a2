"""The bounds a tensor receiver enforces, apart from the codec so that a daemon's option parser can read
their defaults without importing numpy."""

from __future__ import annotations

from dataclasses import dataclass

from rknn_proto.version import CHUNK_BYTES


@dataclass(frozen=True)
class TensorLimits:
    """Bounds a receiver enforces before allocating anything."""

    max_tensor_bytes: int = 4 << 30
    max_rank: int = 16
    max_tensors: int = 256
    max_elements: int = 1 << 32
    max_chunk_bytes: int = 4 * CHUNK_BYTES
