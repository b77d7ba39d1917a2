"""Throughput benchmarks (issue 8): pipelining and quantized outputs over a simulated USB 2.0 link,
concurrent clients, and a peer (Apache TVM's RPC server) moving the same tensors.

Each function returns a dict of figures for bench-results/results.json; ratios compare figures
taken side by side in the same run. Thread settings of every measurement are stated in its dict.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench.link_sim import USB2, start_link
from rknn_client import connect
from rknn_server.runtime.host import concurrent_runs, default_threads
from rknn_server.runtime.host_model import session_options
from rknn_server.testing import DaemonProcess, start_daemon
from tests.models import big_identity
from tests.throughput.models import camera_cnn, detector, quantized, random_images

SIZE = 640
# Work per frame chosen so that, on a 2-core PC with one ONNX Runtime thread, compute takes about
# as long as the 1x3x640x640 uint8 input takes over the link (1.2 MB at 35 MB/s = 35 ms).
CAMERA_LAYERS = ((32, 2), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2))
LINK_FRAMES = 40
DETECTOR_FRAMES = 12
DEPTH = 4
CLIENT_FRAMES = 16
CLIENTS = 8
PEER_ROUNDS = 10


def _fps(frames: int, seconds: float) -> float:
    return frames / seconds


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _compute_ms(model: Path, x: np.ndarray, threads: int) -> float:
    local = ort.InferenceSession(str(model), session_options(threads), providers=["CPUExecutionProvider"])
    name = local.get_inputs()[0].name
    for _ in range(3):
        local.run(None, {name: x})
    return statistics.median(_timed(lambda: local.run(None, {name: x})) for _ in range(10)) * 1e3


def _daemon(work: Path, results: Path, name: str, threads: int) -> DaemonProcess:
    return start_daemon(
        work / f"{name}-cache",
        results / f"{name}-daemon.log",
        ["--runtime", "host", "--threads", str(threads)],
    )


def _threads_note(threads: int) -> str:
    return (
        f"daemon --threads {threads} (ONNX Runtime intra-op threads per session, no spinning); "
        f"{concurrent_runs(threads)} session(s) compute at once on {default_threads()} cores"
    )


def bench_pipelining(work: Path, results: Path) -> dict[str, Any]:
    """Toolkit-style synchronous loop vs Session.map over the simulated link, same daemon, same frames."""
    threads = 1
    model = camera_cnn(work / "camera_cnn.onnx", SIZE, CAMERA_LAYERS)
    images = random_images(LINK_FRAMES, SIZE)
    daemon = _daemon(work, results, "pipelining", threads)
    link = start_link(daemon.address, USB2)
    try:
        with connect(link.url) as device, device.load(model) as session:
            for x in images[:3]:
                session.run([x])
            sync_s = _timed(lambda: [session.run([x]) for x in images])
            pipe_s = _timed(lambda: list(session.map(([x] for x in images), depth=DEPTH)))
            sync_again_s = _timed(lambda: [session.run([x]) for x in images])
    finally:
        link.stop()
        daemon.stop()
    sync_s = min(sync_s, sync_again_s)
    return {
        "link": USB2.describe(),
        "model": f"camera CNN, input 1x3x{SIZE}x{SIZE} uint8, output 1x10 float32",
        "threads": _threads_note(threads),
        "input_bytes": images[0].nbytes,
        "input_transfer_ms": images[0].nbytes / USB2.bytes_per_s * 1e3,
        "host_compute_ms": _compute_ms(model, images[0], threads),
        "frames": LINK_FRAMES,
        "sync_loop_fps": _fps(LINK_FRAMES, sync_s),
        "pipelined_fps": _fps(LINK_FRAMES, pipe_s),
        "depth": DEPTH,
        "pipelined_over_sync": sync_s / pipe_s,
        "target": ">= 1.7",
    }


def bench_native_outputs(work: Path, results: Path) -> dict[str, Any]:
    """Detection-size quantized outputs as int8 vs float32 on the wire, over the simulated link."""
    threads = 1
    float_model = detector(work / "detector.onnx", SIZE)
    model = quantized(float_model, work / "detector_qdq.onnx", random_images(2, SIZE, seed=1))
    images = random_images(DETECTOR_FRAMES, SIZE, seed=2)
    daemon = _daemon(work, results, "native-outputs", threads)
    link = start_link(daemon.address, USB2)
    figures: dict[str, Any] = {}
    try:
        with connect(link.url) as device:
            for native in (True, False):
                with device.load(model, native_outputs=native) as session:
                    out_bytes = sum(int(np.prod(o.shape)) * (1 if native else 4) for o in session.outputs)
                    list(session.map([x] for x in images[:2]))
                    seconds = _timed(lambda s=session: list(s.map(([x] for x in images), depth=DEPTH)))
                    key = "int8" if native else "float32"
                    figures[f"{key}_output_bytes_per_frame"] = out_bytes
                    figures[f"{key}_fps"] = _fps(DETECTOR_FRAMES, seconds)
                    figures["output_shapes"] = [list(o.shape) for o in session.outputs]
    finally:
        link.stop()
        daemon.stop()
    return {
        "link": USB2.describe(),
        "model": f"int8 QDQ detector, input 1x3x{SIZE}x{SIZE} uint8, three 255-channel heads",
        "threads": _threads_note(threads),
        "host_compute_ms": _compute_ms(model, images[0], threads),
        "mode": f"Session.map depth {DEPTH}",
        **figures,
        "bytes_ratio_float32_over_int8": figures["float32_output_bytes_per_frame"]
        / figures["int8_output_bytes_per_frame"],
        "fps_ratio_int8_over_float32": figures["int8_fps"] / figures["float32_fps"],
        "target": "bytes 4x down, fps up accordingly",
    }


def _client(url: str, model: str, x: np.ndarray, frames: int, barrier: Any, out: Any) -> None:
    """One client process: load, warm up, wait for the others, run `frames` synchronous calls."""
    with connect(url) as device, device.load(model) as session:
        for _ in range(3):
            session.run([x])
        barrier.wait()
        for _ in range(frames):
            session.run([x])
        out.put(time.perf_counter())


def _clients_fps(url: str, model: Path, x: np.ndarray, clients: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(clients + 1)
    out = ctx.Queue()
    processes = [
        ctx.Process(target=_client, args=(url, str(model), x, CLIENT_FRAMES, barrier, out))
        for _ in range(clients)
    ]
    for p in processes:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    end = max(out.get(timeout=300) for _ in processes)
    for p in processes:
        p.join()
    return _fps(clients * CLIENT_FRAMES, end - start)


def bench_concurrency(work: Path, results: Path) -> dict[str, Any]:
    """One client vs eight at once (each its own process, synchronous calls), camera CNN on loopback.

    Every client process runs on the same 2 cores as the daemon, so only the time one client
    leaves a core idle (its own serialisation and transfers, the daemon's I/O) can be won back."""
    model = camera_cnn(work / "camera_cnn_clients.onnx", SIZE, CAMERA_LAYERS)
    x = random_images(1, SIZE, seed=4)[0]
    rows = []
    for threads in sorted({default_threads(), 1}):
        daemon = _daemon(work, results, f"clients-{threads}", threads)
        try:
            one = _clients_fps(daemon.url, model, x, 1)
            many = _clients_fps(daemon.url, model, x, CLIENTS)
        finally:
            daemon.stop()
        rows.append(
            {
                "threads": _threads_note(threads),
                "host_compute_ms": _compute_ms(model, x, threads),
                "one_client_fps": one,
                f"{CLIENTS}_clients_fps": many,
                f"{CLIENTS}_clients_over_one": many / one,
            }
        )
    return {
        "model": f"camera CNN, input 1x3x{SIZE}x{SIZE} uint8, output 1x10 float32, loopback TCP",
        "frames_per_client": CLIENT_FRAMES,
        "settings": rows,
        "target": f">= 1.6 ({CLIENTS} clients over one, with --threads 1: the setting for many clients)",
    }


def _tvm_round_trips(x: np.ndarray) -> Iterator[float]:
    import tvm
    from tvm import rpc

    server = rpc.Server("127.0.0.1", port=9190, port_end=9390)
    try:
        remote = rpc.connect("127.0.0.1", server.port)
        device = remote.cpu(0)
        for round_ in range(PEER_ROUNDS + 2):
            seconds = _timed(lambda: tvm.runtime.tensor(x, device).numpy())
            if round_ >= 2:
                yield seconds
    finally:
        server.terminate()


def bench_peer(work: Path, results: Path) -> dict[str, Any]:
    """A 1x3x640x640 float32 tensor to the server and back: Apache TVM's RPC vs this daemon (identity)."""
    x = np.random.default_rng(3).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    try:
        tvm_s = list(_tvm_round_trips(x))
        import tvm

        peer = f"Apache TVM {tvm.__version__} RPC server (tvm.rpc.Server), tensor upload + download"
    except ImportError as exc:
        return {"skipped": f"apache-tvm is not installed ({exc}); install the bench extra to compare"}
    model = big_identity(work / "identity_peer.onnx", x.size)
    daemon = _daemon(work, results, "peer", default_threads())
    try:
        with connect(daemon.url) as device, device.load(model) as session:
            flat = x.reshape(1, -1)
            for _ in range(2):
                session.run([flat])
            ours = [_timed(lambda: session.run([flat])) for _ in range(PEER_ROUNDS)]
    finally:
        daemon.stop()
    return {
        "tensor": f"1x3x{SIZE}x{SIZE} float32 ({x.nbytes} bytes) each way, loopback",
        "peer": peer,
        "peer_round_trip_ms": statistics.median(tvm_s) * 1e3,
        "daemon_round_trip_ms": statistics.median(ours) * 1e3,
        "daemon_speed_over_peer": statistics.median(tvm_s) / statistics.median(ours),
    }


BENCHMARKS: tuple[tuple[str, Callable[[Path, Path], dict[str, Any]]], ...] = (
    ("pipelining_usb2", bench_pipelining),
    ("native_outputs_usb2", bench_native_outputs),
    ("concurrent_clients", bench_concurrency),
    ("peer_tvm_rpc", bench_peer),
)
