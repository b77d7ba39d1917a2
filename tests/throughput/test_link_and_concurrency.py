"""The link simulator's schedule and data integrity, and many clients at once on one daemon."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench.link_sim import LinkClock, LinkModel, start_link
from rknn_client import connect
from rknn_server.runtime.host import concurrent_runs, default_threads


def test_link_clock_serialises_slices_and_adds_latency():
    clock = LinkClock(LinkModel(bytes_per_s=1000.0, latency_s=0.5))
    assert clock.arrival(0.0, 100) == pytest.approx(0.6)  # 0.1 s on the wire + 0.5 s latency
    assert clock.arrival(0.0, 100) == pytest.approx(0.7)  # waits for the first slice to leave
    assert clock.arrival(5.0, 1000) == pytest.approx(6.5)  # an idle link starts at once


@pytest.fixture
def link(host_daemon):
    process = start_link(host_daemon.address, LinkModel(bytes_per_s=200e6, latency_s=0.0005))
    yield process
    process.stop()


def test_link_carries_bytes_both_ways_intact(link, camera_model, images, host_daemon):
    with connect(host_daemon.url) as device, device.load(camera_model) as session:
        want = [session.run([x]) for x in images[:4]]
    with connect(link.url) as device, device.load(camera_model) as session:
        got = list(session.map([x] for x in images[:4]))
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g[0], w[0])


def test_link_propagates_half_close():
    listener = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def serve() -> None:
        conn, _ = listener.accept()
        while data := conn.recv(1 << 16):
            received.extend(data)
        conn.sendall(b"bye")
        conn.close()

    server = threading.Thread(target=serve)
    server.start()
    link = start_link(f"127.0.0.1:{listener.getsockname()[1]}", LinkModel(100e6, 0.0))
    try:
        host, port = link.address.split(":")
        with socket.create_connection((host, int(port))) as conn:
            payload = bytes(range(256)) * 4096
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)
            assert conn.recv(3, socket.MSG_WAITALL) == b"bye"
        server.join()
        assert bytes(received) == payload
    finally:
        link.stop()
        listener.close()


def test_eight_clients_at_once_each_get_their_own_results(host_daemon, camera_model, images):
    with connect(host_daemon.url) as device, device.load(camera_model) as session:
        want = [session.run([x])[0] for x in images[:8]]

    def client(index: int) -> bool:
        with connect(host_daemon.url) as device, device.load(camera_model) as session:
            return all(np.array_equal(session.run([images[index]])[0], want[index]) for _ in range(5))

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(client, range(8)))


def test_sessions_share_the_cores_without_oversubscribing():
    cores = default_threads()
    assert concurrent_runs(cores) == 1
    assert concurrent_runs(1) == cores
    assert concurrent_runs(cores * 4) == 1
