"""The daemon's reservation book, driven directly on an event loop."""

from __future__ import annotations

import asyncio

import pytest

from rknn_server.errors import FailedPrecondition, InvalidInput, NotFound
from rknn_server.store.reservations import MAX_TTL_S, MIN_TTL_S, Grant, ReservationBook


async def reserve(book: ReservationBook, holder: str, ttl_s: float = 30.0, wait_s: float = 0.0) -> Grant:
    return await book.reserve(holder, ttl_s, wait_s=wait_s)


def test_grant_refuse_admit_release() -> None:
    async def scenario() -> None:
        book = ReservationBook()
        book.admit(None)  # free: anyone may open sessions
        granted = await reserve(book, "alice")
        assert granted.token and granted.ttl_s == 30.0
        book.admit(granted.token)
        with pytest.raises(FailedPrecondition, match=r"reserved by alice since \d{4}-\d\d-\d\dT"):
            book.admit(None)
        with pytest.raises(FailedPrecondition, match="reserved by alice"):
            book.admit("not-the-token")
        with pytest.raises(FailedPrecondition, match="reserved by alice"):
            await reserve(book, "bob")
        assert book.current is not None and book.current.holder == "alice" and book.waiting == 0
        book.release(granted.token)
        book.admit(None)
        assert book.current is None
        with pytest.raises(NotFound, match="released, or it expired"):
            book.release(granted.token)

    asyncio.run(scenario())


def test_waiters_are_served_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        book = ReservationBook()
        first = await reserve(book, "first")
        order: list[str] = []

        async def wait_turn(name: str) -> None:
            granted = await reserve(book, name, wait_s=60)
            order.append(name)
            book.release(granted.token)

        tasks = []
        for name in ("b", "c", "d"):
            tasks.append(asyncio.create_task(wait_turn(name)))
            while book.waiting < len(tasks):
                await asyncio.sleep(0)
        book.release(first.token)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["b", "c", "d"]


def test_expiry_passes_the_device_on_and_renewal_prevents_it() -> None:
    async def scenario() -> None:
        book = ReservationBook()
        held = await reserve(book, "renewer", ttl_s=MIN_TTL_S)
        for _ in range(4):  # renewing keeps it across several TTLs
            await asyncio.sleep(MIN_TTL_S / 2)
            book.renew(held.token)
        book.admit(held.token)
        waiter = asyncio.create_task(reserve(book, "next", wait_s=60))
        granted = await waiter  # the holder stops renewing: after its TTL the waiter gets it
        assert granted.waited_s > 0
        with pytest.raises(NotFound):
            book.renew(held.token)
        with pytest.raises(FailedPrecondition, match="reserved by next"):
            book.admit(held.token)

    asyncio.run(scenario())


def test_a_waiter_that_gives_up_leaves_the_queue() -> None:
    async def scenario() -> None:
        book = ReservationBook()
        held = await reserve(book, "holder")
        with pytest.raises(FailedPrecondition, match="gave up after waiting"):
            await reserve(book, "impatient", wait_s=0.05)
        cancelled = asyncio.create_task(reserve(book, "cancelled", wait_s=60))
        while book.waiting < 1:
            await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert book.waiting == 0
        book.release(held.token)
        book.admit(None)  # nobody inherited it

    asyncio.run(scenario())


def test_ttl_bounds() -> None:
    async def scenario() -> list[float]:
        ttls = []
        for ttl in (0.0, 0.01, 1e9):
            book = ReservationBook()
            ttls.append((await reserve(book, "x", ttl_s=ttl)).ttl_s)
        with pytest.raises(InvalidInput):
            await reserve(ReservationBook(), "x", ttl_s=-1)
        return ttls

    assert asyncio.run(scenario()) == [60.0, MIN_TTL_S, MAX_TTL_S]


def test_client_chosen_tokens() -> None:
    async def scenario() -> None:
        book = ReservationBook()
        with pytest.raises(InvalidInput, match="at least 16 characters"):
            await book.reserve("x", 0, token="short")
        chosen = "c" * 32
        granted = await book.reserve("x", 0, token=chosen)
        assert granted.token == chosen
        with pytest.raises(InvalidInput):  # a token in use cannot be chosen again
            await book.reserve("y", 0, token=chosen, wait_s=1)
        book.admit(chosen)
        book.release(chosen)
        book.admit(None)

    asyncio.run(scenario())
