"""Every limit the daemon enforces, declared once, with its wire form (GetInfo's `Limits`).

A limit is one field here, named exactly like its field of `rknn_pb2.Limits` and like the `dest` of
its `rknn_server` flag (server/cli.py), so that the flags build a `Limits` and `to_wire` reports it
without a list of names in between: a field missing from the proto or from the flags fails at once
(tests/unit/server/test_limits.py, tests/test_limits_reported.py). The parts that enforce them get
their own small views (`tensors()`, `cache()`, ...), built from this one object in `serve`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from rknn_proto import codec, rknn_pb2
from rknn_proto.version import CHUNK_BYTES, MAX_MESSAGE_BYTES
from rknn_server.data_plane import SessionLimits
from rknn_server.memory import MemoryLimits
from rknn_server.model_cache import CacheLimits

_TENSORS = codec.TensorLimits()


@dataclass(frozen=True)
class Limits:
    """The daemon's limits; 0 means "no limit" for the timeouts, the memory budgets and
    max_sessions_per_client (then max_sessions alone applies)."""

    # Messages and tensors (the frame intake, rknn_proto.codec).
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_chunk_bytes: int = _TENSORS.max_chunk_bytes
    max_tensor_bytes: int = _TENSORS.max_tensor_bytes
    max_tensor_rank: int = _TENSORS.max_rank
    max_tensor_elements: int = _TENSORS.max_elements
    max_tensors: int = _TENSORS.max_tensors
    # Sessions (sessions.py) and the runtime call deadline (--isolation process only).
    max_sessions: int = SessionLimits.max_sessions
    max_sessions_per_client: int = SessionLimits.max_per_client
    session_idle_timeout_s: float = SessionLimits.idle_timeout_s
    call_timeout_s: float = 0.0
    # Calls in flight and idle request streams (guard.py).
    max_inflight_requests: int = 64
    max_inflight_per_client: int = 16
    stream_idle_timeout_s: float = 30.0
    # Memory budgets (memory.py).
    max_memory_bytes: int = 0
    max_session_memory_bytes: int = 0
    # The model cache (model_cache.py).
    model_cache_quota_bytes: int = CacheLimits.quota_bytes
    max_model_bytes: int = CacheLimits.max_model_bytes
    max_model_files: int = CacheLimits.max_model_files
    partial_ttl_s: float = CacheLimits.partial_ttl_s

    @classmethod
    def for_machine(cls) -> Limits:
        """The defaults, with the memory budgets sized to this machine's RAM."""
        memory = MemoryLimits.for_machine()
        return cls(max_memory_bytes=memory.max_memory, max_session_memory_bytes=memory.max_session_memory)

    def to_wire(self) -> rknn_pb2.Limits:
        """GetInfo's `Limits`: every field, plus the chunk size the daemon sends."""
        return rknn_pb2.Limits(chunk_bytes=CHUNK_BYTES, **asdict(self))

    def without_call_timeout(self) -> Limits:
        """These limits where runtime calls cannot be cut short (a thread cannot be killed)."""
        return replace(self, call_timeout_s=0.0)

    # -- the views of the parts that enforce them ----------------------------------------------

    def tensors(self) -> codec.TensorLimits:
        return codec.TensorLimits(
            max_tensor_bytes=self.max_tensor_bytes,
            max_rank=self.max_tensor_rank,
            max_tensors=self.max_tensors,
            max_elements=self.max_tensor_elements,
            max_chunk_bytes=self.max_chunk_bytes,
        )

    def sessions(self) -> SessionLimits:
        return SessionLimits(self.max_sessions, self.session_idle_timeout_s, self.max_sessions_per_client)

    def memory(self) -> MemoryLimits:
        return MemoryLimits(self.max_memory_bytes, self.max_session_memory_bytes)

    def cache(self) -> CacheLimits:
        return CacheLimits(
            self.model_cache_quota_bytes, self.max_model_bytes, self.max_model_files, self.partial_ttl_s
        )


__all__ = ["Limits"]
