"""The one Limits: its wire form reports every limit, and the parts that enforce them get its values."""

from __future__ import annotations

from dataclasses import asdict, fields

from rknn_proto import rknn_pb2
from rknn_proto.version import CHUNK_BYTES
from rknn_server.config.limits import Limits
from rknn_server.protocols.grpc.service import wire_limits


def distinct() -> Limits:
    """Limits whose every value differs from its default and from every other value."""
    values = {}
    for i, f in enumerate(fields(Limits), start=1):
        default = getattr(Limits, f.name)
        values[f.name] = default + 1000 + i if isinstance(default, int) else default + 1000.5 + i
    return Limits(**values)


def test_the_wire_form_carries_every_limit_and_nothing_else() -> None:
    limits = distinct()
    wire = wire_limits(limits)
    assert {f.name for f in rknn_pb2.Limits.DESCRIPTOR.fields} == {"chunk_bytes", *asdict(limits)}
    for name, value in asdict(limits).items():
        assert getattr(wire, name) == value, name
    assert wire.chunk_bytes == CHUNK_BYTES
    # What travels comes back as it was sent.
    assert rknn_pb2.Limits.FromString(wire.SerializeToString()) == wire


def test_the_views_hand_each_part_its_values() -> None:
    limits = distinct()
    tensors, cache, sessions, memory = limits.tensors(), limits.cache(), limits.sessions(), limits.memory()
    assert (
        tensors.max_tensor_bytes,
        tensors.max_rank,
        tensors.max_tensors,
        tensors.max_elements,
        tensors.max_chunk_bytes,
    ) == (
        limits.max_tensor_bytes,
        limits.max_tensor_rank,
        limits.max_tensors,
        limits.max_tensor_elements,
        limits.max_chunk_bytes,
    )
    assert (cache.quota_bytes, cache.max_model_bytes, cache.max_model_files, cache.partial_ttl_s) == (
        limits.model_cache_quota_bytes,
        limits.max_model_bytes,
        limits.max_model_files,
        limits.partial_ttl_s,
    )
    assert (sessions.max_sessions, sessions.idle_timeout_s, sessions.max_per_client) == (
        limits.max_sessions,
        limits.session_idle_timeout_s,
        limits.max_sessions_per_client,
    )
    assert (memory.max_memory, memory.max_session_memory) == (
        limits.max_memory_bytes,
        limits.max_session_memory_bytes,
    )


def test_without_a_call_timeout_only_the_timeout_changes() -> None:
    limits = distinct()
    assert limits.without_call_timeout() == Limits(**{**asdict(limits), "call_timeout_s": 0.0})
