"""One loaded model per file, shared by every session of it (host.ModelShelf): in-process, on the real
ONNX Runtime. The daemon-level figure (RSS per extra session) is tests/reliability/test_memory.py's."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

from rknn_server.runtime.base import OverBudget, RuntimeOptions
from rknn_server.runtime.host import HostBackend
from tests.models import save_graph, shape_input_bomb, small_cnn


def _shared(runtime: object) -> object:
    return runtime._model  # type: ignore[attr-defined]


def test_sessions_of_one_file_share_its_loaded_model_and_the_last_close_frees_it(tmp_path: Path) -> None:
    backend = HostBackend(threads=1)
    model = small_cnn(tmp_path / "cnn.onnx")
    first, second = backend.open(model, RuntimeOptions()), backend.open(model, RuntimeOptions())
    other = backend.open(small_cnn(tmp_path / "other.onnx", seed=1), RuntimeOptions())
    assert _shared(first) is _shared(second)
    assert _shared(other) is not _shared(first)
    first.close()
    x = np.full((1, 3, 16, 16), 0.5, np.float32)
    assert second.run([x])[0].shape == tuple(second.outputs[0].shape)  # still loaded for the other session
    second.close()
    gc.collect()
    third = backend.open(model, RuntimeOptions())
    assert len(backend._shelf._models) == 2  # type: ignore[attr-defined]  # cnn (loaded again) and other
    third.close()
    other.close()
    gc.collect()
    assert len(backend._shelf._models) == 0  # type: ignore[attr-defined]


def test_each_session_keeps_its_own_options_over_the_shared_model(tmp_path: Path) -> None:
    backend = HostBackend(threads=1)
    model = small_cnn(tmp_path / "cnn.onnx")
    profiled = backend.open(model, RuntimeOptions(perf_debug=True))
    plain = backend.open(model, RuntimeOptions())
    assert _shared(profiled) is _shared(plain)
    assert profiled.perf(None).layers
    assert not plain.perf(None).layers
    profiled.close()
    plain.close()


def test_each_open_checks_its_own_session_budget_against_the_shared_model(tmp_path: Path) -> None:
    backend = HostBackend(threads=1)
    model = small_cnn(tmp_path / "cnn.onnx")
    roomy = backend.open(model, RuntimeOptions())
    with pytest.raises(OverBudget, match="max_session_memory=1000"):
        backend.open(model, RuntimeOptions(max_memory_bytes=1000))
    roomy.close()


def test_sessions_of_one_model_run_at_once_each_with_its_own_inputs(tmp_path: Path) -> None:
    """Concurrent runs over one InferenceSession: every answer is its own input's."""
    backend = HostBackend(threads=1)
    model = small_cnn(tmp_path / "cnn.onnx")
    sessions = [backend.open(model, RuntimeOptions()) for _ in range(4)]
    values = [-1.0, 0.25, 0.5, 2.0]
    want = [sessions[0].run([np.full((1, 3, 16, 16), v, np.float32)])[0].copy() for v in values]
    wrong: list[str] = []

    def work(index: int) -> None:
        x = np.full((1, 3, 16, 16), values[index], np.float32)
        for _ in range(50):
            if not np.array_equal(sessions[index].run([x])[0], want[index]):
                wrong.append(f"session {index}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong
    for session in sessions:
        session.close()


def test_opens_of_one_file_at_once_load_it_once(tmp_path: Path) -> None:
    backend = HostBackend(threads=1)
    model = small_cnn(tmp_path / "cnn.onnx")
    opened: list[object] = []
    barrier = threading.Barrier(4)

    def open_one() -> None:
        barrier.wait()
        opened.append(backend.open(model, RuntimeOptions()))

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(_shared(r)) for r in opened}) == 1
    assert not backend._shelf._loading  # type: ignore[attr-defined]  # no lock left behind
    for runtime in opened:
        runtime.close()  # type: ignore[attr-defined]


def test_only_models_whose_runs_allocate_the_same_every_time_keep_an_arena(tmp_path: Path) -> None:
    """An arena keeps a run's peak for the model's life: a run whose size the caller's input decides
    (a shape computed from the data, a dynamic axis) must give its memory back."""
    backend = HostBackend(threads=1)
    dynamic = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        "dynamic",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])],
    )
    cases = {
        "static": (small_cnn(tmp_path / "cnn.onnx"), "1"),
        "shape from the data": (shape_input_bomb(tmp_path / "bomb.onnx"), "0"),
        "dynamic axis": (save_graph(dynamic, tmp_path / "dynamic.onnx"), "0"),
    }
    for what, (path, arena) in cases.items():
        runtime = backend.open(path, RuntimeOptions())
        options = _shared(runtime).session.get_session_options()  # type: ignore[attr-defined]
        assert str(int(options.enable_cpu_mem_arena)) == arena, what
        runtime.close()


def test_a_loaded_model_holds_its_weights_once_and_a_dump_reads_them_again(tmp_path: Path) -> None:
    """ONNX Runtime holds the weights; the parsed ONNX graph (a second copy of every weight) is not
    kept past the load, and a dump, which needs the graph, reads it from the file."""
    backend = HostBackend(threads=1)
    model = small_cnn(tmp_path / "cnn.onnx")
    runtime = backend.open(model, RuntimeOptions())
    held = [name for name, value in vars(_shared(runtime)).items() if isinstance(value, onnx.ModelProto)]
    assert held == []
    x = np.full((1, 3, 16, 16), 0.5, np.float32)
    layers = {layer.tensor_name: layer.array for layer in runtime.dump_layers([x])}  # type: ignore[attr-defined]
    np.testing.assert_allclose(layers["logits"], runtime.run([x])[0], rtol=1e-5, atol=1e-6)  # type: ignore[attr-defined]
    weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in onnx.load(str(model)).graph.initializer)
    assert runtime.memory().weight_memory == weights  # type: ignore[attr-defined]
    runtime.close()  # type: ignore[attr-defined]
