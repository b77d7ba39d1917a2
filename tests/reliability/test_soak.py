"""Soak: N clients x M inferences against one daemon, some clients vanishing without releasing their
sessions. Afterwards: no unexpected errors, no leaked session, daemon RSS back within 10% of warm-up."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from rknn_client.device import Device
from rknn_client.transport.tcp import tcp_endpoint
from rknn_server.testing import DaemonProcess
from tests.reliability.conftest import StartDaemon, cnn_input, info

CLIENTS = int(os.environ.get("RKNN_SOAK_CLIENTS", "6"))
INFERENCES = int(os.environ.get("RKNN_SOAK_INFERENCES", "150"))
IDLE_S = 2.0
PATIENCE_S = 90.0


def _client(daemon: DaemonProcess, model: Path, seed: int, errors: list[str], counts: dict[str, int]) -> None:
    rng = random.Random(seed)
    dev = Device(tcp_endpoint(daemon.url))
    try:
        session = dev.load(model)
        for _ in range(INFERENCES):
            value = rng.random()
            out = session.run([cnn_input(value)])[0]
            if out.shape != (1, 10) or not np.isfinite(out).all():
                errors.append(f"bad output {out!r}")
            counts["inferences"] += 1
            if rng.random() < 0.03:  # vanish: drop the connection, leave the session to the reaper
                dev.close()
                counts["disconnects"] += 1
                dev = Device(tcp_endpoint(daemon.url))
                session = dev.load(model)
        session.release()
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        dev.close()


def _round(daemon: DaemonProcess, model: Path, seed: int) -> tuple[list[str], dict[str, int]]:
    errors: list[str] = []
    counts = {"inferences": 0, "disconnects": 0}
    threads = [
        threading.Thread(target=_client, args=(daemon, model, seed * 100 + i, errors, counts))
        for i in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE_S * 4)
    return errors, counts


def _settle(daemon: DaemonProcess) -> float:
    start = time.monotonic()
    while info(daemon).open_sessions:
        assert time.monotonic() - start < PATIENCE_S, "sessions were not freed"
        time.sleep(0.1)
    return time.monotonic() - start


def test_soak_many_clients_with_random_disconnects(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons("--session-idle-timeout", str(IDLE_S), "--max-sessions", "64")
    process = psutil.Process(daemon.pid)
    warm_errors, _ = _round(daemon, cnn, seed=0)
    assert not warm_errors
    _settle(daemon)
    rss_warm = process.memory_info().rss
    start = time.monotonic()
    errors, counts = _round(daemon, cnn, seed=1)
    duration = time.monotonic() - start
    settle_s = _settle(daemon)
    rss_end = process.memory_info().rss
    print(
        f"\n[soak] {CLIENTS} clients x {INFERENCES} inferences: {counts['inferences']} inferences in {duration:.1f}s, "
        f"{counts['disconnects']} abandoned sessions freed {settle_s:.1f}s after the last call; "
        f"errors {len(errors)}; open sessions 0; RSS warm {rss_warm / 2**20:.1f} MiB, end {rss_end / 2**20:.1f} MiB "
        f"({(rss_end / rss_warm - 1) * 100:+.1f}%)"
    )
    assert not errors, errors[:5]
    assert counts["inferences"] == CLIENTS * INFERENCES
    assert rss_end <= rss_warm * 1.10
