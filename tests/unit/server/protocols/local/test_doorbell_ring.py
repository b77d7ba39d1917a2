"""A doorbell's ring loop in-process, on a socket pair: when a region's unregistering ends it.

The daemon-level test (tests/reliability/test_doorbell.py) unregisters between two rings; whether the
region closes before or after the daemon's thread looks at it after the first answer is the machine's
timing. Here the registry closes the region exactly as that answer goes out, the one order that
once dropped the next ring unanswered (the connection hung up on it)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rknn_proto import rknn_pb2
from rknn_server.observe.metrics import DaemonMetrics
from rknn_server.protocols.local.doorbell import Doorbells, _Bell


@dataclass
class _Region:
    key: str
    closed: bool = False


@dataclass
class _Session:
    id: str = "s1"
    digest: str = "d" * 64


@dataclass
class _Frame:
    regions: list[_Region]
    session: _Session = field(default_factory=_Session)
    placed: list[rknn_pb2.TensorMeta] = field(default_factory=list)
    runs: int = 0

    def run(self) -> list[rknn_pb2.TensorMeta]:
        self.runs += 1
        return [rknn_pb2.TensorMeta()]


class _Plane:
    def alone(self, session: _Session, queued: float, timed: None, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class _UnregisteredAsAnswered:
    """A registry whose region closes when the first frame's use of it ends (its answer sent)."""

    def __init__(self) -> None:
        self.releases = 0

    def acquire(self, regions: Sequence[_Region]) -> None:
        pass

    def release(self, regions: Sequence[_Region]) -> None:
        self.releases += 1
        if self.releases == 1:
            for region in regions:
                region.closed = True


def _reply(client: socket.socket) -> rknn_pb2.DoorbellReply:
    client.settimeout(10)
    data = client.recv(4096)
    assert data, "the doorbell hung up instead of answering"
    return rknn_pb2.DoorbellReply.FromString(data)


def test_a_region_unregistered_after_an_answer_refuses_the_next_ring_then_ends() -> None:
    frame = _Frame([_Region("r")])
    doorbells = Doorbells(_Plane(), _UnregisteredAsAnswered(), DaemonMetrics())  # type: ignore[arg-type]
    bell = _Bell(uid=0, frame=frame, expires=0.0)  # type: ignore[arg-type]
    server, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reasons: list[str] = []
    thread = threading.Thread(target=lambda: reasons.append(doorbells._ring(bell, server)))
    thread.start()
    try:
        client.send(rknn_pb2.DoorbellRing(frame_id=1).SerializeToString())
        first = _reply(client)
        assert first.code == 0 and first.outputs.frame_id == 1
        client.send(rknn_pb2.DoorbellRing(frame_id=2).SerializeToString())
        second = _reply(client)
        assert second.code == 5, second  # NOT_FOUND
        assert "'r' was unregistered" in second.message
        thread.join(10)
        assert reasons == ["a region of its frames was unregistered"]
        assert frame.runs == 1  # the refused ring ran nothing
    finally:
        client.close()
        thread.join(10)
        server.close()
