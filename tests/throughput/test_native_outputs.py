"""Quantized outputs on the wire: the host runtime exposes a QDQ model's int8 outputs, the daemon
sends them as int8 (a quarter of the bytes) and the client's dequantization gives exactly the
float path's values."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from rknn_client import connect
from rknn_server.runtime.qdq_outputs import expose_quantized_outputs, has_quantized_outputs
from tests import models as base_models
from tests.conftest import DaemonFactory


def direct(model, image: np.ndarray) -> list[np.ndarray]:
    """The QDQ model as ONNX Runtime runs it, unmodified: float32 after DequantizeLinear."""
    return list(
        ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"images": image})
    )


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_native_and_float_paths_equal_onnx_runtime_bit_for_bit(
    host_daemon, qdq_detector, images, monkeypatch
):
    want = direct(qdq_detector, images[0])
    with connect(host_daemon.url) as device:
        with device.load(qdq_detector) as native, device.load(qdq_detector, native_outputs=False) as floats:
            assert native.native_outputs and not floats.native_outputs
            for session in (native, floats):
                got = session.run([images[0]])
                assert all(bits_equal(g, w) for g, w in zip(got, want, strict=True))
                mapped = next(session.map([[images[0]]]))
                assert all(bits_equal(g, w) for g, w in zip(mapped, want, strict=True))
        monkeypatch.setenv("RKNN_NATIVE_OUTPUTS", "0")
        with device.load(qdq_detector) as session:
            assert not session.native_outputs


def test_output_attrs_report_the_quantization(host_daemon, qdq_detector):
    graph = onnx.load(str(qdq_detector)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    with connect(host_daemon.url) as device, device.load(qdq_detector) as session:
        outputs = session.outputs
    assert [o.name for o in outputs] == ["out3", "out4", "out5"]
    for info in outputs:
        head = f"head{info.name[-1]}_out"
        assert info.dtype == np.int8 and info.quant_type == "affine"
        assert info.zero_point == int(inits[f"{head}_zero_point"])
        assert np.float32(info.scale) == inits[f"{head}_scale"]


def test_native_outputs_send_a_quarter_of_the_bytes(
    make_daemon: DaemonFactory, qdq_detector, images, monkeypatch
):
    monkeypatch.setenv("RKNN_SHM", "off")  # bytes on the wire (shared memory sends none)
    daemon = make_daemon()
    with (
        connect(daemon.url) as device,
        device.load(qdq_detector) as native,
        device.load(qdq_detector, native_outputs=False) as floats,
    ):
        elements = sum(int(np.prod(o.shape)) for o in native.outputs)
        native.run([images[0]])
        floats.run([images[0]])
    daemon.stop()
    events = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    sent = [e["bytes_out"] for e in events if e.get("method") in ("Run", "Inference")]
    assert sent == [elements, 4 * elements]


def test_float_models_and_inner_dequantizers_are_left_alone(tmp_path, qdq_detector):
    plain = onnx.load(str(base_models.small_cnn(tmp_path / "cnn.onnx")))
    assert not has_quantized_outputs(plain)  # so a load runs the file itself, never a copy of it
    assert expose_quantized_outputs(plain) == {}
    qdq = onnx.load(str(qdq_detector))
    assert has_quantized_outputs(qdq)
    # An output that another node also reads cannot change type.
    qdq.graph.node.append(onnx.helper.make_node("Identity", ["out3"], ["copy"]))
    exposed = expose_quantized_outputs(qdq)
    assert sorted(exposed) == ["out4", "out5"]
    assert {o.name: o.type.tensor_type.elem_type for o in qdq.graph.output} == {
        "out3": onnx.TensorProto.FLOAT,
        "out4": onnx.TensorProto.INT8,
        "out5": onnx.TensorProto.INT8,
    }
