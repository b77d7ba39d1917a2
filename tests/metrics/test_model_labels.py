"""Model labels are bounded: a client uploading many models cannot grow the daemon's series without end."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from rknn_server.observe.metrics import MAX_MODEL_LABELS, OTHER_MODEL, DaemonMetrics


def test_models_beyond_the_label_limit_share_one_label() -> None:
    metrics = DaemonMetrics()
    digests = [f"{i:012x}".ljust(64, "a") for i in range(MAX_MODEL_LABELS + 10)]
    for digest in digests:
        metrics.model_run(digest, 0.001, 0.002)
    metrics.model_run(digests[0], 0.001, 0.002)  # a labelled model keeps its label
    counts = {
        sample.labels["model"]: sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        if family.name == "rknn_model_compute_seconds"
        for sample in family.samples
        if sample.name == "rknn_model_compute_seconds_count"
    }
    assert len(counts) == MAX_MODEL_LABELS + 1
    assert counts[OTHER_MODEL] == 10
    assert counts[digests[0][:12]] == 2


def test_two_daemons_in_one_process_keep_their_own_counts() -> None:
    first, second = DaemonMetrics(), DaemonMetrics()
    first.rpc_done("Run", "OK", 0.01, 10, 20)
    assert b'rknn_rpc_total{method="Run",outcome="OK"} 1.0' in first.exposition()
    assert b"rknn_rpc_total{" not in second.exposition()
