"""An uploaded file that is no model is not READY: UNAVAILABLE with the reason in the repository
index, as Triton reports a model that fails to load."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from rknn_client.device import Device
from rknn_client.transport.tcp import tcp_endpoint
from tests import models
from tests.metrics.conftest import get, start_metrics_daemon


def _index(base: str) -> dict[str, dict[str, str]]:
    request = urllib.request.Request(f"{base}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=30) as reply:
        return {entry["name"]: entry for entry in json.loads(reply.read())}


def test_an_uploaded_non_model_is_unavailable_with_a_reason(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model\n")
    model = models.small_cnn(tmp_path / "m.onnx")
    daemon = start_metrics_daemon(tmp_path)
    try:
        with Device(tcp_endpoint(daemon.daemon.url)) as device:
            junk, good = device.upload(notes).digest, device.upload(model).digest
        status, _ = get(f"{daemon.base}/v2/models/{junk}/ready")
        assert status == 503
        assert get(f"{daemon.base}/v2/models/{good}/ready")[0] == 200
        index = _index(daemon.base)
        assert index[junk]["state"] == "UNAVAILABLE" and "notes.txt is not a model" in index[junk]["reason"]
        assert index[good]["state"] == "READY"
    finally:
        daemon.daemon.stop()
