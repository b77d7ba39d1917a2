"""Doorbells against a live daemon: frames without a gRPC call each, the same outputs as the wire,
and every way in refused but the ticket's owner (server/protocols/local/doorbell.py, client/local/doorbell.py)."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rknn_client.device import Device
from rknn_client.errors import NotFound, SessionLost
from rknn_client.local import shared_memory
from rknn_client.local.doorbell import DoorbellLost
from rknn_client.session import Session
from rknn_proto import rknn_pb2
from rknn_server.testing import DaemonProcess, start_daemon
from tests.reliability.conftest import (
    StartDaemon,
    cnn_input,
    device,
    events,
    kill,
    python_child,
    rpcs,
    wait_line,
)
from tests.reliability.test_shared_memory import ROOT, held, wait_until


@pytest.fixture(scope="module")
def doorbell_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon for the many examples of a property test."""
    folder = tmp_path_factory.mktemp("doorbell")
    daemon = start_daemon(folder / "cache", folder / "daemon.log", ["--runtime", "host"])
    yield daemon
    daemon.stop()


FRAMES = [np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32) for seed in range(4)]


def frame_header(session: Session) -> rknn_pb2.InferenceHeader:
    """A RunShared header over the session's own region, as the client laid it for its last frame."""
    bound = session.shm.bound
    assert bound is not None
    region = bound.region
    meta = rknn_pb2.TensorMeta(
        dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=[1, 3, 16, 16], layout=rknn_pb2.LAYOUT_NCHW, byte_length=3072
    )
    return rknn_pb2.InferenceHeader(
        session_id=session.id,
        inputs=[meta],
        input_regions=[rknn_pb2.TensorRegion(key=region.key, offset=0, byte_length=3072)],
        output_regions=[rknn_pb2.TensorRegion(key=region.key, offset=4096, byte_length=40)],
    )


def open_raw(dev: Device, session: Session) -> rknn_pb2.OpenDoorbellResponse:
    reply: rknn_pb2.OpenDoorbellResponse = dev._stub.OpenDoorbell(
        rknn_pb2.OpenDoorbellRequest(header=frame_header(session)), metadata=dev.metadata, timeout=30
    )
    return reply


def knock(address: str, first: bytes) -> rknn_pb2.DoorbellReply | None:
    """Connect to a doorbell socket and send `first`; its answer, or None when it hung up silently."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as bell:
        bell.settimeout(30)
        bell.connect("\0" + address)
        bell.send(first)
        data = bell.recv(1 << 16)
        return rknn_pb2.DoorbellReply.FromString(data) if data else None


@pytest.mark.parametrize("kind", ["memfd", "file"])
def test_frames_ring_the_doorbell_with_the_wires_outputs_bit_for_bit(
    daemons: StartDaemon, cnn: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RKNN_SHM", "on" if kind == "memfd" else "file")
    daemon = daemons()
    with device(daemon) as shared, shared.load(cnn) as session, device(daemon) as wire:
        assert shared.handshake().shared_memory.doorbell
        shared_memory.disable(wire)
        with wire.load(cnn) as wired:
            for frame in FRAMES:
                got, want = session.run([frame]), wired.run([frame])
                assert [a.tobytes() for a in got] == [a.tobytes() for a in want]
    assert rpcs(daemon, "OpenDoorbell") == 1
    assert rpcs(daemon, "RunShared") == 0  # no frame was a call of its own
    assert wait_until(lambda: events(daemon, "doorbell_closed"))  # logged by the doorbell's own thread
    closed = events(daemon, "doorbell_closed")
    assert [(e["frames"], e["reason"]) for e in closed] == [(len(FRAMES), "its session closed")]


def test_without_the_doorbell_each_frame_is_a_runshared_call(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    with device(daemon) as dev, dev.load(cnn) as session:
        shared_memory.use_doorbell(dev, False)
        for frame in FRAMES:
            session.run([frame])
    assert rpcs(daemon, "RunShared") == len(FRAMES) and rpcs(daemon, "OpenDoorbell") == 0


def test_a_ticket_opens_once_for_its_user_only(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    with device(daemon) as dev, dev.load(cnn) as session:
        session.run([cnn_input()])  # the session's region is registered
        reply = open_raw(dev, session)
        assert len(reply.ticket) == 32 and reply.ticket_ttl_s > 0
        forged = knock(reply.address, os.urandom(32))
        assert forged is not None and forged.code == 5 and "ticket" in forged.message  # NOT_FOUND
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as bell:
            bell.connect("\0" + reply.address)
            bell.send(reply.ticket)
            opened = rknn_pb2.DoorbellReply.FromString(bell.recv(1 << 16))
            assert opened.code == 0
            bell.send(rknn_pb2.DoorbellRing(frame_id=7).SerializeToString())
            ran = rknn_pb2.DoorbellReply.FromString(bell.recv(1 << 16))
            assert ran.code == 0 and ran.outputs.frame_id == 7 and ran.outputs.outputs[0].byte_length == 40
        again = knock(reply.address, reply.ticket)  # good once
        assert again is not None and again.code == 5


_INTRUDER = """
import os, socket, sys
from rknn_proto import rknn_pb2
address, ticket = sys.argv[1], bytes.fromhex(sys.argv[2])
os.setuid(65534)
with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as bell:
    bell.settimeout(30)
    bell.connect("\\0" + address)
    bell.send(ticket)
    reply = rknn_pb2.DoorbellReply.FromString(bell.recv(65536))
    try:
        bell.send(rknn_pb2.DoorbellRing(frame_id=1).SerializeToString())
        after = bell.recv(65536)
    except OSError:  # EPIPE: hung up already
        after = b""
print(reply.code, len(after))
"""


@ROOT
def test_another_user_holding_my_ticket_cannot_ring(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    with device(daemon) as dev, dev.load(cnn) as session:
        session.run([cnn_input()])
        reply = open_raw(dev, session)
        intruder = subprocess.run(
            [sys.executable, "-c", _INTRUDER, reply.address, reply.ticket.hex()],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert intruder.returncode == 0, intruder.stderr
        assert intruder.stdout.split() == ["5", "0"]  # NOT_FOUND, then hung up: no frame ran
        assert session.run([cnn_input()])[0].shape == (1, 10)


def test_a_doorbell_goes_with_its_session_and_the_client_falls_back(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    with device(daemon) as dev:
        session = dev.load(cnn)
        want = session.run([FRAMES[0]])[0].tobytes()
        bell = dev.open_doorbell(frame_header(session))
        assert bell.ring(3).frame_id == 3
        # A newer doorbell of the session hangs the older one up; the client's next frame then goes
        # as one RunShared call, and the frame after that rings a doorbell again.
        assert session.run([FRAMES[0]])[0].tobytes() == want
        assert session.run([FRAMES[0]])[0].tobytes() == want
        with pytest.raises(DoorbellLost):
            bell.ring(4)
        # The third OpenDoorbell was the last call served by the event loop: its line is written just
        # after its reply left (calls.Recorder), so it is waited for.
        assert wait_until(lambda: rpcs(daemon, "OpenDoorbell") == 3) and rpcs(daemon, "RunShared") == 1
        session.release()
        assert wait_until(lambda: len(events(daemon, "doorbell_closed")) == 3)
        reasons = {e["reason"] for e in events(daemon, "doorbell_closed")}
        assert reasons == {"a newer doorbell of its session opened", "its session closed"}
        with pytest.raises(SessionLost):
            session.run([FRAMES[0]])


def test_an_unregistered_region_ends_the_doorbell_and_nothing_of_it_is_held(
    daemons: StartDaemon, cnn: Path
) -> None:
    daemon = daemons()
    with device(daemon) as dev, dev.load(cnn) as session:
        session.run([cnn_input()])
        bound = session.shm.bound
        assert bound is not None
        name = next(r.name for r in dev.shared_memory_status() if r.session_id == session.id)
        bell = dev.open_doorbell(frame_header(session))
        bell.ring(1)
        assert held(daemon.pid, name)
        assert dev.unregister_shared_memory(bound.region.key) == 1
        with pytest.raises(NotFound, match="unregistered"):
            bell.ring(2)
        with pytest.raises(DoorbellLost):
            bell.ring(3)
        assert wait_until(lambda: held(daemon.pid, name) == [])  # descriptor and mapping both gone
        assert session.run([cnn_input()])[0].shape == (1, 10)  # a new region, a new doorbell


_CLIENT = """
import sys, numpy as np, rknn_client
dev = rknn_client.connect(sys.argv[1])
session = dev.load(sys.argv[2])
session.run([np.zeros((1, 3, 16, 16), np.float32)])
print("ran", session.id, flush=True)
sys.stdin.read()
"""


def test_a_killed_client_ends_its_doorbell_and_the_daemon_serves_on(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    child = python_child(_CLIENT, [daemon.url, str(cnn)])
    try:
        session_id = wait_line(child, "ran ").split()[1]
        assert [e["session"] for e in events(daemon, "doorbell_opened")] == [session_id]
    finally:
        kill(child)
    assert wait_until(lambda: events(daemon, "doorbell_closed"))
    assert events(daemon, "doorbell_closed")[0]["reason"] == "closed by the client"
    with device(daemon) as dev, dev.load(cnn) as session:
        assert session.run([cnn_input()])[0].shape == (1, 10)
    assert daemon.process.poll() is None


def hung_up(sockets: list[socket.socket], expected: int, timeout: float = 30.0) -> set[socket.socket]:
    """The sockets the daemon hung up on, once `expected` of them are (or the timeout passed)."""
    gone: set[socket.socket] = set()
    deadline = time.monotonic() + timeout
    while len(gone) < expected and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in sockets if s not in gone], [], [], 0.1)
        gone.update(s for s in readable if s.recv(16) == b"")
    return gone


def test_strangers_on_the_socket_neither_hurt_the_daemon_nor_keep_the_owner_out(
    daemons: StartDaemon, cnn: Path
) -> None:
    daemon = daemons()
    with device(daemon) as dev, dev.load(cnn) as session:
        want = session.run([FRAMES[0]])[0].tobytes()
        address = open_raw(dev, session).address  # (its ticket hangs up the session's doorbell)
        silent = []
        for _ in range(8):  # twice what one user may have waiting: the rest are hung up at once
            bell = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            bell.connect("\0" + address)
            silent.append(bell)
        try:
            assert len(hung_up(silent, 4)) == 4
            # The owner still gets its frames, as RunShared calls while no doorbell can be had.
            assert [session.run([FRAMES[0]])[0].tobytes() for _ in range(3)] == [want] * 3
            assert rpcs(daemon, "RunShared") >= 2
        finally:
            for bell in silent:
                bell.close()

        def refused(first: bytes) -> bool:
            try:
                answer = knock(address, first)
            except OSError:  # still crowded: the daemon has not seen the silent ones go yet
                return False
            return answer is not None and answer.code == 5  # NOT_FOUND

        assert wait_until(lambda: refused(b"\xff" * 5000))  # longer than a message: cut, not a ticket
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as raw:
            reply = open_raw(dev, session)
            raw.connect("\0" + reply.address)
            raw.send(reply.ticket)
            assert rknn_pb2.DoorbellReply.FromString(raw.recv(1 << 16)).code == 0
            raw.send(b"\x0a\xff")  # not a DoorbellRing
            answer = rknn_pb2.DoorbellReply.FromString(raw.recv(1 << 16))
            assert answer.code == 3 and "DoorbellRing" in answer.message  # INVALID_ARGUMENT
            assert raw.recv(16) == b""  # and hung up
        assert session.run([FRAMES[0]])[0].tobytes() == want
    assert daemon.process.poll() is None


def test_closing_the_device_ends_a_loop_of_frames_on_its_doorbell(daemons: StartDaemon, cnn: Path) -> None:
    """Closing a Device cancels what runs on it (the farm's Ctrl-C relies on it): a doorbell is no
    gRPC call, so the client hangs it up itself."""
    daemon = daemons()
    dev = device(daemon)
    session = dev.load(cnn)
    ran, ended = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def frames() -> None:
        try:
            while True:
                session.run([cnn_input()])
                ran.set()
        except Exception as exc:  # the closed device's error, whatever its type
            errors.append(exc)
        finally:
            ended.set()

    worker = threading.Thread(target=frames, daemon=True)
    worker.start()
    assert ran.wait(30) and wait_until(lambda: rpcs(daemon, "OpenDoorbell") == 1)
    dev.close()
    assert ended.wait(30), "frames went on after the device was closed"
    assert errors


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(message=st.binary(min_size=1, max_size=6000))
def test_any_message_on_an_open_doorbell_is_a_ring_or_refused(
    doorbell_daemon: DaemonProcess, cnn: Path, message: bytes
) -> None:
    with device(doorbell_daemon) as dev, dev.load(cnn) as session:
        session.run([cnn_input()])
        reply = open_raw(dev, session)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as raw:
            raw.settimeout(60)
            raw.connect("\0" + reply.address)
            raw.send(reply.ticket)
            assert rknn_pb2.DoorbellReply.FromString(raw.recv(1 << 16)).code == 0
            raw.send(message)
            answer = rknn_pb2.DoorbellReply.FromString(raw.recv(1 << 16))
            assert answer.code in (0, 3), answer  # ran (it parsed as a ring), or INVALID_ARGUMENT
            if answer.code == 3:
                assert raw.recv(16) == b""
        assert session.run([cnn_input()])[0].shape == (1, 10)
    assert doorbell_daemon.process.poll() is None
