"""Which of a full pool's busy sessions a request queues on (kserve/session_pools.py), in-process."""

from __future__ import annotations

import asyncio

from rknn_server.core.sessions import Session
from rknn_server.protocols.kserve.session_pools import SessionPools
from rknn_server.runtime.base import RuntimeOptions


def _session(name: str, waiting: int, busy: bool = True) -> Session:
    session = Session(name, "digest", RuntimeOptions(), None, 60.0)  # type: ignore[arg-type]
    session.waiting = waiting
    if busy:
        asyncio.run(_lock(session))
    return session


async def _lock(session: Session) -> None:
    await session.lock.acquire()


def test_a_request_queues_where_fewest_wait_and_alike_sessions_take_turns() -> None:
    """Round robin queued a request behind two others while another session had none waiting: a
    core idle on a 2-core board while one session worked off its queue."""
    pools = SessionPools(None, capacity=8, parallel=2)  # type: ignore[arg-type]
    short, long = _session("short", 0), _session("long", 2)
    assert {pools._in_turn([long, short]).id for _ in range(4)} == {"short"}
    alike = [_session("a", 1), _session("b", 1)]
    assert sorted(pools._in_turn(alike).id for _ in range(4)) == ["a", "a", "b", "b"]
