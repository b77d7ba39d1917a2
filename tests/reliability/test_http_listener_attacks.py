"""The HTTP listener against a live daemon under the attack of security finding 5: another user's
idle, tokenless connections must not take the slots of everyone else."""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path

from tests.deadlines import assert_waited
from tests.metrics.conftest import MetricsDaemon, samples, scrape, start_metrics_daemon
from tests.reliability.hoarder import hoarding

IDLE_PEERS = 24  # more than the 16 slots the whole listener had before


def succeeded(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def success_rate(daemon: MetricsDaemon, seconds: float) -> tuple[int, int]:
    """(succeeded, sent) of /metrics and /v2/health/live requests sent for `seconds`."""
    ok = sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for route in ("/metrics", "/v2/health/live"):
            ok += succeeded(daemon.base + route)
            sent += 1
    return ok, sent


def test_idle_tokenless_peers_do_not_shut_out_another_peer(tmp_path: Path) -> None:
    daemon = start_metrics_daemon(tmp_path)
    try:
        address = daemon.base.removeprefix("http://")
        with hoarding("tcp", address, IDLE_PEERS, replace=True) as hoarder:
            assert hoarder.settle(8) == 8  # --max-http-connections-per-client; the rest refused at once
            ok, sent = success_rate(daemon, 2.0)
        assert ok == sent, f"{ok} of {sent} requests of another peer succeeded"
        print(f"/metrics and /v2/health/live under {IDLE_PEERS} idle peers: {ok}/{sent} succeeded")
    finally:
        daemon.daemon.stop()


def test_a_silent_peer_is_answered_408_at_the_head_deadline(tmp_path: Path) -> None:
    daemon = start_metrics_daemon(tmp_path, "--http-head-timeout", "1")
    try:
        host, _, port = daemon.base.removeprefix("http://").rpartition(":")
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the end of the head
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 ") and b"--http-head-timeout" in answer
        assert_waited(started, 1.0, 20)
    finally:
        daemon.daemon.stop()


def test_a_tokenless_local_caller_is_its_uid_as_on_grpc(tmp_path: Path) -> None:
    daemon = start_metrics_daemon(tmp_path, "--max-http-connections-per-client", "2")
    try:
        host, _, port = daemon.base.removeprefix("http://").rpartition(":")
        with socket.create_connection((host, int(port))), socket.create_connection((host, int(port))):
            # The two held count in before a byte is read: the third is refused, naming who holds them.
            deadline = time.monotonic() + 30
            while (answer := refusal(host, int(port))) is None and time.monotonic() < deadline:
                time.sleep(0.1)
        assert answer is not None
        assert f"uid:{os.getuid()} already holds 2 http connections".encode() in answer, answer
        assert b"--max-http-connections-per-client" in answer
    finally:
        daemon.daemon.stop()


def test_idle_kept_alive_connections_hold_their_slots_until_the_idle_deadline(tmp_path: Path) -> None:
    daemon = start_metrics_daemon(
        tmp_path, "--max-http-connections-per-client", "2", "--http-head-timeout", "3"
    )
    try:
        host, _, port = daemon.base.removeprefix("http://").rpartition(":")
        kept = [socket.create_connection((host, int(port)), timeout=30) for _ in range(2)]
        for sock in kept:  # each answered once, then left idle on keep-alive
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while not reply.endswith(b"\r\n\r\n") and (data := sock.recv(65536)):  # the head, in pieces
                reply += data
            assert reply.startswith(b"HTTP/1.1 200 ")
        answer = refusal(host, int(port))
        assert answer is not None and b"already holds 2 http connections" in answer, answer
        # At the deadline each is closed with nothing sent (no request began), and its slot is free.
        for sock in kept:
            assert sock.recv(65536) == b""
            sock.close()
        assert succeeded(daemon.metrics_url)
        idle = samples(scrape(daemon.metrics_url)["rknn_door_idle_closed"], "rknn_door_idle_closed_total")
        assert idle[(("door", "http"),)] == 2
    finally:
        daemon.daemon.stop()


def refusal(host: str, port: int) -> bytes | None:
    """The answer to a connection that sends nothing, if it comes at once (a refusal), else None."""
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.settimeout(0.5)
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            return None
        if not answer.startswith(b"HTTP/1.1 429 "):
            return None
        sock.settimeout(10)  # the refusal closes the connection: read its body to the end (it may come apart)
        while chunk := sock.recv(65536):
            answer += chunk
    return answer
