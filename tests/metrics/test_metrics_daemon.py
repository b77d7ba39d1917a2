"""/metrics of a live daemon after a known workload: counts, histogram observations and labels, exactly;
board telemetry from a fake sysfs/procfs/debugfs tree."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.metrics_core import Metric

from rknn_client import connect
from rknn_client.errors import InvalidInput
from rknn_proto.manifest import describe_files
from tests import models
from tests.metrics.conftest import MetricsDaemon, samples, scrape, start_metrics_daemon, telemetry_board

RUNS = 5
INPUT = np.ones((1, 3, 16, 16), dtype=np.float32)
OUTPUT_BYTES = 10 * 4  # small_cnn answers (1, 10) float32


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    folder = tmp_path_factory.mktemp("metrics")
    board = telemetry_board(folder / "board")
    running = start_metrics_daemon(folder, "--sysfs-root", str(board))
    yield running
    running.daemon.stop()
    assert running.daemon.process.returncode == 0, running.daemon.log_text()[-2000:]


def test_a_known_workload_is_counted_exactly(
    metered: MetricsDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RKNN_SHM", "off")  # the bytes counted are the wire's (shared memory moves none)
    model = models.small_cnn(tmp_path / "cnn.onnx", seed=7)
    label = describe_files([model]).digest[:12]
    with connect(metered.daemon.url) as device:
        session = device.load(model)
        for _ in range(RUNS):
            session.run([INPUT])
        with pytest.raises(InvalidInput):
            session.run([np.ones((1, 3, 8, 8), dtype=np.float32)], strict=False)
        device.load(model).release()  # cached now: a cache hit, no second upload
        found = scrape(metered.metrics_url)

    rpcs = samples(found["rknn_rpc"], "rknn_rpc_total")
    assert rpcs[(("method", "Run"), ("outcome", "OK"))] == RUNS
    assert rpcs[(("method", "Run"), ("outcome", "INVALID_ARGUMENT"))] == 1
    assert rpcs[(("method", "UploadModel"), ("outcome", "OK"))] == 1
    assert rpcs[(("method", "InitRuntime"), ("outcome", "OK"))] == 2
    assert rpcs[(("method", "Release"), ("outcome", "OK"))] == 1
    durations = samples(found["rknn_rpc_duration_seconds"], "rknn_rpc_duration_seconds_count")
    assert durations[(("method", "Run"), ("outcome", "OK"))] == RUNS
    assert durations[(("method", "Run"), ("outcome", "INVALID_ARGUMENT"))] == 1

    received = samples(found["rknn_rpc_received_bytes"], "rknn_rpc_received_bytes_total")
    assert (
        received[(("method", "Run"),)] == RUNS * INPUT.nbytes
    )  # the refused call's tensor was never taken in
    assert received[(("method", "UploadModel"),)] == model.stat().st_size
    sent = samples(found["rknn_rpc_sent_bytes"], "rknn_rpc_sent_bytes_total")
    assert sent[(("method", "Run"),)] == RUNS * OUTPUT_BYTES

    # Only the runs that reached the model: N runs -> N observations of queueing and of compute.
    for name in ("rknn_model_queue_seconds", "rknn_model_compute_seconds"):
        assert samples(found[name], f"{name}_count") == {(("model", label),): RUNS}
        buckets = samples(found[name], f"{name}_bucket")
        assert buckets[(("le", "+Inf"), ("model", label))] == RUNS

    assert samples(found["rknn_sessions_open"]) == {(): 1}  # one still open, one released
    assert samples(found["rknn_model_cache_entries"]) == {(): 1}
    assert samples(found["rknn_model_cache_bytes"]) == {(): model.stat().st_size}
    assert samples(found["rknn_model_cache_hits"], "rknn_model_cache_hits_total") == {(): 1}
    assert samples(found["rknn_model_cache_stored"], "rknn_model_cache_stored_total") == {(): 1}
    assert samples(found["rknn_model_cache_evictions"], "rknn_model_cache_evictions_total") == {(): 0}
    assert samples(found["rknn_reservation_held"]) == {(): 0}


def test_doorbell_frames_are_counted_by_outcome_and_as_model_runs(
    metered: MetricsDaemon, tmp_path: Path
) -> None:
    model = models.small_cnn(tmp_path / "cnn.onnx", seed=8)  # a model of its own: its own label
    label = describe_files([model]).digest[:12]
    before = samples(scrape(metered.metrics_url)["rknn_doorbell_frames"], "rknn_doorbell_frames_total")

    def frames_ok(found: dict[str, Metric]) -> float:
        frames = samples(found["rknn_doorbell_frames"], "rknn_doorbell_frames_total")
        return frames.get((("code", "OK"),), 0) - before.get((("code", "OK"),), 0)

    with connect(metered.daemon.url) as device, device.load(model) as session:
        for _ in range(RUNS):
            session.run([INPUT])
        # A doorbell counts a frame just after answering it: the last one may land a moment later.
        deadline = time.monotonic() + 10
        found = scrape(metered.metrics_url)
        while frames_ok(found) < RUNS and time.monotonic() < deadline:
            time.sleep(0.01)
            found = scrape(metered.metrics_url)
    assert frames_ok(found) == RUNS
    assert (
        samples(found["rknn_model_compute_seconds"], "rknn_model_compute_seconds_count")[(("model", label),)]
        == RUNS
    )
    rpcs = samples(found["rknn_rpc"], "rknn_rpc_total")
    assert rpcs[(("method", "OpenDoorbell"), ("outcome", "OK"))] >= 1


def test_board_telemetry_comes_from_the_probe_root(metered: MetricsDaemon) -> None:
    found = scrape(metered.metrics_url)
    assert samples(found["rknn_npu_load_ratio"]) == {
        (("core", "0"),): 0.12,
        (("core", "1"),): 0.0,
        (("core", "2"),): 1.0,
    }
    assert samples(found["rknn_cpu_frequency_hertz"]) == {
        (("policy", policy),): 1_200_000_000 for policy in ("policy0", "policy4", "policy6")
    }
    assert samples(found["rknn_npu_frequency_hertz"]) == {(("device", "fdab0000.npu"),): 300_000_000}
    assert samples(found["rknn_ddr_frequency_hertz"]) == {(("device", "dmc"),): 528_000_000}
    assert samples(found["rknn_temperature_celsius"]) == {
        (("type", "soc-thermal"), ("zone", "thermal_zone0")): 45.25
    }
    assert samples(found["rknn_memory_total_bytes"]) == {(): 8_010_000 * 1024}
    assert samples(found["rknn_memory_available_bytes"]) == {(): 5_000_000 * 1024}
