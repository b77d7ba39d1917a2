"""The shared-memory rows of `make bench`: frames through /dev/shm against ONNX Runtime in-process.

- MobileNetV2: remote p50 with shared memory over in-process p50 (target <= 1.05), frames rung on a
  doorbell (the default), the input copied into the region by run() or already in it (written into
  the session's input buffers), and, for comparison, each frame sent as a RunShared call;
- a 64 MiB identity round trip with shared memory against the in-process identity (target >= 0.9),
  with the outputs copied out of the region (the default) and lent as views of it (lend_outputs);
- the per-frame floors, as the p50 ratio each alone would give: ONNX Runtime in another process woken
  by one unix-socket message (bench/ring_floor.py: a doorbell's), and a no-op unary call or stream
  message of a frame's size (bench/grpc_ceiling.py: a RunShared call's).

Interleaved with the in-process runs, so both see the same machine noise. The other rows of
bench/run.py measure the wire: they run with RKNN_SHM=off, this one with it on.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench import ring_floor
from bench.grpc_ceiling import measure_frame_calls
from bench.side_by_side import side_by_side
from demo.models import save_mobilenet_v2
from rknn_client import connect
from rknn_client.local import shared_memory
from rknn_server.runtime.host import default_threads
from rknn_server.runtime.host_model import session_options
from rknn_server.testing import DaemonProcess, start_daemon
from tests.models import big_identity

LATENCY_RUNS = 200
ROUND_TRIPS = 9  # the 64 MiB rows vary most on a busy machine: a median of more
TENSOR_BYTES = 64 << 20


def _measure(
    daemon: DaemonProcess,
    model: Path,
    x: np.ndarray,
    runs: int,
    warm: int,
    lend: bool = False,
    doorbell: bool = True,
    in_place: bool = False,
) -> tuple[float, float]:
    """In-process and shared-memory p50, side by side; `lend`: outputs lent, not copied out;
    `doorbell=False`: each frame a RunShared call; `in_place`: the input given in the session's input
    buffers (shared_memory.input_buffers: written there once, as a camera would decode into them)."""
    threads = default_threads()
    local = ort.InferenceSession(str(model), session_options(threads), providers=["CPUExecutionProvider"])
    name = local.get_inputs()[0].name
    with shared_memory_on(), connect(daemon.url) as device, device.load(model) as session:
        if not shared_memory.usable(device):
            raise RuntimeError("the daemon does not allow shared memory to this client")
        shared_memory.lend_outputs(session, lend)
        shared_memory.use_doorbell(device, doorbell)
        feed = shared_memory.input_buffers(session) if in_place else [x.copy()]
        feed[0][...] = x
        return side_by_side(lambda: local.run(None, {name: x}), lambda: session.run(feed), runs, warm)


@contextlib.contextmanager
def shared_memory_on() -> Iterator[None]:
    """RKNN_SHM=on for the Devices made inside (bench.run turns it off for the wire's rows)."""
    previous = os.environ.get(shared_memory.ENV)
    os.environ[shared_memory.ENV] = "on"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(shared_memory.ENV, None)
        else:
            os.environ[shared_memory.ENV] = previous


def bench_shared_memory(daemon: DaemonProcess, work: Path) -> dict[str, Any]:
    mobilenet = save_mobilenet_v2(work / "mobilenet_v2_shm.onnx")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    local_p50, shm_p50 = _measure(daemon, mobilenet, x, LATENCY_RUNS, 20)
    placed_local_p50, placed_p50 = _measure(daemon, mobilenet, x, LATENCY_RUNS, 20, in_place=True)
    call_local_p50, call_p50 = _measure(daemon, mobilenet, x, LATENCY_RUNS, 20, doorbell=False)
    ring_local_p50, ring_p50 = ring_floor.measure(mobilenet, x, LATENCY_RUNS)
    floors = measure_frame_calls()
    unary, stream = (statistics.median(v) for v in floors.values())
    elements = TENSOR_BYTES // 4
    identity = big_identity(work / "identity_64mib_shm.onnx", elements)
    big = np.random.default_rng(1).standard_normal((1, elements)).astype(np.float32)
    local_rt, shm_rt = _measure(daemon, identity, big, ROUND_TRIPS, 1)
    lent_local_rt, lent_rt = _measure(daemon, identity, big, ROUND_TRIPS, 1, lend=True)
    return {
        "mobilenet_v2_in_process_p50_ms": local_p50 * 1e3,
        "mobilenet_v2_shm_p50_ms": shm_p50 * 1e3,
        "shm_over_in_process_p50": shm_p50 / local_p50,
        "mobilenet_v2_shm_input_buffers_p50_ms": placed_p50 * 1e3,
        "shm_input_buffers_over_in_process_p50": placed_p50 / placed_local_p50,
        "mobilenet_v2_shm_runshared_calls_p50_ms": call_p50 * 1e3,
        "shm_runshared_calls_over_in_process_p50": call_p50 / call_local_p50,
        "floor_over_in_process_p50_ring": ring_p50 / ring_local_p50,
        **floors,
        # The best any frame could do that costs one Python gRPC call or one stream message.
        "floor_over_in_process_p50_unary": (local_p50 * 1e3 + unary) / (local_p50 * 1e3),
        "floor_over_in_process_p50_stream": (local_p50 * 1e3 + stream) / (local_p50 * 1e3),
        "identity_64mib_in_process_ms": local_rt * 1e3,
        "identity_64mib_shm_round_trip_ms": shm_rt * 1e3,
        "shm_round_trip_vs_in_process": local_rt / shm_rt,
        "identity_64mib_shm_lent_round_trip_ms": lent_rt * 1e3,
        "shm_lent_round_trip_vs_in_process": lent_local_rt / lent_rt,
        "target": "p50 ratio <= 1.05; round trip >= 0.9",
    }


def main() -> int:
    """`python -m bench.shared_memory`: these rows alone, against a daemon of their own."""
    with tempfile.TemporaryDirectory(prefix="rknn-bench-shm-") as tmp:
        work = Path(tmp)
        daemon = start_daemon(work / "cache", work / "daemon.log", ["--runtime", "host"])
        try:
            print(json.dumps(bench_shared_memory(daemon, work), indent=2))
        finally:
            daemon.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
