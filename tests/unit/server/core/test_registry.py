"""The session registry: slots reserved before a load, leases, and nothing else's business."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rknn_server.core.sessions import SessionRegistry
from rknn_server.errors import ResourceExhausted
from rknn_server.runtime.base import RuntimeOptions
from tests.unit.server.fakes import FakeRuntime


def add(registry: SessionRegistry, owner: str):  # type: ignore[no-untyped-def]
    registry.reserve(owner)
    return registry.add("d" * 64, RuntimeOptions(), FakeRuntime(Path("m"), RuntimeOptions()), owner)


def test_reserved_slots_count_against_both_limits_until_given_back() -> None:
    registry = SessionRegistry(max_sessions=2, idle_timeout_s=60, max_per_client=1)
    registry.reserve("alice")
    with pytest.raises(ResourceExhausted, match="max_sessions_per_client=1"):
        registry.reserve("alice")
    add(registry, "bob")
    with pytest.raises(ResourceExhausted, match="max_sessions=2"):
        registry.reserve("carol")
    registry.unreserve("alice")
    add(registry, "carol")
    assert len(registry) == 2


def test_expired_takes_only_idle_sessions_and_a_call_renews_the_lease() -> None:
    registry = SessionRegistry(max_sessions=4, idle_timeout_s=0.05)
    idle, used = add(registry, "a"), add(registry, "b")
    time.sleep(0.1)
    registry.get(used.id, "b")
    assert registry.expired() == [idle]
    assert len(registry) == 1 and registry.drain() == [used] and len(registry) == 0


def test_close_frees_the_runtime_and_survives_a_failing_close() -> None:
    registry = SessionRegistry(max_sessions=4, idle_timeout_s=60)
    session = add(registry, "a")
    runtime = session.runtime
    assert isinstance(runtime, FakeRuntime)

    def broken_close() -> None:
        raise RuntimeError("driver said no")

    runtime.close = broken_close  # type: ignore[method-assign]
    registry.close(session, "test")  # logged, not raised
