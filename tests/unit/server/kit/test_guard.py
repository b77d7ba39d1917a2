"""The guard's call counting: per client and in total, refusals with a reason, counts given back."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rknn_proto.reasons import REASON_METADATA_KEY
from rknn_server.config.limits import Limits
from rknn_server.kit.auth import AccessPolicy
from rknn_server.kit.guard import Guard
from rknn_server.observe.metrics import DaemonMetrics


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]] | None = None

    async def abort(
        self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.aborted = (code, details, trailing)
        raise Aborted


def guard(max_inflight: int, per_client: int) -> Guard:
    limits = Limits(max_inflight_requests=max_inflight, max_inflight_per_client=per_client)
    return Guard(AccessPolicy(None, False, False), limits, DaemonMetrics())


def test_one_client_at_its_cap_is_refused_and_others_still_get_in() -> None:
    async def main() -> None:
        g = guard(max_inflight=10, per_client=2)
        for _ in range(2):
            await g._count_in(FakeContext(), "alice", shared=True)
        context = FakeContext()
        with pytest.raises(Aborted):
            await g._count_in(context, "alice", shared=True)
        assert context.aborted is not None
        code, details, trailing = context.aborted
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_inflight_per_client=2" in details
        assert (REASON_METADATA_KEY, "LIMIT_EXCEEDED") in trailing
        assert g.refused["RESOURCE_EXHAUSTED"] == 1
        await g._count_in(FakeContext(), "bob", shared=True)
        g._count_out("alice", shared=True)
        await g._count_in(FakeContext(), "alice", shared=True)
        assert g.per_client == {"alice": 2, "bob": 1} and g.inflight == 3

    asyncio.run(main())


def test_the_shared_cap_spares_calls_that_only_wait() -> None:
    async def main() -> None:
        g = guard(max_inflight=1, per_client=5)
        await g._count_in(FakeContext(), "alice", shared=True)
        context = FakeContext()
        with pytest.raises(Aborted):
            await g._count_in(context, "bob", shared=True)
        assert context.aborted is not None and "max_inflight_requests=1" in context.aborted[1]
        await g._count_in(FakeContext(), "bob", shared=False)
        g._count_out("bob", shared=False)
        g._count_out("alice", shared=True)
        assert g.per_client == {} and g.inflight == 0

    asyncio.run(main())
