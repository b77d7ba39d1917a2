"""Triton's real perf_analyzer (its own venv) load-tests a daemon subprocess over KServe v2, gRPC and
HTTP: it reads the model's configuration (Triton's ModelConfig) and statistics (ModelStatistics),
then measures each concurrency step, with the daemon's side of it from the statistics (run without
-x: the statistics name each model's version). Before the daemon answered ModelConfig it stopped at
once with "failed to get model config"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc
from tests.kserve.conftest import make_repository
from tests.kserve.tritonclient_venv import PerfAnalyzer
from tests.metrics.conftest import MetricsDaemon, start_metrics_daemon

SERVER_PHASES = ("Server Queue", "Server Compute Input", "Server Compute Infer", "Server Compute Output")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    folder = tmp_path_factory.mktemp("perf-analyzer")
    running = start_metrics_daemon(folder, "--model-repository", str(make_repository(folder / "repository")))
    yield running
    assert running.daemon.stop() == 0


def inference_count(daemon: MetricsDaemon, model: str) -> int:
    with grpc.insecure_channel(daemon.daemon.address) as channel:
        stats = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest(name=model), timeout=30
        )
    (only,) = stats.model_stats
    assert only.inference_stats.success.count == only.inference_count
    return only.inference_count


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_measures_every_concurrency_step(
    perf_analyzer: PerfAnalyzer, daemon: MetricsDaemon, protocol: str, tmp_path: Path
) -> None:
    url = daemon.daemon.address if protocol == "grpc" else daemon.base.removeprefix("http://")
    before = inference_count(daemon, "two")
    measured = perf_analyzer.measure(
        tmp_path / "report.csv",
        *("-m", "two", "-u", url, "-i", protocol, "--concurrency-range", "1:2"),
        interval_ms=1000,
    )
    steps = {int(row["Concurrency"]): float(row["Inferences/Second"]) for row in measured}
    assert set(steps) == {1, 2}, steps
    assert all(throughput > 0 for throughput in steps.values()), steps
    # the statistics extension is listed, so it splits each step's time into the daemon's phases
    for phase in SERVER_PHASES:
        assert all(float(row[phase]) > 0 for row in measured), (phase, measured)
    # the daemon's statistics counted the requests perf_analyzer made (a second of each window at least)
    assert inference_count(daemon, "two") - before >= sum(steps.values()) * 0.5
