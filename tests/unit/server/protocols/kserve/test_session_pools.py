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


class _OpeningPlane:
    """A data plane whose opens take a few loop turns and give sessions already busy (every request
    finds no idle one), counting the sessions it holds."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}

    async def open(self, request: object) -> Session:
        for _ in range(3):
            await asyncio.sleep(0)
        session = _session(f"s{len(self.sessions)}", 0, busy=False)
        await session.lock.acquire()
        self.sessions[session.id] = session
        return session

    def session(self, session_id: str, owner: str, usable: bool = True) -> Session:
        return self.sessions[session_id]


def test_concurrent_requests_never_open_more_sessions_than_the_pool_holds() -> None:
    """A caller's requests arriving while others open sessions (the CI failure: five sessions in a
    pool of four under load): the pool's opening lock is kept while a request still waits on it, so a
    newcomer never opens beside the woken waiter."""
    plane = _OpeningPlane()
    pools = SessionPools(plane, capacity=64, parallel=3)  # type: ignore[arg-type]

    async def main() -> None:
        async def request(delay: int) -> None:
            for _ in range(delay):
                await asyncio.sleep(0)
            await pools.get("digest", "uid:0", shared=True)

        await asyncio.gather(*(request(delay) for delay in range(40)))

    asyncio.run(main())
    assert len(plane.sessions) == 3 and len(pools) == 3
