"""The adb section of `make bench`: the same daemon reached through an adb forward vs directly over TCP.

The board is the test emulator (tests/adb) in its own process, attached to a private adb server (the
real adb binary), so the figures are the cost of the adb path itself: adb server + adbd relaying every
byte. Reported as ratios of figures taken side by side in one run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from demo.models import save_mobilenet_v2
from rknn_client import connect
from rknn_client.device import Device
from rknn_client.transport.adb import open_adb
from rknn_proto.ready import tcp_address
from rknn_server.testing import start_daemon
from tests.adb.fixtures import PrivateAdbServer, find_adb
from tests.adb.host_board import ADB_ENV_KEYS
from tests.models import big_identity

LATENCY_RUNS = 100
ROUND_TRIPS = 5
TENSOR_BYTES = 64 << 20


def _median_ms(samples: list[float]) -> float:
    return float(np.median(samples)) * 1e3


@contextlib.contextmanager
def _emulated_board(server: PrivateAdbServer, root: Path) -> Iterator[str]:
    """The emulator as a subprocess (not sharing this process's GIL), attached; yields its serial."""
    root.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tests.adb.emulator", "--port", "0", "--root", str(root)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        serial = tcp_address(process.stdout.readline()) or ""
        server.adb("connect", serial)
        server.wait_for_state(serial, {"device"})
        yield serial
    finally:
        process.kill()
        process.wait()


@contextlib.contextmanager
def _adb_environment(server: PrivateAdbServer) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in (*ADB_ENV_KEYS, "ADBUTILS_ADB_PATH")}
    os.environ.update({key: server.env[key] for key in ADB_ENV_KEYS} | {"ADBUTILS_ADB_PATH": server.binary})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _timed_runs(pairs: list[tuple[str, Any]], x: np.ndarray, runs: int) -> dict[str, list[float]]:
    """Interleave the paths, so both see the same machine noise."""
    times: dict[str, list[float]] = {name: [] for name, _ in pairs}
    for _ in range(runs):
        for name, session in pairs:
            start = time.perf_counter()
            session.run([x])
            times[name].append(time.perf_counter() - start)
    return times


def _compare(adb: Device, tcp: Device, model: Path, x: np.ndarray, runs: int) -> dict[str, float]:
    with adb.load(model) as via_adb, tcp.load(model) as via_tcp:
        _timed_runs([("adb", via_adb), ("tcp", via_tcp)], x, 2)  # warm-up
        times = _timed_runs([("adb", via_adb), ("tcp", via_tcp)], x, runs)
    return {"adb_ms": _median_ms(times["adb"]), "tcp_ms": _median_ms(times["tcp"])}


def measure_adb(results: dict[str, Any], work: Path | None = None) -> None:
    """Add `results["adb_forward"]`: inference latency p50 and a 64 MiB round trip, adb vs direct TCP."""
    binary = find_adb()
    if binary is None:
        results["adb_forward"] = {"skipped": "no adb binary (pip install adbutils or apt-get install adb)"}
        return
    with contextlib.ExitStack() as stack:
        work = work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rknn-adb-")))
        server = PrivateAdbServer(binary, work / "adb-home")
        server.start()
        stack.callback(server.stop)
        socket_name = f"rknn-bench-{uuid.uuid4().hex[:12]}"
        daemon = start_daemon(
            work / "cache",
            work / "daemon.log",
            ["--runtime", "host", "--listen", f"unix-abstract:{socket_name}"],
        )
        stack.callback(daemon.stop)
        serial = stack.enter_context(_emulated_board(server, work / "board"))
        stack.enter_context(_adb_environment(server))
        adb = stack.enter_context(Device(open_adb(serial, socket_name=socket_name)))
        tcp = stack.enter_context(connect(daemon.url))
        image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        latency = _compare(adb, tcp, save_mobilenet_v2(work / "mobilenet_v2.onnx"), image, LATENCY_RUNS)
        elements = TENSOR_BYTES // 4
        tensor = np.random.default_rng(1).standard_normal((1, elements)).astype(np.float32)
        trip = _compare(adb, tcp, big_identity(work / "identity_64mib.onnx", elements), tensor, ROUND_TRIPS)
    results["adb_forward"] = {
        "board": "tests/adb emulator in its own process, real adb server, adb connect over loopback",
        "latency_model": "MobileNetV2 1x3x224x224 float32",
        "adb_latency_p50_ms": latency["adb_ms"],
        "tcp_latency_p50_ms": latency["tcp_ms"],
        "adb_over_tcp_latency_p50": latency["adb_ms"] / latency["tcp_ms"],
        "bytes_each_way": TENSOR_BYTES,
        "adb_round_trip_64mib_ms": trip["adb_ms"],
        "tcp_round_trip_64mib_ms": trip["tcp_ms"],
        "adb_throughput_vs_tcp": trip["tcp_ms"] / trip["adb_ms"],
    }
