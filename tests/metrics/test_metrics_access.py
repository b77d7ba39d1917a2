"""Who may read /metrics: the gRPC listeners' rules over HTTP, a strict request parser, and the start-up
refusal of an open non-loopback metrics port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rknn_client import connect
from rknn_client.errors import AuthenticationFailed
from rknn_server.config.limits import Limits
from rknn_server.config.listen import parse_metrics_listen
from rknn_server.protocols.http.endpoint import check_exposure
from tests.deadlines import assert_waited
from tests.metrics.conftest import MetricsDaemon, get, samples, scrape

TOKEN = "metrics-token-0123456789abcdef"


def token_file(folder: Path) -> Path:
    path = folder / "tokens"
    path.write_text(f"prometheus:{TOKEN}\n")
    path.chmod(0o600)
    return path


def raw_request(daemon: MetricsDaemon, data: bytes, end: bool = True) -> bytes:
    """Send bytes to the HTTP listener (then end the request stream, if `end`) and read its whole answer."""
    host, _, port = daemon.base.removeprefix("http://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        if end:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_tokened_metrics_port_needs_the_token(
    metrics_daemon_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RKNN_SERVER_TOKEN", raising=False)
    daemon = metrics_daemon_factory("--auth-token-file", str(token_file(tmp_path)))
    status, body = get(daemon.metrics_url)
    assert status == 401 and b"Bearer" in body and b"rknn_" not in body
    assert get(daemon.metrics_url, token="not-the-token-0123456789")[0] == 401
    assert "rknn_rpc" in scrape(daemon.metrics_url, token=TOKEN)
    # gRPC calls refused at the gate are counted apart from the calls served.
    for token in (None, "not-the-token-0123456789"):
        with connect(daemon.daemon.url, token=token) as device, pytest.raises(AuthenticationFailed):
            device.info(refresh=True)
    with connect(daemon.daemon.url, token=TOKEN) as device:
        device.info(refresh=True)
    found = scrape(daemon.metrics_url, token=TOKEN)
    assert samples(found["rknn_rpc_refused"], "rknn_rpc_refused_total") == {
        (("outcome", "UNAUTHENTICATED"),): 2
    }
    assert samples(found["rknn_rpc"], "rknn_rpc_total") == {(("method", "GetInfo"), ("outcome", "OK")): 1}
    # Health needs no token: load balancers and probes ask it.
    assert get(f"{daemon.base}/v2/health/live")[0] == 200
    assert get(f"{daemon.base}/v2/health/ready")[0] == 200


def test_a_strict_http_parser_keeps_serving(metrics_daemon_factory) -> None:
    daemon = metrics_daemon_factory()
    assert raw_request(daemon, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert raw_request(daemon, b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert raw_request(daemon, b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")  # no Host
    assert raw_request(daemon, b"GET /metrics\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_request(daemon, b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n").startswith(
        b"HTTP/1.1 431 "
    )
    many = b"".join(b"X-%d: y\r\n" % i for i in range(100))
    assert raw_request(daemon, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n").startswith(
        b"HTTP/1.1 431 "
    )
    assert raw_request(daemon, b"GET /metrics HTTP/1.1\r\nHost").startswith(b"HTTP/1.1 400 ")
    assert raw_request(daemon, b"\xff\xfe /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert "rknn_rpc" in scrape(daemon.metrics_url)
    assert daemon.daemon.process.poll() is None


def serve_briefly(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rknn_server", "--runtime", "host", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_open_non_loopback_metrics_port_is_refused_at_start(tmp_path: Path) -> None:
    result = serve_briefly("--model-cache", str(tmp_path / "cache"), "--metrics-listen", "tcp://0.0.0.0:0")
    assert result.returncode == 2
    assert "refusing to serve metrics on tcp://0.0.0.0:0 without a token" in result.stderr
    assert "--insecure" in result.stderr


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("unix-abstract:metrics", "expected tcp://HOST:PORT"),
        ("http://127.0.0.1:9000", "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1", "expected a port"),
    ],
)
def test_metrics_listen_takes_only_a_tcp_address(address: str, expected: str) -> None:
    result = serve_briefly("--metrics-listen", address)
    assert result.returncode == 2
    assert "argument --metrics-listen" in result.stderr and expected in result.stderr


def test_a_non_loopback_metrics_port_opens_with_a_token_or_insecure() -> None:
    exposed = parse_metrics_listen("tcp://0.0.0.0:9464")
    assert check_exposure(exposed, has_tokens=True, insecure=False) == []
    [warning] = check_exposure(exposed, has_tokens=False, insecure=True)
    assert "tcp://0.0.0.0:9464" in warning and "--insecure" in warning
    assert (
        check_exposure(parse_metrics_listen("tcp://127.0.0.1:9464"), has_tokens=False, insecure=False) == []
    )


def test_a_silent_client_is_dropped_at_the_head_deadline(metrics_daemon_factory) -> None:
    daemon = metrics_daemon_factory()
    started = time.monotonic()
    answer = raw_request(daemon, b"GET /metrics HTTP/1.1\r\n", end=False)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"--http-head-timeout" in answer
    deadline = Limits.http_head_timeout_s
    assert_waited(started, deadline, deadline + 20)
    assert "rknn_rpc" in scrape(daemon.metrics_url)
