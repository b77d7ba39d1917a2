"""Doorbells: shared-memory frames rung over a unix socket, with no gRPC call per frame.

A RunShared frame moves no tensor bytes, yet each one is still a unary gRPC call: Python gRPC on
both sides, the event loop and a hop into the executor, together several times what the frame's
own bookkeeping costs. A doorbell takes them away for a client on the daemon's host: OpenDoorbell
checks a RunShared header once (shm_run.prepare) and answers an abstract unix socket and a ticket;
the client connects, hands in the ticket, and from then on each DoorbellRing it sends runs one
frame of that header on the connection's own thread (DataPlane.alone, under the session's compute
lock, the executor's jobs taking turns with it), answered by a DoorbellReply.

Who may ring: the ticket came from an authenticated gRPC call of the region's owner (32 random
bytes, good once, for TICKET_TTL_S); the connection must also come from that caller's user
(SO_PEERCRED). Anyone in the daemon's network namespace can connect to an abstract socket, so
connections without a valid ticket are answered and closed; at most MAX_HANDSHAKES_PER_USER of one
user (MAX_HANDSHAKES in all) wait to show theirs at a time, each for HANDSHAKE_TIMEOUT_S at most, so
another user cannot crowd a client out (it would fall back to RunShared calls, not fail). What a
ring may touch is what the checked header named: the owner's regions, each rechecked on every ring.
A doorbell ends when its client closes it, its session closes (released, reaped, the daemon
stopping), one of its regions is unregistered (that ring is NOT_FOUND), or a newer doorbell of the
same session opens; nothing of it outlives the session or its regions.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from google.protobuf.message import DecodeError

from rknn_proto import rknn_pb2
from rknn_proto.reasons import HINT_PREFIX, REASON_METADATA_KEY
from rknn_server.core.data_plane import DataPlane
from rknn_server.core.shm import Region, SharedMemoryRegistry
from rknn_server.errors import InvalidInput, NotFound, error_metadata, status_of
from rknn_server.kit.connections import unix_peer_uid
from rknn_server.observe.metrics import DaemonMetrics
from rknn_server.protocols.local.shm_run import SharedFrame

log = structlog.get_logger("rknn_server.doorbell")

TICKET_BYTES = 32
TICKET_TTL_S = 10.0
HANDSHAKE_TIMEOUT_S = 5.0
MAX_HANDSHAKES = 64
MAX_HANDSHAKES_PER_USER = 4
MAX_MESSAGE_BYTES = 4096  # a ring is a few bytes; anything longer is not one


@dataclass(eq=False)
class _Bell:
    """A ticket handed out, and once claimed the connection ringing it."""

    uid: int
    frame: SharedFrame
    expires: float
    connection: socket.socket | None = None
    frames: int = 0
    ended_by: str = ""  # set when the daemon hangs up
    answer: rknn_pb2.DoorbellReply | None = None  # the last OK reply, kept for frames of the same metas

    @property
    def session_id(self) -> str:
        return self.frame.session.id

    def hang_up(self, reason: str) -> None:
        """Wake the connection's thread from its wait for the next ring (it then ends); a frame in
        flight still sends its reply (only the reading side is shut)."""
        self.ended_by = reason
        if self.connection is not None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RD)


def _opened() -> bytes:
    """The OK answer to a ticket. No answer is ever an empty message (it would read as the
    connection's end): `outputs` is always present, here empty."""
    return rknn_pb2.DoorbellReply(outputs=rknn_pb2.OutputsHeader()).SerializeToString()


def _refusal(exc: BaseException) -> tuple[str, bytes]:
    """The status name of a failure and its answer, as the failed RunShared call would carry them (an
    unexpected error is logged once, under the reference the answer quotes)."""
    code, message = status_of(exc)
    trailing = dict(error_metadata(exc))
    answer = rknn_pb2.DoorbellReply(
        code=code.value[0],
        message=message,
        reason=trailing.pop(REASON_METADATA_KEY, ""),
        hints={key.removeprefix(HINT_PREFIX): value for key, value in trailing.items()},
    )
    return code.name, answer.SerializeToString()


class Doorbells:
    """The daemon's doorbell socket, the tickets handed out and the doorbells open, by session."""

    def __init__(self, plane: DataPlane, registry: SharedMemoryRegistry, metrics: DaemonMetrics) -> None:
        self.plane = plane
        self.registry = registry
        self.metrics = metrics
        self.address = f"rknn-doorbell-{secrets.token_hex(12)}"
        self._listener: socket.socket | None = None
        self._pending: dict[bytes, _Bell] = {}
        self._open: dict[str, _Bell] = {}  # by session id: one doorbell a session
        self._waiting: Counter[int] = Counter()  # connections yet to show a ticket, by uid
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()

    @property
    def available(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        """Bind the abstract socket and accept on a thread; without one (no AF_UNIX), none is offered."""
        try:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            listener.bind("\0" + self.address)
            listener.listen(MAX_HANDSHAKES)
        except OSError as exc:
            log.warning("doorbell_unavailable", error=str(exc))
            return
        self._listener = listener
        self._spawn(self._accept, listener, name="doorbell-accept")

    def open(self, uid: int, frame: SharedFrame) -> bytes:
        """A ticket for a doorbell ringing `frame`; the session's older doorbell and ticket go."""
        ticket = secrets.token_bytes(TICKET_BYTES)
        bell = _Bell(uid, frame, time.monotonic() + TICKET_TTL_S)
        with self._lock:
            now = time.monotonic()
            for key, old in list(self._pending.items()):
                if old.expires < now or old.session_id == bell.session_id:
                    del self._pending[key]
            self._pending[ticket] = bell
            previous = self._open.pop(bell.session_id, None)
        if previous is not None:
            previous.hang_up("a newer doorbell of its session opened")
        return ticket

    def session_closed(self, session_id: str) -> None:
        """Its doorbell (and any ticket for it) goes with the session, letting go of the regions'
        memory now (the registry closes them next: see daemon.py), not when its thread ends."""
        with self._lock:
            gone = [
                self._pending.pop(k) for k, b in list(self._pending.items()) if b.session_id == session_id
            ]
            bell = self._open.pop(session_id, None)
        if bell is not None:
            bell.hang_up("its session closed")
            gone.append(bell)
        for each in gone:
            each.frame.let_go()

    def close_all(self, grace_s: float) -> None:
        """Stop: no new connections, every doorbell hung up once its frame in flight (if any) is
        answered, waiting for those up to `grace_s` in all (as gRPC's stop waits for its calls)."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            bells = list(self._open.values())
            self._open.clear()
            self._pending.clear()
        for bell in bells:
            bell.hang_up("the daemon is stopping")
        deadline = time.monotonic() + grace_s
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- Threads ---------------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: object, name: str) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # shut down: the daemon is stopping
                return
            try:
                uid = unix_peer_uid(connection)
            except OSError:  # gone already
                connection.close()
                continue
            with self._lock:
                crowded = (
                    self._waiting[uid] >= MAX_HANDSHAKES_PER_USER or self._waiting.total() >= MAX_HANDSHAKES
                )
                if not crowded:
                    self._waiting[uid] += 1
            if crowded:
                connection.close()
                continue
            self._spawn(self._serve, connection, uid, name="doorbell")

    def _serve(self, connection: socket.socket, uid: int) -> None:
        with connection:
            try:
                bell = self._claim(connection, uid)
            finally:
                with self._lock:
                    self._waiting[uid] -= 1
                    if not self._waiting[uid]:
                        del self._waiting[uid]
            if bell is None:
                return
            try:
                reason = self._ring(bell, connection)
            finally:
                with self._lock:
                    if self._open.get(bell.session_id) is bell:
                        del self._open[bell.session_id]
            log.info("doorbell_closed", session=bell.session_id, frames=bell.frames, reason=reason)

    def _claim(self, connection: socket.socket, uid: int) -> _Bell | None:
        """The doorbell this connection's ticket opens, answered OK; else answered why not, and None."""
        connection.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            ticket = connection.recv(MAX_MESSAGE_BYTES)
        except OSError:  # timed out, reset
            return None
        with self._lock:
            bell = self._pending.pop(ticket, None)
            if bell is not None and bell.expires >= time.monotonic() and bell.uid == uid:
                bell.connection = connection
                self._open[bell.session_id] = bell
            else:
                bell = None
        if bell is None:
            refused = NotFound(
                "no such doorbell ticket (unknown, used, expired or another user's); call OpenDoorbell again"
            )
            with contextlib.suppress(OSError):
                connection.send(_refusal(refused)[1])
            return None
        connection.settimeout(None)
        try:
            connection.send(_opened())
        except OSError:
            return None
        log.info("doorbell_opened", session=bell.session_id)
        return bell

    def _ring(self, bell: _Bell, connection: socket.socket) -> str:
        """Run a frame per ring until the connection closes; why it ended."""
        last, frame_id = b"", 0  # a ring like the last one (run()'s are all frame 0) is read already
        try:
            while message := connection.recv(MAX_MESSAGE_BYTES):
                if message != last:
                    try:
                        frame_id = rknn_pb2.DoorbellRing.FromString(message).frame_id
                    except DecodeError:
                        connection.send(
                            _refusal(InvalidInput("a doorbell message must be a DoorbellRing"))[1]
                        )
                        return "the client sent something else than a DoorbellRing"
                    last = message
                found_closed = self._frame(bell, frame_id, connection)
                bell.frames += 1
                if found_closed:
                    # A session that closed takes its regions with it: that, if so, is why it ended.
                    return bell.ended_by or "a region of its frames was unregistered"
        except OSError as exc:
            return bell.ended_by or f"connection lost ({exc.strerror})"
        return bell.ended_by or "closed by the client"

    def _frame(self, bell: _Bell, frame_id: int, connection: socket.socket) -> bool:
        """Run one frame and answer it; whether it found a region closed (and so refused it), which
        ends the doorbell. A region unregistered after the answer went out ends it at the next ring,
        refused NOT_FOUND: hanging up at once would leave that ring unanswered. What only the daemon
        needs (the regions' use counts, its metrics) comes after the answer is sent, while the
        client reads its outputs."""
        regions = bell.frame.regions
        queued = time.perf_counter()
        self.registry.acquire(regions)
        try:
            closed = next((region for region in regions if region.closed), None)
            code, answer, started, ended = self._answer(bell, frame_id, queued, closed)
            connection.send(answer)
        finally:
            self.registry.release(regions)
        if code == "OK":
            self.metrics.model_run(bell.frame.session.digest, started - queued, ended - started)
        self.metrics.doorbell_frame(code)
        return closed is not None

    def _answer(
        self, bell: _Bell, frame_id: int, queued: float, closed: Region | None
    ) -> tuple[str, bytes, float, float]:
        """(status name, answer, when the run started and ended) of one frame, its regions held; a
        frame with a region closed is refused."""
        frame = bell.frame
        try:
            if closed is not None:
                raise NotFound(
                    f"shared-memory region {closed.key!r} was unregistered; open a doorbell for the new one"
                )
            metas, started = self.plane.alone(frame.session, queued, None, _timed, frame.run)
        except Exception as exc:
            code, refusal = _refusal(exc)
            return code, refusal, queued, queued
        ended = time.perf_counter()
        answer = bell.answer
        if answer is None or metas is not frame.placed:  # frames written in place share one list
            answer = bell.answer = rknn_pb2.DoorbellReply(outputs=rknn_pb2.OutputsHeader(outputs=metas))
        answer.outputs.run_time_us = int((ended - queued) * 1e6)
        answer.outputs.frame_id = frame_id
        return "OK", answer.SerializeToString(), started, ended


def _timed(run: Callable[[], list[rknn_pb2.TensorMeta]]) -> tuple[list[rknn_pb2.TensorMeta], float]:
    """A frame's metas and when its run started (after the wait for its session's lock)."""
    started = time.perf_counter()
    return run(), started


__all__ = ["TICKET_TTL_S", "Doorbells"]
