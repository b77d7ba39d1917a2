"""DumpLayers through a real daemon: hundreds of MiB of layers stream with the daemon's memory bounded."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from rknn_client import connect
from rknn_client.errors import RknnError
from rknn_server.testing import DaemonProcess
from tests import models
from tests.conftest import DaemonFactory

SHAPE = (1, 16, 256, 256)  # 4 MiB of float32 per layer
NODES = 140  # 560 MiB of intermediate tensors in all
MIB = 1 << 20


def chain_model(path: Path) -> Path:
    """x -> Add -> Mul -> Add ... : NODES layers of SHAPE each; layer i holds (x + ...) * ... exactly."""
    nodes, x = [], "input"
    for i in range(NODES):
        nodes.append(helper.make_node("Add" if i % 2 == 0 else "Mul", [x, "k"], [f"t{i}"], name=f"n{i}"))
        x = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(SHAPE))],
        [numpy_helper.from_array(np.float32(1.0), "k")],
    )
    return models.save_graph(graph, path)


class PeakRss:
    """Samples a process's resident memory in a background thread until stopped."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.idle = self._process.memory_info().rss
        self.peak = self.idle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_dumps_over_512_mib_stream_with_bounded_daemon_memory(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    model = chain_model(tmp_path / "chain.onnx")
    daemon = make_daemon()
    rss = PeakRss(daemon.pid)
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) % 251
    seen, total = [], 0
    try:
        with connect(daemon.url) as device, device.load(model) as session:
            for layer in session.dump_layers([x]):
                seen.append((layer.index, layer.op_type, layer.tensor_name))
                total += layer.array.nbytes
                step = 0 if layer.op_type == "InputOperator" else int(layer.tensor_name[1:]) // 2 + 1
                assert layer.array.shape == SHAPE and layer.array[0, 0, 0, 5] == 5 + step
    finally:
        rss.stop()
    growth = rss.peak - rss.idle
    print(
        f"\nstreamed {total / MIB:.0f} MiB in {len(seen)} layers; daemon RSS idle {rss.idle / MIB:.0f} MiB, "
        f"peak {rss.peak / MIB:.0f} MiB (+{growth / MIB:.0f} MiB)"
    )
    assert total > 512 * MIB
    assert seen == [(0, "InputOperator", "input")] + [
        (i + 1, "Add" if i % 2 == 0 else "Mul", f"t{i}") for i in range(NODES)
    ]
    assert growth < 128 * MIB


def test_dump_errors_come_back_as_the_daemon_said(host_daemon: DaemonProcess, cnn_model: Path) -> None:
    with connect(host_daemon.url) as device, device.load(cnn_model) as session:
        assert device.info().capabilities["layer_dumps"]
        wrong = np.zeros((1, 3, 8, 8), np.float32)
        with pytest.raises(
            RknnError, match=r"input 0 \(input\) has shape \[1, 3, 8, 8\].*INVALID_ARGUMENT from DumpLayers"
        ):
            list(session.dump_layers([wrong], layouts=["NCHW"]))
        layers = session.dump_layers([np.zeros((1, 3, 16, 16), np.float32)])
        assert next(layers).tensor_name == "input"
        layers.close()  # stopping early cancels the stream; the session stays usable
        assert [layer.tensor_name for layer in session.dump_layers([np.ones((1, 3, 16, 16), np.float32)])][
            -1
        ] == ("logits")
    logged = [json.loads(line) for line in host_daemon.log_text().splitlines() if line.startswith("{")]
    assert any(event.get("method") == "DumpLayers" for event in logged)


def test_worker_process_sessions_dump_and_survive_an_early_stop(
    make_daemon: DaemonFactory, cnn_model: Path
) -> None:
    daemon = make_daemon("--isolation", "process")
    x = np.ones((1, 3, 16, 16), np.float32)
    with connect(daemon.url) as device, device.load(cnn_model) as session:
        full = {layer.tensor_name: layer.array for layer in session.dump_layers([x])}
        layers = session.dump_layers([x])
        next(layers)
        layers.close()
        (logits,) = session.run([x])
    assert list(full) == ["input", "c1", "r1", "c2", "a1", "gap", "flat", "logits"]
    np.testing.assert_allclose(full["logits"], logits, rtol=1e-5, atol=1e-5)


def dynamic_relu(path: Path) -> Path:
    """y = Relu(x) * 2 with a dynamic batch dimension."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"])],
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.float32(2), "two")],
    )
    return models.save_graph(graph, path)


def test_dumps_of_multi_input_external_weight_and_dynamic_models(
    make_daemon: DaemonFactory, tmp_path: Path
) -> None:
    """On a daemon of its own: other tests count on the shared one not having these models cached."""
    a, b = np.array([[1, -2, 3, -4]], np.float32), np.ones((1, 4), np.float32)
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 6
    w = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    with connect(make_daemon().url) as device:
        with device.load(models.two_inputs(tmp_path / "two.onnx")) as session:
            two = [(layer.op_type, layer.tensor_name, layer.array) for layer in session.dump_layers([a, b])]
        with device.load(models.external_data_model(tmp_path)) as session:
            external = {layer.tensor_name: layer.array for layer in session.dump_layers([w])}
            (expected,) = session.run([w])
        with device.load(dynamic_relu(tmp_path / "dynamic.onnx")) as session:
            dynamic = {layer.tensor_name: layer.array for layer in session.dump_layers([x])}

    assert [(op, name) for op, name, _ in two] == [
        ("InputOperator", "a"),
        ("InputOperator", "b"),
        ("Mul", "m"),
        ("Add", "y"),
        ("Shape", "shape"),
    ]
    np.testing.assert_array_equal(two[3][2], a * 2 + b)
    assert two[4][2].dtype == np.int64 and two[4][2].tolist() == [1, 4]
    np.testing.assert_allclose(external["y"], expected, rtol=1e-5)
    np.testing.assert_array_equal(dynamic["y"], np.maximum(x, 0) * 2)
    assert dynamic["r"].shape == (3, 4)
