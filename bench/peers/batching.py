"""Issue 30's figure: perf_analyzer at concurrency 8 on MobileNetV2 through our daemon, the model
with Triton's dynamic batcher (config.pbtxt `dynamic_batching`) against the very same file without
it, alternated over the rounds; throughput and p50 as ratios batched/plain."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.peers.models import batchable_mobilenet_v2
from bench.peers.servers import DAEMON_ARGS
from bench.peers.summary import spread
from rknn_server.testing import start_daemon
from tests.kserve.tritonclient_venv import ensure_perf_analyzer

ROUNDS = 3
CONCURRENCY = 8
MAX_BATCH = 8
QUEUE_DELAY_US = 5000
# Batches of half the callers: two of them compute side by side on our 2 cores (--threads 1), as a
# Triton user sizes preferred batches to the instances that run them.
PREFERRED_BATCH = CONCURRENCY // 2
INTERVAL_MS = 1500
CONFIGS = {
    "batched": f"max_batch_size: {MAX_BATCH}\ndynamic_batching {{ preferred_batch_size: {PREFERRED_BATCH} "
    f"max_queue_delay_microseconds: {QUEUE_DELAY_US} }}\n",
    "plain": f"max_batch_size: {MAX_BATCH}\n",
}


def triton_repository(folder: Path) -> Path:
    """NAME/config.pbtxt and NAME/1/model.onnx for each configuration, one model file for both."""
    model = batchable_mobilenet_v2(folder / "mobilenet_v2_batch_n.onnx")
    for name, config in CONFIGS.items():
        (folder / "repository" / name / "1").mkdir(parents=True, exist_ok=True)
        (folder / "repository" / name / "1" / "model.onnx").write_bytes(model.read_bytes())
        (folder / "repository" / name / "config.pbtxt").write_text(config)
    return folder / "repository"


def measure_batching(work: Path) -> dict[str, Any]:
    tool, reason = ensure_perf_analyzer()
    if tool is None:
        return {"skipped": reason}
    repository = triton_repository(work)
    daemon = start_daemon(
        work / "cache", work / "daemon.log", [*DAEMON_ARGS, "--model-repository", str(repository)]
    )
    rows: dict[str, list[dict[str, str]]] = {name: [] for name in CONFIGS}
    try:
        for number in range(ROUNDS):
            for name in list(CONFIGS)[:: 1 if number % 2 == 0 else -1]:  # alternated
                rows[name] += tool.measure(
                    work / f"{name}-{number}.csv",
                    *("-m", name, "-u", daemon.address, "-i", "grpc", "-b", "1"),
                    *("--concurrency-range", str(CONCURRENCY)),
                    interval_ms=INTERVAL_MS,
                )
    except AssertionError as exc:  # perf_analyzer failed: its output says why
        return {"error": str(exc)[-1500:]}
    finally:
        daemon.stop()
    throughput = {name: [float(r["Inferences/Second"]) for r in found] for name, found in rows.items()}
    p50_ms = {name: [float(r["p50 latency"]) / 1e3 for r in found] for name, found in rows.items()}
    return {
        "model": "MobileNetV2 Nx3x224x224 float32 (batch axis any size), v2 gRPC, perf_analyzer -b 1",
        "concurrency": CONCURRENCY,
        "configs": CONFIGS,
        "daemon": " ".join(DAEMON_ARGS),
        "throughput_rps": {name: statistics.median(values) for name, values in throughput.items()},
        "p50_ms": {name: statistics.median(values) for name, values in p50_ms.items()},
        "throughput_batched_over_plain": spread(
            [b / p for b, p in zip(throughput["batched"], throughput["plain"], strict=True)]
        ),
        "p50_batched_over_plain": spread(
            [b / p for b, p in zip(p50_ms["batched"], p50_ms["plain"], strict=True)]
        ),
    }
