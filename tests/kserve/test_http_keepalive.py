"""HTTP/1.1 on the daemon's HTTP listener: many requests on one connection (one after another and
pipelined, tritonclient's included), chunked request bodies and `Expect: 100-continue`, each held to
the limits of a body sent with a Content-Length."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest

from tests.kserve.conftest import V2Daemon, make_repository
from tests.metrics.conftest import MetricsDaemon, start_metrics_daemon

LIMIT = 1 << 20  # --max-message-bytes
INFER = b"POST /v2/models/two/infer HTTP/1.1\r\nHost: x\r\n"
PAIR = {"first": [1.0, 2.0, 3.0, 4.0], "second": [0.5, 0.5, 0.5, 0.5]}
BODY = json.dumps(
    {
        "inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": d} for n, d in PAIR.items()],
        "outputs": [{"name": "y"}],
    }
).encode()
Y = [2.5, 4.5, 6.5, 8.5]  # first * 2 + second


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    folder = tmp_path_factory.mktemp("keepalive")
    repository = str(make_repository(folder / "repository"))
    running = start_metrics_daemon(
        folder, "--model-repository", repository, "--max-message-bytes", str(LIMIT)
    )
    yield running
    assert running.daemon.stop() == 0


def address(daemon: MetricsDaemon) -> tuple[str, int]:
    host, _, port = daemon.base.removeprefix("http://").rpartition(":")
    return host, int(port)


def chunked(body: bytes, size: int) -> bytes:
    """`body` in chunks of `size` bytes, then the last (empty) chunk."""
    pieces = [body[start : start + size] for start in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def read_reply(stream: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One reply (status, lower-case headers, body) off a connection, by its Content-Length."""
    status = int(stream.readline().split()[1])
    headers = {}
    while line := stream.readline().rstrip(b"\r\n"):
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    return status, headers, stream.read(int(headers["content-length"]))


def y_of(reply: tuple[int, dict[str, str], bytes]) -> list[float]:
    status, _, body = reply
    assert status == 200, body
    return list(json.loads(body)["outputs"][0]["data"])


def test_one_connection_answers_requests_in_turn_and_pipelined(daemon: MetricsDaemon) -> None:
    with socket.create_connection(address(daemon), timeout=30) as sock, sock.makefile("rb") as stream:
        for _ in range(3):
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = read_reply(stream)
            assert status == 200 and "connection" not in headers
        length = b"Content-Length: %d\r\n\r\n" % len(BODY)
        sock.sendall(
            INFER + length + BODY
            + INFER + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(BODY, 7)
            + b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        )  # fmt: skip
        assert y_of(read_reply(stream)) == Y
        assert y_of(read_reply(stream)) == Y
        status, _, metrics = read_reply(stream)
        assert status == 200 and b'rknn_door_connections{door="http"} 1.0' in metrics
        # A client that asks to close is answered, then closed.
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, _ = read_reply(stream)
        assert status == 200 and headers["connection"] == "close"
        assert stream.read() == b""


def test_an_error_keeps_the_connection_when_the_request_was_read_whole(daemon: MetricsDaemon) -> None:
    with socket.create_connection(address(daemon), timeout=30) as sock, sock.makefile("rb") as stream:
        sock.sendall(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_reply(stream)
        assert status == 404 and "connection" not in headers
        sock.sendall(INFER + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
        assert y_of(read_reply(stream)) == Y
        # A body refused before it was read cannot leave the next request findable: closed.
        sock.sendall(INFER + b"Content-Length: %d\r\n\r\n" % (LIMIT + 1))
        status, headers, body = read_reply(stream)
        assert status == 413 and headers["connection"] == "close" and b"over the limit" in body
        assert stream.read() == b""


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(daemon: MetricsDaemon) -> None:
    piece = 1 << 16
    chunk = b"%x\r\n%s\r\n" % (piece, b"x" * piece)
    with socket.create_connection(address(daemon), timeout=30) as sock:
        sock.sendall(INFER + b"Transfer-Encoding: chunked\r\n\r\n")

        def send() -> None:  # four times the limit, never the last chunk: the body does not end
            with contextlib.suppress(OSError):
                for _ in range(4 * LIMIT // piece):
                    sock.sendall(chunk)
                sock.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                answer += data
        sender.join()
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"the chunked body passed the limit of %d bytes" % LIMIT in answer


def test_expect_100_continue(daemon: MetricsDaemon) -> None:
    with socket.create_connection(address(daemon), timeout=30) as sock, sock.makefile("rb") as stream:
        sock.sendall(INFER + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(BODY))
        assert stream.readline() == b"HTTP/1.1 100 Continue\r\n" and stream.readline() == b"\r\n"
        sock.sendall(BODY)
        assert y_of(read_reply(stream)) == Y
        # Over the limit: refused instead of asked for.
        sock.sendall(INFER + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (LIMIT + 1))
        assert read_reply(stream)[0] == 413


@contextlib.contextmanager
def counting_relay(target: tuple[str, int]) -> Iterator[tuple[str, list[socket.socket]]]:
    """A loopback TCP relay to `target`: its HOST:PORT and the connections it accepted so far."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    opened: list[socket.socket] = []
    stop = threading.Event()

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 16):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(target)
            accepted.append(client)
            opened.extend((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(source, sink), daemon=True).start()

    acceptor = threading.Thread(target=accept)
    acceptor.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        stop.set()
        acceptor.join()
        listener.close()
        for sock in opened:
            sock.close()


def test_tritonclient_runs_many_inferences_on_one_connection(
    daemon: MetricsDaemon, triton_python: Path, tmp_path: Path
) -> None:
    v2 = V2Daemon(daemon, triton_python, tmp_path)
    np.savez(tmp_path / "pair.npz", **{n: np.array([d], np.float32) for n, d in PAIR.items()})
    infer = {"model": "two", "inputs": str(tmp_path / "pair.npz"), "out": str(tmp_path / "out.npz")}
    steps = [{"op": "infer", "protocol": p, **infer} for p in ("http-binary", "http-json") * 10]
    with counting_relay(address(daemon)) as (relay, accepted):
        answers = v2.drive({"op": "live", "protocol": "http-binary"}, *steps, http=relay)
    assert all("ok" in a for a in answers), answers
    with np.load(tmp_path / "out.npz") as out:
        assert out["y"].tolist() == [Y]
    assert len(accepted) == 1, f"{len(steps) + 1} requests took {len(accepted)} connections"
