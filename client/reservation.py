"""A board's exclusive reservation as the client sees it: one granted, and one still queued.

`Device.reserve` hands out a `Reservation`; `Device.queue_reservation` a `PendingReservation`, so a
caller (the farm) can queue on many boards at once, take the first grant and withdraw from the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc

from rknn_client.errors import from_rpc_error
from rknn_proto import rknn_pb2


@dataclass(frozen=True)
class Reservation:
    """A granted reservation: `token` proves it (Device.use_reservation) and renews or releases it."""

    token: str
    ttl_s: float  # the lifetime without renewal the daemon granted
    waited_s: float  # how long the call queued

    @classmethod
    def from_wire(cls, reply: rknn_pb2.ReserveResponse) -> Reservation:
        return cls(token=reply.token, ttl_s=reply.ttl_s, waited_s=reply.waited_s)


class PendingReservation:
    """A Reserve call queued on a daemon. Its `token` is chosen before the call, so a grant whose
    answer is lost to a withdrawal can still be released."""

    def __init__(self, future: grpc.Future, token: str, where: str) -> None:
        self._future = future
        self.token = token
        self._where = where

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from gRPC's thread) once the daemon answered, refused or the call ended."""
        self._future.add_done_callback(lambda _: callback())

    def result(self) -> Reservation:
        """The grant, waiting for it; raises the typed RknnError (FailedPrecondition: still reserved
        by someone else when the wait ran out)."""
        try:
            return Reservation.from_wire(self._future.result())
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self._where) from None

    def withdraw(self) -> bool:
        """Leave the queue. True when the reservation may exist all the same (the daemon granted it
        before the cancellation reached it, or the answer was not taken yet): release `token` then."""
        return bool(self._future.cancel()) or self._future.exception() is None
