"""Metrics of calls in flight and of lost workers, read from a daemon whose runtime call stalls on demand."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.metrics_core import Metric

from rknn_client import connect
from rknn_client.errors import RknnError
from tests import models
from tests.metrics.conftest import get, samples, scrape
from tests.reliability.stall_backend import STALL_VALUE, use_stall_backend

CALL_TIMEOUT_S = 3


@pytest.fixture(autouse=True)
def _stall_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The daemon and its workers import the stalling test backend from this tree."""
    monkeypatch.delenv("RKNN_SERVER_TOKEN", raising=False)
    return use_stall_backend(monkeypatch, tmp_path)


def _wait_for(path: Path, patience_s: float = 90.0) -> None:
    deadline = time.monotonic() + patience_s
    while not path.exists():
        assert time.monotonic() < deadline, f"gave up waiting for {path.name}"
        time.sleep(0.05)


def _scrape_until(
    url: str, done: Callable[[dict[str, Metric]], bool], patience_s: float = 30.0
) -> dict[str, Metric]:
    deadline = time.monotonic() + patience_s
    while True:
        found = scrape(url)
        if done(found):
            return found
        assert time.monotonic() < deadline, "gave up waiting for the metrics to settle"
        time.sleep(0.05)


def test_a_stalled_call_is_in_flight_then_its_killed_worker_is_counted(
    metrics_daemon_factory, tmp_path: Path, _stall_backend: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RKNN_SHM", "off")  # a call: a frame rung on a doorbell is none
    daemon = metrics_daemon_factory(
        "--isolation",
        "process",
        "--call-timeout",
        str(CALL_TIMEOUT_S),
        "--backend",
        "tests.reliability.stall_backend:factory",
    )
    model = models.small_cnn(tmp_path / "cnn.onnx")
    with connect(daemon.daemon.url) as device:
        session = device.load(model)
        failures: list[BaseException] = []

        def stalled_run() -> None:
            try:
                session.run([np.full((1, 3, 16, 16), STALL_VALUE, np.float32)])
            except RknnError as exc:
                failures.append(exc)

        call = threading.Thread(target=stalled_run)
        call.start()
        _wait_for(_stall_backend / "started")
        during = scrape(daemon.metrics_url)
        call.join(90)
        # The client has its answer a moment before the daemon's handler has quite returned.
        after = _scrape_until(daemon.metrics_url, lambda found: not samples(found["rknn_inflight_calls"]))

    # A local caller without credentials is its uid (server/board/peers.py).
    assert samples(during["rknn_inflight_calls"]) == {(("client", f"uid:{os.getuid()}"),): 1}
    assert samples(during["rknn_worker_lost"], "rknn_worker_lost_total") == {}
    assert failures and f"did not answer run within {CALL_TIMEOUT_S}" in str(failures[0])
    assert samples(after["rknn_worker_lost"], "rknn_worker_lost_total") == {(("reason", "timeout"),): 1}


def test_readiness_turns_503_while_a_stopping_daemon_finishes_its_calls(
    metrics_daemon_factory, tmp_path: Path, _stall_backend: Path
) -> None:
    daemon = metrics_daemon_factory("--grace", "60", "--backend", "tests.reliability.stall_backend:factory")
    ready, live = f"{daemon.base}/v2/health/ready", f"{daemon.base}/v2/health/live"
    assert get(ready)[0] == 200 and get(live)[0] == 200
    model = models.small_cnn(tmp_path / "cnn.onnx")
    with connect(daemon.daemon.url) as device:
        session = device.load(model)
        call = threading.Thread(
            target=lambda: session.run([np.full((1, 3, 16, 16), STALL_VALUE, np.float32)]), daemon=True
        )
        call.start()
        _wait_for(_stall_backend / "started")
        daemon.daemon.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 90
        while "daemon_stopping" not in daemon.daemon.log_text():
            assert time.monotonic() < deadline, "the daemon did not start stopping"
            time.sleep(0.05)
        assert get(ready)[0] == 503
        assert get(live)[0] == 200
        (_stall_backend / "release").touch()
        call.join(90)
    assert daemon.daemon.process.wait(90) == 0
