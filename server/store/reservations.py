"""Device reservations for test farms: one holder at a time, waiters served first come, first served.

A reservation is distinct from a session's idle lease: it claims the whole device for one holder
(a CI job, a developer) across many sessions, so that nobody else opens sessions on it meanwhile.
It lives in the daemon, so several PCs sharing one farm see the same state. The holder proves
itself with a secret token (metadata "rknn-reservation") and keeps the reservation alive by
renewing it; a holder that dies stops renewing, and after its TTL the device passes to the next
waiter. Everything runs on the daemon's event loop, so no locking is needed.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone

import structlog

from rknn_proto.reasons import Reason
from rknn_server.errors import FailedPrecondition, InvalidInput, NotFound

log = structlog.get_logger("rknn_server.reservations")

# Bounds on a reservation's TTL: short enough to free a crashed holder's device soon, long enough
# that a holder is not required to renew in a tight loop.
MIN_TTL_S = 0.5
MAX_TTL_S = 3600.0
DEFAULT_TTL_S = 60.0
MIN_TOKEN_CHARS = 16


@dataclass
class Reservation:
    token: str
    holder: str
    ttl_s: float
    since_unix_s: float = field(default_factory=time.time)
    expires_at: float = 0.0
    timer: asyncio.TimerHandle | None = None

    def expires_in(self) -> float:
        return max(0.0, self.expires_at - time.monotonic())


@dataclass(frozen=True)
class Grant:
    """What a Reserve call got: the holder's token, its TTL and how long it waited in the queue."""

    token: str
    ttl_s: float
    waited_s: float


@dataclass
class _Waiter:
    token: str
    holder: str
    ttl_s: float
    granted: asyncio.Future[Reservation]


def _clamp_ttl(ttl_s: float) -> float:
    if ttl_s != ttl_s or ttl_s < 0:
        raise InvalidInput(f"ttl_s {ttl_s} is not a duration; give seconds > 0 (or 0 for the default)")
    return DEFAULT_TTL_S if ttl_s == 0 else min(MAX_TTL_S, max(MIN_TTL_S, ttl_s))


class ReservationBook:
    """The device's reservation and its queue of waiters, in plain terms (the gRPC handlers translate)."""

    def __init__(self) -> None:
        self._current: Reservation | None = None
        self._waiters: deque[_Waiter] = deque()

    # -- queries -------------------------------------------------------------------------------

    @property
    def current(self) -> Reservation | None:
        """The reservation in force (its token is the holder's secret: never report it)."""
        return self._current

    @property
    def waiting(self) -> int:
        """Reserve calls queued behind the current holder."""
        return len(self._waiters)

    def admit(self, token: str | None) -> None:
        """Let a new session open unless the device is reserved by someone else."""
        current = self._current
        if current is None or (token and _same_token(token, current.token)):
            return
        raise FailedPrecondition(
            f"{self._busy_text(current)}; no new sessions are accepted from others",
            reason=Reason.BOARD_RESERVED,
        )

    def _busy_text(self, current: Reservation) -> str:
        since = datetime.fromtimestamp(current.since_unix_s, tz=timezone.utc).isoformat(timespec="seconds")
        return (
            f"this device is reserved by {current.holder} since {since} (expires in "
            f"{current.expires_in():.1f}s unless renewed; {len(self._waiters)} waiting)"
        )

    # -- RPCs ----------------------------------------------------------------------------------

    async def reserve(self, holder: str, ttl_s: float, token: str = "", wait_s: float = 0.0) -> Grant:
        """Reserve the device for `holder` (TTL 0: the default), waiting up to wait_s s in the queue
        (0: not at all); `token` is the holder's own, else a random one is made."""
        holder = holder.strip() or "an unnamed holder"
        ttl_s = _clamp_ttl(ttl_s)
        token = self._new_token(token)
        start = time.monotonic()
        if self._current is None and not self._waiters:
            granted = self._grant(token, holder, ttl_s)
        elif wait_s <= 0:
            assert self._current is not None
            raise FailedPrecondition(self._busy_text(self._current), reason=Reason.BOARD_RESERVED)
        else:
            granted = await self._queue(
                _Waiter(token, holder, ttl_s, asyncio.get_running_loop().create_future()), wait_s
            )
        return Grant(granted.token, granted.ttl_s, time.monotonic() - start)

    def renew(self, token: str) -> float:
        """Restart the reservation's TTL; returns the seconds it now has left."""
        current = self._holding(token)
        self._arm(current)
        return current.expires_in()

    def release(self, token: str) -> None:
        self._end(self._holding(token), "released")

    # -- internals -----------------------------------------------------------------------------

    def _new_token(self, chosen: str) -> str:
        if not chosen:
            return secrets.token_urlsafe(24)
        taken = [w.token for w in self._waiters] + ([self._current.token] if self._current else [])
        if len(chosen) < MIN_TOKEN_CHARS or chosen in taken:
            raise InvalidInput(
                f"a client-chosen reservation token must be random and at least {MIN_TOKEN_CHARS} characters"
            )
        return chosen

    def _holding(self, token: str) -> Reservation:
        current = self._current
        if current is None or not token or not _same_token(token, current.token):
            raise NotFound(
                "this reservation does not exist: it was released, or it expired because it was not "
                "renewed within its TTL; reserve the device again",
                reason=Reason.RESERVATION_NOT_FOUND,
            )
        return current

    async def _queue(self, waiter: _Waiter, wait_s: float) -> Reservation:
        self._waiters.append(waiter)
        log.info("reservation_queued", holder=waiter.holder, position=len(self._waiters))
        try:
            await asyncio.wait({waiter.granted}, timeout=wait_s)
        except asyncio.CancelledError:
            self._leave(waiter)
            raise
        if waiter.granted.done():
            return waiter.granted.result()
        self._leave(waiter)
        assert self._current is not None
        raise FailedPrecondition(
            f"gave up after waiting {wait_s:g}s: {self._busy_text(self._current)}",
            reason=Reason.BOARD_RESERVED,
        )

    def _leave(self, waiter: _Waiter) -> None:
        """A waiter gives up (timeout, cancelled call); a grant that raced with that passes on."""
        if waiter.granted.done():
            self._end(waiter.granted.result(), "its waiter left before hearing of it")
            return
        waiter.granted.cancel()
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def _grant(self, token: str, holder: str, ttl_s: float) -> Reservation:
        reservation = Reservation(token, holder, ttl_s)
        self._current = reservation
        self._arm(reservation)
        log.info("reservation_granted", holder=holder, ttl_s=ttl_s, waiting=len(self._waiters))
        return reservation

    def _arm(self, reservation: Reservation) -> None:
        if reservation.timer is not None:
            reservation.timer.cancel()
        reservation.expires_at = time.monotonic() + reservation.ttl_s
        reservation.timer = asyncio.get_running_loop().call_later(
            reservation.ttl_s, self._end, reservation, "expired: its holder stopped renewing"
        )

    def _end(self, reservation: Reservation, reason: str) -> None:
        if self._current is not reservation:
            return
        if reservation.timer is not None:
            reservation.timer.cancel()
        self._current = None
        log.info("reservation_ended", holder=reservation.holder, reason=reason)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.granted.done():
                waiter.granted.set_result(self._grant(waiter.token, waiter.holder, waiter.ttl_s))
                return


__all__ = ["DEFAULT_TTL_S", "MAX_TTL_S", "MIN_TTL_S", "Grant", "Reservation", "ReservationBook"]


def _same_token(offered: str, held: str) -> bool:
    """Constant-time comparison; as bytes, since a client may send any text (non-ASCII included)."""
    return secrets.compare_digest(offered.encode(), held.encode())
