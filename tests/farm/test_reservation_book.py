"""The daemon's reservation book, driven directly on an event loop."""

from __future__ import annotations

import asyncio

import pytest

from rknn_proto import rknn_pb2
from rknn_server.errors import FailedPrecondition, InvalidInput, NotFound
from rknn_server.reservations import MAX_TTL_S, MIN_TTL_S, ReservationBook


def reserve(holder: str, ttl_s: float = 30.0, wait_s: float = 0.0) -> rknn_pb2.ReserveRequest:
    return rknn_pb2.ReserveRequest(holder=holder, ttl_s=ttl_s, wait_s=wait_s)


def test_grant_refuse_admit_release() -> None:
    async def scenario() -> None:
        book = ReservationBook()
        book.admit(None)  # free: anyone may open sessions
        granted = await book.reserve(reserve("alice"))
        assert granted.token and granted.ttl_s == 30.0
        book.admit(granted.token)
        with pytest.raises(FailedPrecondition, match=r"reserved by alice since \d{4}-\d\d-\d\dT"):
            book.admit(None)
        with pytest.raises(FailedPrecondition, match="reserved by alice"):
            book.admit("not-the-token")
        with pytest.raises(FailedPrecondition, match="reserved by alice"):
            await book.reserve(reserve("bob"))
        info = book.info_fields()
        assert info["reservation"].holder == "alice" and info["reservation_waiters"] == 0
        assert "token" not in str(info)
        book.release(rknn_pb2.ReleaseReservationRequest(token=granted.token))
        book.admit(None)
        assert "reservation" not in book.info_fields()
        with pytest.raises(NotFound, match="released, or it expired"):
            book.release(rknn_pb2.ReleaseReservationRequest(token=granted.token))

    asyncio.run(scenario())


def test_waiters_are_served_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        book = ReservationBook()
        first = await book.reserve(reserve("first"))
        order: list[str] = []

        async def wait_turn(name: str) -> None:
            granted = await book.reserve(reserve(name, wait_s=60))
            order.append(name)
            book.release(rknn_pb2.ReleaseReservationRequest(token=granted.token))

        tasks = []
        for name in ("b", "c", "d"):
            tasks.append(asyncio.create_task(wait_turn(name)))
            while book.info_fields()["reservation_waiters"] < len(tasks):
                await asyncio.sleep(0)
        book.release(rknn_pb2.ReleaseReservationRequest(token=first.token))
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["b", "c", "d"]


def test_expiry_passes_the_device_on_and_renewal_prevents_it() -> None:
    async def scenario() -> None:
        book = ReservationBook()
        held = await book.reserve(reserve("renewer", ttl_s=MIN_TTL_S))
        for _ in range(4):  # renewing keeps it across several TTLs
            await asyncio.sleep(MIN_TTL_S / 2)
            book.renew(rknn_pb2.RenewReservationRequest(token=held.token))
        book.admit(held.token)
        waiter = asyncio.create_task(book.reserve(reserve("next", wait_s=60)))
        granted = await waiter  # the holder stops renewing: after its TTL the waiter gets it
        assert granted.waited_s > 0
        with pytest.raises(NotFound):
            book.renew(rknn_pb2.RenewReservationRequest(token=held.token))
        with pytest.raises(FailedPrecondition, match="reserved by next"):
            book.admit(held.token)

    asyncio.run(scenario())


def test_a_waiter_that_gives_up_leaves_the_queue() -> None:
    async def scenario() -> None:
        book = ReservationBook()
        held = await book.reserve(reserve("holder"))
        with pytest.raises(FailedPrecondition, match="gave up after waiting"):
            await book.reserve(reserve("impatient", wait_s=0.05))
        cancelled = asyncio.create_task(book.reserve(reserve("cancelled", wait_s=60)))
        while book.info_fields()["reservation_waiters"] < 1:
            await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert book.info_fields()["reservation_waiters"] == 0
        book.release(rknn_pb2.ReleaseReservationRequest(token=held.token))
        book.admit(None)  # nobody inherited it

    asyncio.run(scenario())


def test_ttl_bounds() -> None:
    async def scenario() -> list[float]:
        ttls = []
        for ttl in (0.0, 0.01, 1e9):
            book = ReservationBook()
            ttls.append((await book.reserve(reserve("x", ttl_s=ttl))).ttl_s)
        with pytest.raises(InvalidInput):
            await ReservationBook().reserve(reserve("x", ttl_s=-1))
        return ttls

    assert asyncio.run(scenario()) == [60.0, MIN_TTL_S, MAX_TTL_S]


def test_client_chosen_tokens() -> None:
    async def scenario() -> None:
        book = ReservationBook()
        with pytest.raises(InvalidInput, match="at least 16 characters"):
            await book.reserve(rknn_pb2.ReserveRequest(holder="x", token="short"))
        chosen = "c" * 32
        granted = await book.reserve(rknn_pb2.ReserveRequest(holder="x", token=chosen))
        assert granted.token == chosen
        with pytest.raises(InvalidInput):  # a token in use cannot be chosen again
            await book.reserve(rknn_pb2.ReserveRequest(holder="y", token=chosen, wait_s=1))
        book.admit(chosen)
        book.release(rknn_pb2.ReleaseReservationRequest(token=chosen))
        book.admit(None)

    asyncio.run(scenario())
