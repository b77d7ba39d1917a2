"""The rest of the toolkit's conversion API through the bridge: custom ops, hybrid quantization, codegen."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rknn_client.toolkit import Toolkit
from tests.models import onnx_model
from tests.toolkit.conftest import start


class cstSoftmax:
    """A custom op as toolkit scripts write one: its source crosses to the worker."""

    op_type = "cstSoftmax"

    def shape_infer(self, node, in_shapes, in_dtypes):
        return in_shapes.copy(), in_dtypes.copy()

    def compute(self, node, inputs):
        x = inputs[0]
        axis = get_node_attr(node, "axis")  # noqa: F821 - the toolkit's helper, defined in the worker
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return [e / np.sum(e, axis=axis, keepdims=True)]


def custom_op_model(path: Path) -> Path:
    """Conv -> cstSoftmax(axis=1): an op outside the ONNX spec that only the registered class can run."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("cstSoftmax", ["c"], ["out"], axis=1, domain="rknn.custom"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(onnx_model(graph, helper.make_opsetid("rknn.custom", 1)), str(path))
    return path


def test_a_registered_custom_op_runs_in_the_toolkits_simulator(toolkit: Toolkit, tmp_path: Path) -> None:
    model = custom_op_model(tmp_path / "custom.onnx")
    bridge = start(toolkit)
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        registered = bridge.call("reg_custom_op", cstSoftmax())
        assert (registered.ok, registered.value) == (True, 0), registered.error
        for method, args, kwargs in [
            ("load_onnx", [str(model)], {}),
            ("build", [], {"do_quantization": False}),
            ("export_rknn", [str(tmp_path / "custom.rknn")], {}),
            ("init_runtime", [], {}),
        ]:
            reply = bridge.call(method, *args, **kwargs)
            assert (reply.ok, reply.value) == (True, 0), (method, reply.error)
        x = np.random.default_rng(1).random((1, 3, 8, 8)).astype(np.float32)
        (out,) = bridge.call("inference", inputs=[x], data_format="nchw").value
    finally:
        bridge.close()
    assert (tmp_path / "custom.rknn").read_bytes()[:4] == b"RKNN"
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=2e-3)  # softmax over channels, run by our class


def test_hybrid_quantization_steps_then_export(
    toolkit: Toolkit, classifier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, dataset, _ = classifier
    monkeypatch.chdir(tmp_path)
    bridge = start(toolkit)
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        assert bridge.call("load_onnx", str(model)).value == 0
        step1 = bridge.call("hybrid_quantization_step1", dataset=str(dataset))
        assert (step1.ok, step1.value) == (True, 0), step1.error
        written = {p.name for p in tmp_path.iterdir()}
        assert {"cnn.model", "cnn.data", "cnn.quantization.cfg"} <= written, written
    finally:
        bridge.close()
    bridge = start(toolkit)  # step 2 runs on a fresh RKNN object, as the toolkit requires
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        step2 = bridge.call("hybrid_quantization_step2", "cnn.model", "cnn.data", "cnn.quantization.cfg")
        assert (step2.ok, step2.value) == (True, 0), step2.error
        assert bridge.call("export_rknn", "hybrid.rknn").value == 0
    finally:
        bridge.close()
    assert (tmp_path / "hybrid.rknn").read_bytes()[:4] == b"RKNN"


def test_codegen_writes_the_cpp_demo(toolkit: Toolkit, classifier, tmp_path: Path) -> None:
    model, dataset, _ = classifier
    bridge = start(toolkit)
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        assert bridge.call("load_onnx", str(model)).value == 0
        assert bridge.call("build", do_quantization=True, dataset=str(dataset)).value == 0
        assert bridge.call("export_rknn", str(tmp_path / "cnn.rknn")).value == 0
        reply = bridge.call("codegen", str(tmp_path / "demo"), overwrite=True)
    finally:
        bridge.close()
    assert (reply.ok, reply.value) == (True, 0), reply.error
    assert any(p.suffix in (".cc", ".cpp") for p in (tmp_path / "demo").rglob("*")), list(
        (tmp_path / "demo").rglob("*")
    )


def test_a_method_this_toolkit_version_lacks_is_named(toolkit: Toolkit) -> None:
    bridge = start(toolkit)
    try:
        reply = bridge.call("export_encrypted_rknn_model", "model.rknn")
    finally:
        bridge.close()
    if reply.ok:
        pytest.skip(f"rknn-toolkit2 {toolkit.version} has export_encrypted_rknn_model")
    assert f"rknn-toolkit2 {toolkit.version} has no RKNN.export_encrypted_rknn_model()" in reply.error


TORCHSCRIPT = """
import sys, torch
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
net.eval()
torch.jit.trace(net, torch.zeros(1, 3, 16, 16)).save(sys.argv[1])
"""


def test_load_pytorch_needs_real_torch(toolkit: Toolkit, tmp_path: Path) -> None:
    """With real torch (the default install) a TorchScript model converts; with the stand-in the call
    fails and says why."""
    model = tmp_path / "net.pt"
    if toolkit.torch == "stub":
        model.write_bytes(b"not made: no torch here")
    else:
        subprocess.run([str(toolkit.python), "-I", "-c", TORCHSCRIPT, str(model)], check=True, timeout=300)
    bridge = start(toolkit)
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        loaded = bridge.call("load_pytorch", str(model), input_size_list=[[1, 3, 16, 16]])
        if toolkit.torch == "stub":
            text = loaded.error + "".join(line for _, line in loaded.lines)
            assert (not loaded.ok or loaded.value == -1) and "stand-in for torch" in text, loaded
            return
        assert (loaded.ok, loaded.value) == (True, 0), loaded.error
        assert bridge.call("build", do_quantization=False).value == 0
        assert bridge.call("export_rknn", str(tmp_path / "net.rknn")).value == 0
    finally:
        bridge.close()
    assert (tmp_path / "net.rknn").read_bytes()[:4] == b"RKNN"
