"""What our daemon costs before it serves anything: its start-to-ready time (spawned until it
listens, no model), the same with the bench models in a repository at a first start and at a restart
over its cache (whose models' facts the first start kept: host_facts), and the RSS each further
session of MobileNetV2 adds, from N callers each with its own connection and session (each run
once), against the model file's size."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.peers.models import BenchModel
from bench.peers.servers import DAEMON_ARGS, start_ours
from rknn_client import Device, Session, connect
from rknn_server.testing import start_daemon

STARTS = 3
CALLERS = 4
SETTLE_S = 0.5  # after the sessions open, before RSS is read


def start_to_ready(work: Path) -> dict[str, Any]:
    """Seconds from spawning `rknn_server` until its `listening on` line, over STARTS starts."""
    seconds = []
    for number in range(STARTS):
        started = time.perf_counter()
        daemon = start_daemon(work / f"start-{number}" / "cache", work / f"start-{number}.log", DAEMON_ARGS)
        seconds.append(time.perf_counter() - started)
        daemon.stop()
    return {
        "starts": STARTS,
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
    }


def restart_to_ready(work: Path, models: list[BenchModel]) -> dict[str, Any]:
    """Seconds from spawning `rknn_server` with `models` in a repository until each answers ready:
    first over an empty cache, then again over the cache the first start filled; STARTS pairs."""
    first, again = [], []
    for number in range(STARTS):
        for times in (first, again):
            running = start_ours(work / f"restart-{number}", models)
            times.append(running.start_s)
            running.stop()
    ratios = [a / f for a, f in zip(again, first, strict=True)]
    return {
        "starts": STARTS,
        "first_median_s": statistics.median(first),
        "restart_median_s": statistics.median(again),
        "restart_over_first": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
    }


def rss_per_session(work: Path, model: BenchModel) -> dict[str, Any]:
    daemon = start_daemon(work / "sessions" / "cache", work / "sessions.log", DAEMON_ARGS)
    process = psutil.Process(daemon.pid)
    x = np.random.default_rng(0).standard_normal(model.shape).astype(np.float32)
    opened: list[tuple[Device, Session]] = []

    def open_one(_: int) -> None:
        device = connect(daemon.url)
        session = device.load(model.file)
        session.run([x])
        opened.append((device, session))

    def rss_now() -> int:
        time.sleep(SETTLE_S)
        return int(process.memory_info().rss)

    try:
        idle = rss_now()
        open_one(0)
        one = rss_now()
        with ThreadPoolExecutor(CALLERS) as pool:
            list(pool.map(open_one, range(CALLERS)))
        more = rss_now()
    finally:
        for device, session in opened:
            session.release()
            device.close()
        daemon.stop()
    size = model.file.stat().st_size
    per_extra = (more - one) / CALLERS
    return {
        "model": model.label,
        "model_file_mib": size / 2**20,
        "rss_idle_mib": idle / 2**20,
        "rss_first_session_mib": (one - idle) / 2**20,
        "extra_callers": CALLERS,
        "rss_per_extra_session_mib": per_extra / 2**20,
        "rss_per_extra_session_over_model_file": per_extra / size,
    }
