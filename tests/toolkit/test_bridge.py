"""The bridge with the real RKNN-Toolkit2: a real .rknn, its simulator, its accuracy_analysis files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from rknn_client.accuracy.compare import cosine
from rknn_client.toolkit import ToolkitBridge


def test_export_rknn_writes_a_real_rknn_model(built: ToolkitBridge, tmp_path: Path) -> None:
    target = tmp_path / "cnn.rknn"
    reply = built.call("export_rknn", str(target))
    assert (reply.ok, reply.value) == (True, 0), reply.error
    data = target.read_bytes()
    assert data[:4] == b"RKNN"
    assert len(data) > 10_000


def test_relative_paths_resolve_against_the_callers_directory(
    built: ToolkitBridge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    reply = built.call("export_rknn", "./relative.rknn")
    assert (reply.ok, reply.value) == (True, 0), reply.error
    assert (tmp_path / "relative.rknn").read_bytes()[:4] == b"RKNN"


def test_build_streams_the_toolkits_own_lines(toolkit, classifier, capfd: pytest.CaptureFixture[str]) -> None:
    model, dataset, _ = classifier
    bridge = ToolkitBridge.start(toolkit)
    assert isinstance(bridge, ToolkitBridge), bridge
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        assert bridge.call("load_onnx", str(model)).value == 0
        reply = bridge.call("build", do_quantization=True, dataset=str(dataset))
    finally:
        bridge.close()
    assert reply.value == 0, reply.error
    texts = [text for _, text in reply.lines]
    assert any("rknn building done" in text for text in texts), texts
    shown = capfd.readouterr()
    assert "rknn building done" in shown.out + shown.err
    assert "rknn-bridge-sync" not in shown.out + shown.err


def test_simulator_inference_matches_onnxruntime_on_the_float_model(built: ToolkitBridge, classifier) -> None:
    model, _, samples = classifier
    assert built.call("init_runtime").value == 0
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for sample in samples:
        reply = built.call("inference", inputs=[sample], data_format="nchw")
        assert reply.ok, reply.error
        (out,) = reply.value
        (expected,) = session.run(None, {"input": sample / 255.0})
        assert out.shape == expected.shape == (1, 10)
        assert cosine(out, expected) > 0.999
        assert int(np.argmax(out)) == int(np.argmax(expected))
    assert not list(built.scratch.iterdir()), "arrays of finished calls must not pile up"


def test_accuracy_analysis_writes_the_toolkits_layout(
    built: ToolkitBridge, classifier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, dataset, _ = classifier
    first = dataset.read_text().split()[0]
    monkeypatch.chdir(tmp_path)
    reply = built.call("accuracy_analysis", inputs=[first], output_dir="snapshot")
    assert (reply.ok, reply.value) == (True, 0), reply.error
    snapshot = tmp_path / "snapshot"
    table = (snapshot / "error_analysis.txt").read_text()
    assert "simulator_error" in table and "entire" in table and "single" in table
    mapping = (snapshot / "map_name_to_file.txt").read_text().splitlines()
    assert mapping[0].split()[:2] == ["layer_name", "file_name"] or "layer_name" in mapping[0]
    for side in ("golden", "simulator"):
        texts = sorted((snapshot / side).glob("*.txt"))
        assert texts, side
        for text in texts:
            values = np.genfromtxt(text).ravel()
            array = np.load(snapshot / side / "npy" / (text.stem + ".npy"))
            np.testing.assert_allclose(values, array.ravel(), rtol=1e-4, atol=1e-5)
