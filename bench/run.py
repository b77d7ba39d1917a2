"""`make bench`: ratios measured in one run, written to bench-results/results.json and printed.

- remote vs in-process inference latency (p50) for MobileNetV2, same ONNX Runtime threads;
- a 64 MiB tensor round trip through the daemon vs a raw loopback socket carrying the same bytes and
  vs the no-op gRPC server bouncing them back (bench/grpc_ceiling.py), alternately;
- a 1 GiB model upload into a cold cache vs the no-op gRPC stream of the same bytes in the same
  chunks, alternately, and the daemon's RSS growth while it streams in;
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
- the toolkit protocol (bench/legacy_round_trip.py): the unmodified toolkit's `inference()` through
  an emulated adb board against rknn.v1's `Run` of the same model on the same daemon (p50 ratio).
- peers (bench/peers): KServe, MLServer and PyTriton, each in a venv of its own, serving the same
  models on the same ONNX Runtime to the same tritonclient, alternated with ours over three rounds
  (p50/p99, throughput, server CPU per request and RSS as ratios peer/ours); the daemon's start time
  and RSS per session; perf_analyzer on our dynamic batcher against the same model without it.
The machine is shared and noisy: each figure is the median of several runs, and only the ratios
of figures taken side by side in this one run mean anything.
`python -m bench.run --only NAME` (repeatable) measures only those rows, into
bench-results/results-only.json.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import functools
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import psutil
from onnx import helper

from bench import ort_server, throughput
from bench.adb_forward import measure_adb
from bench.fidelity import measure_fidelity
from bench.grpc_ceiling import NoOpServer, measure_ceiling
from bench.legacy_round_trip import measure_legacy
from bench.peers.row import measure_peers
from bench.raw_socket import transfer_seconds
from bench.shared_memory import bench_shared_memory, shared_memory_on
from bench.side_by_side import side_by_side
from demo.models import save_mobilenet_v2
from rknn_client import connect
from rknn_client.digest_cache import DigestCache
from rknn_client.model_files import model_files
from rknn_client.upload_stream import upload_chunk_bytes
from rknn_proto import codec
from rknn_proto.manifest import describe_files
from rknn_server.runtime.host import default_threads
from rknn_server.runtime.host_model import session_options
from rknn_server.testing import DaemonProcess, start_daemon
from tests.models import big_identity

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results"
PARTIAL = RESULTS / "results-only.json"  # what `--only` measured: results.json stays the whole run's
LATENCY_RUNS = 200
ROUND_TRIPS = 7
UPLOADS = 5
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
        local_p50, remote_p50 = side_by_side(
            lambda: local.run(None, {"input": x}), lambda: session.run([x]), LATENCY_RUNS, 20
        )
    floor_local_s, floor_s = ort_server.measure(model, x, LATENCY_RUNS)
    return {
        "model": "MobileNetV2 1x3x224x224 float32",
        "onnxruntime_threads": threads,
        "in_process_p50_ms": local_p50 * 1e3,
        "remote_p50_ms": remote_p50 * 1e3,
        "remote_over_in_process_p50": remote_p50 / local_p50,
        # The same frame through ONNX Runtime behind the smallest gRPC server (bench/ort_server.py).
        "minimal_grpc_server_p50_ms": floor_s * 1e3,
        "minimal_grpc_server_in_process_p50_ms": floor_local_s * 1e3,
        "minimal_grpc_server_over_in_process_p50": floor_s / floor_local_s,
        "target": "<= 1.10",
    }


def bench_round_trip(daemon: DaemonProcess, work: Path) -> dict[str, Any]:
    """A 64 MiB tensor through an identity model and back, alternately with the same bytes through a
    raw socket and bounced by the no-op gRPC server (in the chunks the client sends them in)."""
    elements = TENSOR_BYTES // 4
    model = big_identity(work / "identity_64mib.onnx", elements)
    x = np.random.default_rng(1).standard_normal((1, elements)).astype(np.float32)
    chunk = codec.chunk_bytes_for(TENSOR_BYTES)
    raw, grpc_s, ceiling_s, run_s = [], [], [], []
    # CPU seconds of each round trip (client, server side): steadier than time on a shared machine.
    ceiling_cpu: list[tuple[float, float]] = []
    daemon_cpu: list[tuple[float, float]] = []
    with NoOpServer() as ceiling, connect(daemon.url) as device, device.load(model) as session:
        session.run([x])
        ceiling.bounce_seconds(TENSOR_BYTES, chunk)
        for _ in range(ROUND_TRIPS):  # interleaved, so all three see the same machine noise
            raw.append(transfer_seconds(x.data, echo=True))
            with _cpu(ceiling.pid, ceiling_cpu):
                ceiling_s.append(ceiling.bounce_seconds(TENSOR_BYTES, chunk))
            with _cpu(daemon.pid, daemon_cpu):
                t = time.perf_counter()
                session.run([x])
                grpc_s.append(time.perf_counter() - t)
            run_s.append(session.last_run_time_us / 1e6)
    ratios = [c / d for c, d in zip(ceiling_s, grpc_s, strict=True)]
    # The model's own run (one 64 MiB copy) can start only once the whole input is in, and the reply
    # only once it is done: a server that added nothing else to the bounce would reach c / (c + run).
    floors = [c / (c + r) for c, r in zip(ceiling_s, run_s, strict=True)]
    return {
        "bytes_each_way": TENSOR_BYTES,
        "chunk_bytes": chunk,
        "raw_socket_round_trip_ms": p50(raw) * 1e3,
        "no_op_grpc_bounce_round_trip_ms": p50(ceiling_s) * 1e3,
        "daemon_round_trip_ms": p50(grpc_s) * 1e3,
        "daemon_throughput_vs_raw_socket": p50(raw) / p50(grpc_s),
        "daemon_vs_no_op_grpc_stream": p50(ratios),
        "daemon_vs_no_op_grpc_stream_min_max": [min(ratios), max(ratios)],
        "daemon_run_ms": p50(run_s) * 1e3,
        "floor_no_op_bounce_plus_the_run_vs_no_op_grpc_stream": p50(floors),
        "no_op_grpc_bounce_cpu_ms_client_server": _p50_ms(ceiling_cpu),
        "daemon_round_trip_cpu_ms_client_daemon": _p50_ms(daemon_cpu),
        "target": ">= 0.95 of the no-op gRPC stream (bounced)",
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
    """A 1 GiB model into a cold daemon cache (hashed on arrival, verified, on disk), alternately with
    the same bytes through the no-op gRPC stream in the same chunks; then the same model again from
    a client that remembers its digest (a new `DigestCache`, as a new process)."""
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
    upload_s, ceiling_s, daemon_cpu, client_cpu = [], [], [], []
    with NoOpServer() as ceiling, connect(daemon.url) as device:
        chunk = upload_chunk_bytes(device.info().limits)
        for _ in range(UPLOADS):  # interleaved, so both see the same machine noise
            ceiling_s.append(ceiling.stream_seconds(MODEL_BYTES, chunk))
            for cached in (daemon_cache(work) / "models").iterdir():  # cold: evicted
                shutil.rmtree(cached)
            cpu_before, client_before = _cpu_seconds(daemon.pid), time.process_time()
            t = time.perf_counter()
            result = device.upload(model)
            upload_s.append(time.perf_counter() - t)
            daemon_cpu.append(_cpu_seconds(daemon.pid) - cpu_before)
            client_cpu.append(time.process_time() - client_before)
            assert not result.cached and result.sent_bytes >= MODEL_BYTES
    stop.set()
    sampler.join()
    rerun_client_s = p50([client_side() for _ in range(5)])
    with connect(daemon.url) as device:
        t = time.perf_counter()
        again = device.upload(model)
        rerun_s = time.perf_counter() - t
    weights.unlink()
    assert again.cached
    ratios = [c / u for c, u in zip(ceiling_s, upload_s, strict=True)]
    return {
        "model_bytes": MODEL_BYTES,
        "chunk_bytes": chunk,
        "uploads": UPLOADS,
        "raw_socket_s": raw,
        "client_sha256_s": hash_s,
        "upload_s": p50(upload_s),
        "upload_mb_s": MODEL_BYTES / p50(upload_s) / 1e6,
        "no_op_grpc_stream_mb_s": MODEL_BYTES / p50(ceiling_s) / 1e6,
        "upload_vs_no_op_grpc_stream": p50(ratios),
        "upload_vs_no_op_grpc_stream_min_max": [min(ratios), max(ratios)],
        "upload_throughput_vs_raw_socket": raw / p50(upload_s),
        "upload_throughput_vs_raw_socket_including_client_sha256": raw / (p50(upload_s) + hash_s),
        "upload_daemon_cpu_s": p50(daemon_cpu),  # where the time goes on a 2-core machine: both
        "upload_client_cpu_s": p50(client_cpu),  # sides' CPU, beside the no-op stream's one copy
        "rerun_client_side_ms": rerun_client_s * 1e3,
        "rerun_upload_call_ms": rerun_s * 1e3,
        "daemon_rss_idle_mib": idle / 2**20,
        "daemon_rss_peak_mib": peak[0] / 2**20,
        "daemon_rss_growth_mib": (peak[0] - idle) / 2**20,
        "target": ">= 0.8 of the no-op gRPC stream; re-run client side < 50 ms; RSS growth <= 64 MiB",
    }


def daemon_cache(work: Path) -> Path:
    """The model cache of the benchmark's daemon."""
    return work / "cache"


@contextlib.contextmanager
def _cpu(server_pid: int, into: list[tuple[float, float]]) -> Iterator[None]:
    """Append the CPU seconds this process and the server `server_pid` spent in the block."""
    client, server = time.process_time(), _cpu_seconds(server_pid)
    yield
    into.append((time.process_time() - client, _cpu_seconds(server_pid) - server))


def _p50_ms(pairs: list[tuple[float, float]]) -> list[float]:
    """The median of each side of (client, server) seconds, in ms."""
    return [p50([pair[side] for pair in pairs]) * 1e3 for side in (0, 1)]


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
    with shared_memory_on():  # the same frames from a client on the daemon's host: rung on a doorbell
        shared_cpu, shared_wall = _daemon_cpu_per_call(daemon, mobilenet, x)
        shared_serving, _ = _daemon_cpu_per_call(daemon, identity, x.reshape(1, -1))
    return {
        "frames": CPU_FRAMES,
        "daemon_cpu_ms_per_mobilenet_v2_frame": cpu * 1e3,
        "remote_wall_ms_per_mobilenet_v2_frame": wall * 1e3,
        "daemon_cpu_ms_per_identity_call_602112_bytes_each_way": serving * 1e3,
        "shared_memory_daemon_cpu_ms_per_mobilenet_v2_frame": shared_cpu * 1e3,
        "shared_memory_wall_ms_per_mobilenet_v2_frame": shared_wall * 1e3,
        "shared_memory_daemon_cpu_ms_per_identity_frame": shared_serving * 1e3,
    }


def bench_cpu_one_core(work: Path) -> dict[str, Any]:
    """The same with the daemon started on one core (as `taskset -c 0 rknn_server`: it sizes its
    ONNX Runtime threads for the one core it sees): what a board's core pays per frame."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})  # the daemon inherits it; this process goes back at once
    try:
        daemon = start_daemon(
            work / "cache-pinned", RESULTS / "bench-daemon-pinned.log", ["--runtime", "host"]
        )
    finally:
        os.sched_setaffinity(0, mine)
    try:
        return {"daemon_pinned_to_core": 0, **bench_cpu_per_frame(daemon, work)}
    finally:
        daemon.stop()


def _standalone(work: Path) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """The measurements that start what they measure themselves, by name."""
    return [
        ("daemon_cpu_per_frame_one_core", lambda: bench_cpu_one_core(work)),
        ("grpc_ceiling", measure_ceiling),
        ("adb_forward", lambda: _adb_forward(work)),
        *[(name, functools.partial(bench, work, RESULTS)) for name, bench in throughput.BENCHMARKS],
        ("int8_fidelity", lambda: measure_fidelity(work / "fidelity")),
        ("legacy_round_trip", lambda: measure_legacy(work / "legacy")),
        ("peers", lambda: measure_peers(work / "peers")),
    ]


def _adb_forward(work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    measure_adb(results, work / "adb")
    return dict(results["adb_forward"])


DAEMON_BENCHMARKS: tuple[tuple[str, Callable[[DaemonProcess, Path], dict[str, Any]]], ...] = (
    ("latency", bench_latency),
    ("round_trip_64mib", bench_round_trip),
    ("upload_1gib", bench_upload),
    ("daemon_cpu_per_frame", bench_cpu_per_frame),
    ("shared_memory", bench_shared_memory),
)
NAMES = [name for name, _ in DAEMON_BENCHMARKS] + [name for name, _ in _standalone(Path())]


def _measure(results: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]) -> None:
    print(f"measuring {name} ...", flush=True)
    results[name] = fn()
    print(json.dumps(results[name], indent=2), flush=True)


def compile_packages() -> None:
    """Our packages' bytecode written beside their sources, as a wheel's install writes it: the peers'
    venvs have theirs, and where PYTHONDONTWRITEBYTECODE is set (CI images, this sandbox) every daemon
    start would otherwise compile our modules afresh (~0.3 s of a start-to-ready here)."""
    for package in ("proto", "server", "client"):
        compileall.compile_dir(ROOT / package, quiet=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only",
        action="append",
        choices=NAMES,
        metavar="NAME",
        help=f"measure only this (repeatable; written to {PARTIAL.name}): {', '.join(NAMES)}",
    )
    wanted = set(parser.parse_args(argv).only or NAMES)
    RESULTS.mkdir(exist_ok=True)
    compile_packages()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }
    with tempfile.TemporaryDirectory(prefix="rknn-bench-") as tmp:
        work = Path(tmp)
        # The client remembers no digest yet (the toolkit and other caches stay where they are).
        os.environ["RKNN_CLIENT_DIGEST_CACHE"] = str(work / "digests.json")
        os.environ["RKNN_SHM"] = "off"  # the wire's rows; bench_shared_memory turns it on for its own
        if wanted & {name for name, _ in DAEMON_BENCHMARKS}:
            daemon = start_daemon(daemon_cache(work), RESULTS / "bench-daemon.log", ["--runtime", "host"])
            try:
                for name, fn in DAEMON_BENCHMARKS:
                    if name in wanted:
                        _measure(results, name, functools.partial(fn, daemon, work))
            finally:
                daemon.stop()
        for name, measure in _standalone(work):
            if name in wanted:
                _measure(results, name, measure)
        if "latency" in results and "grpc_ceiling" in results:
            latency = results["latency"]
            call_ms = results["grpc_ceiling"]["no_op_unary_call_with_602112_bytes_p50_ms"]
            latency["overhead_over_no_op_unary_call"] = (
                latency["remote_p50_ms"] - latency["in_process_p50_ms"]
            ) / call_ms
            latency["minimal_grpc_server_overhead_over_no_op_unary_call"] = (
                latency["minimal_grpc_server_p50_ms"] - latency["minimal_grpc_server_in_process_p50_ms"]
            ) / call_ms
            print(
                f"per-call overhead over the no-op unary call: {latency['overhead_over_no_op_unary_call']:.2f}"
            )
    out = RESULTS / "results.json" if wanted == set(NAMES) else PARTIAL
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
