"""The host backend without a server: outputs, profiler rows, memory figures, refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from rknn_server.runtime import onnx_graph
from rknn_server.runtime.base import ModelFormatError, RuntimeOptions
from rknn_server.runtime.host import HostBackend
from tests import models


def test_outputs_equal_a_direct_onnx_runtime_run(cnn_model: Path) -> None:
    model = HostBackend(threads=1).open(cnn_model, RuntimeOptions())
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(str(cnn_model)).run(None, {"input": x})[0]
    np.testing.assert_allclose(model.run([x])[0], want, rtol=1e-5, atol=1e-6)
    assert [s.name for s in model.inputs] == ["input"] and model.inputs[0].layout == "NCHW"
    model.close()


def test_perf_debug_rows_come_from_the_profiler(cnn_model: Path) -> None:
    model = HostBackend(threads=1).open(cnn_model, RuntimeOptions(perf_debug=True))
    result = model.perf(None)
    ops = [row.op_type for row in result.layers]
    assert "Conv" in ops and "Gemm" in ops
    assert [row.index for row in result.layers] == list(range(1, len(ops) + 1))
    assert all(row.time_us > 0 and row.target == "CPU" for row in result.layers)
    assert result.total_time_us > 0
    assert not HostBackend(threads=1).open(cnn_model, RuntimeOptions()).perf(None).layers


def test_memory_counts_weights_and_the_peak_of_live_intermediates(cnn_model: Path) -> None:
    result = HostBackend(threads=1).open(cnn_model, RuntimeOptions()).memory()
    weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in onnx.load(str(cnn_model)).graph.initializer)
    assert result.weight_memory == weights
    # conv1 and relu1 (8x16x16 float each) are alive together at the peak, plus conv2's output
    assert result.internal_memory == 3 * 8 * 16 * 16 * 4
    assert result.total_memory == result.weight_memory + result.internal_memory + result.other_memory


def test_liveness_frees_a_tensor_after_its_last_consumer() -> None:
    chain = helper.make_graph(
        [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(4)],
        "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1000])],
        [helper.make_tensor_value_info("t4", TensorProto.FLOAT, [1000])],
    )
    model = helper.make_model(chain)
    tensors = onnx_graph.inferred_tensors(model)
    assert onnx_graph.peak_intermediate_bytes(model, tensors) == 2 * 4000


def test_rknn_and_junk_files_are_refused_with_what_to_do(tmp_path: Path) -> None:
    rknn = tmp_path / "model.rknn"
    rknn.write_bytes(b"RKNN\0\0\0\0")
    with pytest.raises(ModelFormatError, match="--runtime rknnrt"):
        HostBackend().open(rknn, RuntimeOptions())
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x07" * 64)
    with pytest.raises(ModelFormatError, match="not a loadable ONNX model"):
        HostBackend().open(junk, RuntimeOptions())


def test_external_data_loads_from_beside_the_model(tmp_path: Path) -> None:
    path = models.external_data_model(tmp_path)
    model = HostBackend(threads=1).open(path, RuntimeOptions())
    assert model.memory().weight_memory == 4 * 64 * 4
    assert model.run([np.ones((1, 4), dtype=np.float32)])[0].shape == (1, 64)


def test_outputs_written_in_place_are_never_overwritten_while_held(tmp_path: Path) -> None:
    """Static outputs go into the model's pooled buffers: a later run never writes into an output
    the caller still holds, and takes its memory once it is dropped."""
    model = HostBackend(threads=1).open(models.big_identity(tmp_path / "id.onnx", 1 << 19), RuntimeOptions())
    first_input, second_input = (np.full((1, 1 << 19), v, np.float32) for v in (1.0, 2.0))
    first = model.run([first_input])[0]
    second = model.run([second_input])[0]
    np.testing.assert_array_equal(first, first_input)
    np.testing.assert_array_equal(second, second_input)
    where = first.ctypes.data
    del first
    np.testing.assert_array_equal(model.run([second_input])[0], second_input)
    assert model.run([first_input])[0].ctypes.data == where
    model.close()


def test_only_outputs_the_pool_reuses_are_bound_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Binding an output costs more than ONNX Runtime allocating a small one, and the pool hands a
    small one new memory anyway: small static outputs run without an IOBinding, large ones with one."""
    bindings = []
    real = ort.InferenceSession.io_binding

    def counted(session: ort.InferenceSession) -> ort.IOBinding:
        bindings.append(session)
        return real(session)

    monkeypatch.setattr(ort.InferenceSession, "io_binding", counted)
    small = HostBackend(threads=1).open(
        models.identity_of(tmp_path / "small.onnx", "float32", (1, 4)), RuntimeOptions()
    )
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for _ in range(3):
        np.testing.assert_array_equal(small.run([x])[0], x)
    assert bindings == []
    large = HostBackend(threads=1).open(
        models.big_identity(tmp_path / "large.onnx", 1 << 19), RuntimeOptions()
    )
    y = np.ones((1, 1 << 19), np.float32)
    np.testing.assert_array_equal(large.run([y])[0], y)
    assert len(bindings) == 1
    small.close()
    large.close()


def test_a_model_whose_declared_output_shape_is_wrong_runs_as_onnx_runtime_answers(tmp_path: Path) -> None:
    """A static output shape the model does not compute: ONNX Runtime refuses the buffer given, and
    the run (and every later one) gets ONNX Runtime's own outputs."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "wrong_declared_shape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    path = tmp_path / "wrong.onnx"
    onnx.save(models.onnx_model(graph), str(path))
    model = HostBackend(threads=1).open(path, RuntimeOptions())
    assert model.outputs[0].shape == (3,)
    x = np.arange(4, dtype=np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(model.run([x, np.array([4])])[0], x)
    model.close()
