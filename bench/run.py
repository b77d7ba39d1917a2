"""`make bench`: ratios measured in one run, written to bench-results/results.json and printed.

- remote vs in-process inference latency (p50) for MobileNetV2, same ONNX Runtime threads;
- a 64 MiB tensor round trip through the daemon vs a raw loopback socket carrying the same bytes;
- a 1 GiB model upload vs the no-op gRPC stream, and the daemon's RSS growth while it streams in;
  a re-run's client-side time before the cache hit (its digests remembered);
- the daemon's CPU per MobileNetV2 frame (/proc/PID/stat), also pinned to one core (a board's);
- the same daemon through an adb forward vs direct TCP: latency p50 and the 64 MiB round trip.
- shared memory (bench/shared_memory.py): MobileNetV2 p50 and the 64 MiB identity round trip through
  /dev/shm against ONNX Runtime in-process. Every other row measures the wire (RKNN_SHM=off).
- throughput (bench/throughput.py): pipelined vs synchronous inference and int8 vs float32 outputs
  over a simulated USB 2.0 link, eight concurrent clients vs one, and Apache TVM's RPC as a peer.
- int8 fidelity (bench/fidelity.py): our host-side int8 emulation against RKNN-Toolkit2's simulator
  (cosine of the outputs, top-1 agreement) for trained models from PyPI packages and each
  quantized_algorithm; skipped, saying why, without a toolkit (`rknn-client toolkit install`).
The machine is shared and noisy: each figure is the median of several runs, and only the ratios
of figures taken side by side in this one run mean anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import psutil
from onnx import helper

from bench import throughput
from bench.adb_forward import measure_adb
from bench.fidelity import measure_fidelity
from bench.grpc_ceiling import measure_ceiling
from bench.raw_socket import transfer_seconds
from bench.shared_memory import bench_shared_memory
from demo.daemon_process import DaemonProcess, start_daemon
from demo.models import save_mobilenet_v2
from rknn_client import connect
from rknn_client.digest_cache import DigestCache
from rknn_client.model_files import model_files
from rknn_proto.manifest import describe_files
from rknn_server.runtime.host import default_threads, session_options
from tests.models import big_identity

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results"
LATENCY_RUNS = 200
ROUND_TRIPS = 5
TENSOR_BYTES = 64 << 20
MODEL_BYTES = 1 << 30
CPU_FRAMES = 200


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def bench_latency(daemon: DaemonProcess, work: Path) -> dict[str, Any]:
    model = save_mobilenet_v2(work / "mobilenet_v2.onnx")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    threads = default_threads()
    local = ort.InferenceSession(str(model), session_options(threads), providers=["CPUExecutionProvider"])
    with connect(daemon.url) as device, device.load(model) as session:
        for _ in range(20):
            local.run(None, {"input": x})
            session.run([x])
        local_s, remote_s = [], []
        for _ in range(LATENCY_RUNS):  # interleaved, so both see the same machine noise
            t = time.perf_counter()
            local.run(None, {"input": x})
            local_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            session.run([x])
            remote_s.append(time.perf_counter() - t)
    return {
        "model": "MobileNetV2 1x3x224x224 float32",
        "onnxruntime_threads": threads,
        "in_process_p50_ms": p50(local_s) * 1e3,
        "remote_p50_ms": p50(remote_s) * 1e3,
        "remote_over_in_process_p50": p50(remote_s) / p50(local_s),
        "target": "<= 1.10",
    }


def bench_round_trip(daemon: DaemonProcess, work: Path) -> dict[str, Any]:
    elements = TENSOR_BYTES // 4
    model = big_identity(work / "identity_64mib.onnx", elements)
    x = np.random.default_rng(1).standard_normal((1, elements)).astype(np.float32)
    raw = [transfer_seconds(x.data, echo=True) for _ in range(ROUND_TRIPS)]
    with connect(daemon.url) as device, device.load(model) as session:
        session.run([x])
        grpc_s = []
        for _ in range(ROUND_TRIPS):
            t = time.perf_counter()
            session.run([x])
            grpc_s.append(time.perf_counter() - t)
    return {
        "bytes_each_way": TENSOR_BYTES,
        "raw_socket_round_trip_ms": p50(raw) * 1e3,
        "daemon_round_trip_ms": p50(grpc_s) * 1e3,
        "daemon_throughput_vs_raw_socket": p50(raw) / p50(grpc_s),
        "target": ">= 0.5",
    }


def big_external_model(folder: Path, nbytes: int) -> tuple[Path, Path]:
    """An ONNX model whose 1 GiB of weights live in an external-data file, as models that big must."""
    weights = folder / "big_model.weights"
    block = os.urandom(1 << 20)
    with weights.open("wb") as fh:
        for i in range(nbytes >> 20):
            fh.write(block[:-8] + i.to_bytes(8, "little"))
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[nbytes // 4])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", weights.name), ("offset", "0"), ("length", str(nbytes))):
        tensor.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "big",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [nbytes // 4])],
        [tensor],
    )
    model = folder / "big_model.onnx"
    onnx.save(helper.make_model(graph), str(model))
    return model, weights


def bench_upload(daemon: DaemonProcess, work: Path) -> dict[str, Any]:
    """A 1 GiB model into a cold daemon cache (hashed on arrival, verified, on disk), then the same
    model again from a client that remembers its digest (a new `DigestCache`, as a new process)."""
    model, weights = big_external_model(work, MODEL_BYTES)
    raw = transfer_seconds(weights.read_bytes(), echo=False)
    process = psutil.Process(daemon.pid)
    idle = process.memory_info().rss
    peak = [idle]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.01)

    def client_side() -> float:
        """What a run of the client pays before it can ask the daemon: its files and their digests."""
        t = time.perf_counter()
        describe_files(model_files(model), None, DigestCache().sha256)
        return time.perf_counter() - t

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    hash_s = client_side()  # the first run hashes (and remembers)
    with connect(daemon.url) as device:
        daemon_cpu, client_cpu = _cpu_seconds(daemon.pid), time.process_time()
        t = time.perf_counter()
        result = device.upload(model)
        upload_s = time.perf_counter() - t
        daemon_cpu, client_cpu = _cpu_seconds(daemon.pid) - daemon_cpu, time.process_time() - client_cpu
    stop.set()
    sampler.join()
    rerun_client_s = p50([client_side() for _ in range(5)])
    with connect(daemon.url) as device:
        t = time.perf_counter()
        again = device.upload(model)
        rerun_s = time.perf_counter() - t
    weights.unlink()
    assert not result.cached and result.sent_bytes >= MODEL_BYTES and again.cached
    return {
        "model_bytes": MODEL_BYTES,
        "raw_socket_s": raw,
        "client_sha256_s": hash_s,
        "upload_s": upload_s,
        "upload_mb_s": MODEL_BYTES / upload_s / 1e6,
        "upload_throughput_vs_raw_socket": raw / upload_s,
        "upload_throughput_vs_raw_socket_including_client_sha256": raw / (upload_s + hash_s),
        "upload_daemon_cpu_s": daemon_cpu,  # where the time goes on a 2-core machine: both sides'
        "upload_client_cpu_s": client_cpu,  # CPU, beside the no-op stream's one copy
        "rerun_client_side_ms": rerun_client_s * 1e3,
        "rerun_upload_call_ms": rerun_s * 1e3,
        "daemon_rss_idle_mib": idle / 2**20,
        "daemon_rss_peak_mib": peak[0] / 2**20,
        "daemon_rss_growth_mib": (peak[0] - idle) / 2**20,
        "target": ">= 0.8 of the no-op gRPC stream; re-run client side < 50 ms; RSS growth <= 64 MiB",
    }


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, from /proc/PID/stat (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _daemon_cpu_per_call(daemon: DaemonProcess, model: Path, x: np.ndarray) -> tuple[float, float]:
    """(daemon CPU seconds, wall seconds) per `Session.run` of `x`, over CPU_FRAMES calls."""
    with connect(daemon.url) as device, device.load(model) as session:
        for _ in range(20):
            session.run([x])
        before, t = _cpu_seconds(daemon.pid), time.perf_counter()
        for _ in range(CPU_FRAMES):
            session.run([x])
        wall = (time.perf_counter() - t) / CPU_FRAMES
        return (_cpu_seconds(daemon.pid) - before) / CPU_FRAMES, wall


def bench_cpu_per_frame(daemon: DaemonProcess, work: Path) -> dict[str, Any]:
    """The daemon's CPU per MobileNetV2 frame, and per call of an identity model carrying the same
    602,112 bytes in and out: the second is what serving costs, which a board pays from its CPU while
    the NPU computes (subtracting ONNX Runtime's own CPU measured elsewhere is too noisy here)."""
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    mobilenet = save_mobilenet_v2(work / "mobilenet_v2.onnx")
    identity = big_identity(work / "identity_602112_bytes.onnx", x.size)
    cpu, wall = _daemon_cpu_per_call(daemon, mobilenet, x)
    serving, _ = _daemon_cpu_per_call(daemon, identity, x.reshape(1, -1))
    return {
        "frames": CPU_FRAMES,
        "daemon_cpu_ms_per_mobilenet_v2_frame": cpu * 1e3,
        "remote_wall_ms_per_mobilenet_v2_frame": wall * 1e3,
        "daemon_cpu_ms_per_identity_call_602112_bytes_each_way": serving * 1e3,
    }


def bench_cpu_one_core(work: Path) -> dict[str, Any]:
    """The same with the daemon pinned to one core (every thread, as `taskset -a -c 0`): what a
    board's core pays per frame."""
    daemon = start_daemon(work / "cache-pinned", RESULTS / "bench-daemon-pinned.log", ["--runtime", "host"])
    try:
        for task in Path(f"/proc/{daemon.pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task.name), {0})
        return {"daemon_pinned_to_core": 0, **bench_cpu_per_frame(daemon, work)}
    finally:
        daemon.stop()


def main() -> int:
    RESULTS.mkdir(exist_ok=True)
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }
    with tempfile.TemporaryDirectory(prefix="rknn-bench-") as tmp:
        work = Path(tmp)
        os.environ["XDG_CACHE_HOME"] = str(work / "client-cache")  # the client's digest cache starts cold
        os.environ["RKNN_SHM"] = "off"  # the wire's rows; bench_shared_memory turns it on for its own
        daemon = start_daemon(work / "cache", RESULTS / "bench-daemon.log", ["--runtime", "host"])
        try:
            for name, fn in (
                ("latency", bench_latency),
                ("round_trip_64mib", bench_round_trip),
                ("upload_1gib", bench_upload),
                ("daemon_cpu_per_frame", bench_cpu_per_frame),
                ("shared_memory", bench_shared_memory),
            ):
                print(f"measuring {name} ...", flush=True)
                results[name] = fn(daemon, work)
                print(json.dumps(results[name], indent=2), flush=True)
        finally:
            daemon.stop()
        print("measuring daemon_cpu_per_frame_one_core ...", flush=True)
        results["daemon_cpu_per_frame_one_core"] = bench_cpu_one_core(work)
        print(json.dumps(results["daemon_cpu_per_frame_one_core"], indent=2), flush=True)
        print("measuring grpc_ceiling ...", flush=True)
        results["grpc_ceiling"] = measure_ceiling()
        print(json.dumps(results["grpc_ceiling"], indent=2), flush=True)
        results["upload_1gib"]["upload_vs_no_op_grpc_stream"] = (
            results["upload_1gib"]["upload_mb_s"] / results["grpc_ceiling"]["no_op_stream_mb_s"]
        )
        print(f"upload_vs_no_op_grpc_stream: {results['upload_1gib']['upload_vs_no_op_grpc_stream']:.2f}")
        latency = results["latency"]
        latency["overhead_over_no_op_unary_call"] = (
            latency["remote_p50_ms"] - latency["in_process_p50_ms"]
        ) / results["grpc_ceiling"]["no_op_unary_call_with_602112_bytes_p50_ms"]
        print(
            f"per-call overhead over the no-op unary call: {latency['overhead_over_no_op_unary_call']:.2f} (target <= 1.3)"
        )
        print("measuring adb_forward ...", flush=True)
        measure_adb(results, work / "adb")
        print(json.dumps(results["adb_forward"], indent=2), flush=True)
        for name, bench in throughput.BENCHMARKS:
            print(f"measuring {name} ...", flush=True)
            results[name] = bench(work, RESULTS)
            print(json.dumps(results[name], indent=2), flush=True)
        print("measuring int8_fidelity ...", flush=True)
        results["int8_fidelity"] = measure_fidelity(work / "fidelity")
        print(json.dumps(results["int8_fidelity"], indent=2), flush=True)
    (RESULTS / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {RESULTS / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
