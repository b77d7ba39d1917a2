"""A doorbell: shared-memory frames of one session rung over the daemon's unix socket.

Each frame through shared memory used to be a unary RunShared call: Python gRPC on both sides and
the daemon's event loop, for a message of a few hundred bytes. A doorbell (OpenDoorbell, then one
SOCK_SEQPACKET message each way per frame) leaves the daemon's thread waiting on the socket to run
the frame and answer, nothing else. shared_memory.py opens one per session and header, and falls
back to RunShared whenever a doorbell cannot be had or is lost (the frame is then run again: a
frame's outputs depend on its inputs alone).
"""

from __future__ import annotations

import contextlib
import socket
import weakref

import grpc

from rknn_client.errors import RknnError, from_status
from rknn_proto import rknn_pb2

MAX_REPLY_BYTES = 1 << 20  # a reply is an OutputsHeader's metas: far less than this
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_RUN_RING = rknn_pb2.DoorbellRing(frame_id=0).SerializeToString()  # every run()'s frame is frame 0


class DoorbellLost(RknnError):
    """The doorbell's connection ended (its session closed, the daemon stopped): ring it no more."""


class Doorbell:
    """An open doorbell: `ring` runs one frame of the header it was opened for."""

    def __init__(self, reply: rknn_pb2.OpenDoorbellResponse, where: str) -> None:
        self.where = where
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self._socket.settimeout(max(1.0, reply.ticket_ttl_s))
            self._socket.connect("\0" + reply.address)
            self._socket.send(reply.ticket)
            self._answer()
            self._socket.settimeout(None)  # a frame takes as long as the model does
        except OSError as exc:  # another network namespace than the daemon's: no such socket
            self._socket.close()
            raise DoorbellLost(f"{where}: cannot connect ({exc})") from None
        except BaseException:
            self._socket.close()
            raise
        self._finalizer = weakref.finalize(self, self._socket.close)

    def ring(self, frame_id: int) -> rknn_pb2.OutputsHeader:
        """Run one frame; raises the daemon's error as a typed RknnError, DoorbellLost if it is gone."""
        ring = _RUN_RING if frame_id == 0 else rknn_pb2.DoorbellRing(frame_id=frame_id).SerializeToString()
        try:
            self._socket.send(ring)
        except OSError as exc:
            raise DoorbellLost(f"{self.where}: the doorbell is gone ({exc.strerror})") from None
        return self._answer().outputs

    def close(self) -> None:
        """Hang up; a thread waiting in `ring` wakes (shut down first: closing alone would not wake it)."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._finalizer()

    def _answer(self) -> rknn_pb2.DoorbellReply:
        try:
            data = self._socket.recv(MAX_REPLY_BYTES)
        except OSError as exc:
            raise DoorbellLost(f"{self.where}: the doorbell is gone ({exc})") from None
        if not data:
            raise DoorbellLost(f"{self.where}: the daemon closed the doorbell")
        reply = rknn_pb2.DoorbellReply.FromString(data)
        if reply.code:
            code = _CODES.get(reply.code, grpc.StatusCode.UNKNOWN)
            raise from_status(code, reply.message, reply.reason or None, dict(reply.hints), self.where)
        return reply


__all__ = ["Doorbell", "DoorbellLost"]
