"""The shared-memory rows of `make bench`: frames through /dev/shm against ONNX Runtime in-process.

- MobileNetV2: remote p50 with shared memory over in-process p50 (target <= 1.05);
- a 64 MiB identity round trip with shared memory against the in-process identity (target >= 0.9).

Interleaved with the in-process runs, so both see the same machine noise. The other rows of
bench/run.py measure the wire: they run with RKNN_SHM=off, this one with it on.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from demo.daemon_process import DaemonProcess
from demo.models import save_mobilenet_v2
from rknn_client import connect, shared_memory
from rknn_server.runtime.host import default_threads, session_options
from tests.models import big_identity

LATENCY_RUNS = 200
ROUND_TRIPS = 5
TENSOR_BYTES = 64 << 20


def _side_by_side(
    local: Callable[[], object], remote: Callable[[], object], runs: int, warm: int
) -> tuple[float, float]:
    for _ in range(warm):
        local()
        remote()
    local_s, remote_s = [], []
    for _ in range(runs):
        t = time.perf_counter()
        local()
        local_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        remote()
        remote_s.append(time.perf_counter() - t)
    return statistics.median(local_s), statistics.median(remote_s)


def _measure(daemon: DaemonProcess, model: Path, x: np.ndarray, runs: int, warm: int) -> tuple[float, float]:
    threads = default_threads()
    local = ort.InferenceSession(str(model), session_options(threads), providers=["CPUExecutionProvider"])
    name = local.get_inputs()[0].name
    previous = os.environ.get(shared_memory.ENV)
    os.environ[shared_memory.ENV] = "on"
    try:
        with connect(daemon.url) as device, device.load(model) as session:
            if not shared_memory.usable(device):
                raise RuntimeError("the daemon does not allow shared memory to this client")
            return _side_by_side(lambda: local.run(None, {name: x}), lambda: session.run([x]), runs, warm)
    finally:
        if previous is None:
            os.environ.pop(shared_memory.ENV, None)
        else:
            os.environ[shared_memory.ENV] = previous


def bench_shared_memory(daemon: DaemonProcess, work: Path) -> dict[str, Any]:
    mobilenet = save_mobilenet_v2(work / "mobilenet_v2_shm.onnx")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    local_p50, shm_p50 = _measure(daemon, mobilenet, x, LATENCY_RUNS, 20)
    elements = TENSOR_BYTES // 4
    identity = big_identity(work / "identity_64mib_shm.onnx", elements)
    big = np.random.default_rng(1).standard_normal((1, elements)).astype(np.float32)
    local_rt, shm_rt = _measure(daemon, identity, big, ROUND_TRIPS, 1)
    return {
        "mobilenet_v2_in_process_p50_ms": local_p50 * 1e3,
        "mobilenet_v2_shm_p50_ms": shm_p50 * 1e3,
        "shm_over_in_process_p50": shm_p50 / local_p50,
        "identity_64mib_in_process_ms": local_rt * 1e3,
        "identity_64mib_shm_round_trip_ms": shm_rt * 1e3,
        "shm_round_trip_vs_in_process": local_rt / shm_rt,
        "target": "p50 ratio <= 1.05; round trip >= 0.9",
    }
