"""Triton's statistics extension as the real tritonclient reads it, over gRPC and REST: each
successful request's phases (queue, compute input, infer and output) measured and counted per model
and version, and its queue and infer phases the very intervals the daemon's Prometheus histograms
observe (rknn_model_queue_seconds, rknn_model_compute_seconds)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rknn_proto.manifest import FileEntry, file_sha256, manifest_digest
from rknn_server.observe.metrics import MODEL_LABEL_CHARS
from tests.kserve.conftest import V2Daemon
from tests.metrics.conftest import samples, scrape, start_metrics_daemon
from tests.models import identity_of, small_cnn

RUNS = 4
PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
IMAGE = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
BATCH_CONFIG = """
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, triton_python: Path) -> Iterator[V2Daemon]:
    """cnn (the project's layout) and batch (Triton's, max_batch_size 8): each run only by its test."""
    folder = tmp_path_factory.mktemp("statistics")
    root = folder / "repository"
    (root / "cnn").mkdir(parents=True)
    small_cnn(root / "cnn" / "model.onnx")
    (root / "batch" / "1").mkdir(parents=True)
    identity_of(root / "batch" / "1" / "model.onnx", "float32", ("N", 4))  # type: ignore[arg-type]
    (root / "batch" / "config.pbtxt").write_text(BATCH_CONFIG)
    running = start_metrics_daemon(folder, "--model-repository", str(root))
    yield V2Daemon(running, triton_python, folder)
    assert running.daemon.stop() == 0


def counters(answer: dict[str, Any]) -> dict[str, int]:
    """One model's statistics as flat integers (gRPC's JSON writes 64-bit numbers as strings and
    leaves zeros out): inference/execution counts, then each duration's count and ns."""
    assert "ok" in answer, answer
    (stats,) = answer["ok"]["model_stats"]
    assert stats["version"] == "1"
    flat = {key: int(stats.get(key, 0)) for key in ("inference_count", "execution_count")}
    for name in ("success", "fail", *PHASES):
        duration = stats["inference_stats"].get(name, {})
        flat[f"{name}.count"], flat[f"{name}.ns"] = int(duration.get("count", 0)), int(duration.get("ns", 0))
    return flat


def prometheus(daemon: V2Daemon, label: str) -> dict[str, float]:
    """The model's queue and compute histograms' counts and sums."""
    families = scrape(daemon.running.metrics_url)
    found = {}
    for phase in ("queue", "compute"):
        family = families[f"rknn_model_{phase}_seconds"]
        for part in ("count", "sum"):
            values = samples(family, f"rknn_model_{phase}_seconds_{part}")
            found[f"{phase}.{part}"] = values.get((("model", label),), 0.0)
    return found


def label_of(model: Path) -> str:
    """The model label of a one-file model's metrics: its digest's first characters."""
    entry = FileEntry(model.name, model.stat().st_size, file_sha256(model))
    return manifest_digest([entry])[:MODEL_LABEL_CHARS]


def runs(daemon: V2Daemon, model: str, protocol: str, arrays: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """RUNS inferences in one tritonclient process, then the model's statistics."""
    inputs = daemon.folder / f"{model}-{protocol}.npz"
    np.savez(inputs, **arrays)
    step = {"op": "infer", "model": model, "protocol": protocol, "inputs": str(inputs)}
    answers = daemon.drive(
        *({**step, "out": str(daemon.folder / "out.npz")} for _ in range(RUNS)),
        {"op": "stats", "model": model, "protocol": protocol},
    )
    assert all("ok" in a for a in answers), answers
    return answers


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {key: after[key] - before[key] for key in after}


@pytest.mark.parametrize("protocol", ["grpc", "http-json"])
def test_each_phase_is_measured_and_matches_the_prometheus_histograms(
    daemon: V2Daemon, protocol: str
) -> None:
    label = label_of(daemon.folder / "repository" / "cnn" / "model.onnx")
    before = counters(daemon.one({"op": "stats", "model": "cnn", "protocol": protocol}))
    metrics_before = prometheus(daemon, label)
    answers = runs(daemon, "cnn", protocol, {"input": IMAGE})
    moved = delta(counters(answers[-1]), before)
    metrics = delta(prometheus(daemon, label), metrics_before)

    assert moved["inference_count"] == moved["execution_count"] == moved["success.count"] == RUNS, moved
    assert moved["fail.count"] == 0
    for phase in PHASES:
        assert moved[f"{phase}.count"] == RUNS and moved[f"{phase}.ns"] > 0, (phase, moved)
    # the phases lie inside the request's time in the daemon, one after the other
    assert sum(moved[f"{phase}.ns"] for phase in PHASES) <= moved["success.ns"], moved
    # one measurement, two reports: the queue and infer phases are the histograms' observations
    assert metrics["queue.count"] == metrics["compute.count"] == RUNS, metrics
    assert math.isclose(metrics["queue.sum"], moved["queue.ns"] / 1e9, rel_tol=1e-9, abs_tol=1e-8), metrics
    assert math.isclose(
        metrics["compute.sum"], moved["compute_infer.ns"] / 1e9, rel_tol=1e-9, abs_tol=1e-8
    ), metrics


def test_a_batched_request_counts_each_inference_and_one_execution(daemon: V2Daemon) -> None:
    before = counters(daemon.one({"op": "stats", "model": "batch"}))
    answers = runs(daemon, "batch", "grpc", {"x": np.ones((3, 4), np.float32)})
    moved = delta(counters(answers[-1]), before)
    assert moved["inference_count"] == 3 * RUNS, moved  # Triton counts each element of a batch
    assert moved["execution_count"] == moved["success.count"] == moved["compute_infer.count"] == RUNS, moved


@pytest.mark.parametrize("protocol", ["grpc", "http-json"])
def test_the_server_metadata_lists_the_statistics_extension(daemon: V2Daemon, protocol: str) -> None:
    answer = daemon.one({"op": "server_metadata", "protocol": protocol})
    assert "statistics" in answer["ok"]["extensions"], answer
