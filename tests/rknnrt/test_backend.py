"""The rknnrt backend against the stand-in librknnrt / librknnmrt built from tests/rknnrt/stub."""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from rknn_proto.messages import QuantType, dequantize
from rknn_server.board.platform import PlatformInfo, probe_platform
from rknn_server.runtime.base import (
    ExecutionError,
    InputError,
    InputFormat,
    ModelFormatError,
    RuntimeOptions,
    UnsupportedError,
)
from rknn_server.runtime.rknnrt.backend import RknnrtBackend
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt.stub_build import StubTensor, build_plugin, write_stub_model

RK3588 = PlatformInfo(soc="rk3588", driver_version="0.9.8")
QUANT_OUT = StubTensor("out0", type="INT8", fmt="NCHW", dims=(1, 3, 2, 2), zp=-3, scale=0.5)


@pytest.fixture
def backend(stub_lib: Path) -> RknnrtBackend:
    return RknnrtBackend(stub_lib, RK3588, None)


def test_version_and_capabilities(backend: RknnrtBackend) -> None:
    assert backend.version().api == "librknnrt 2.3.2 (stub0000@2025-04-09T09:08:16)"
    assert backend.version().driver == "0.9.8"
    assert backend.capabilities.perf_per_layer and backend.capabilities.core_mask
    assert backend.soc() == "rk3588"


def test_specs_queries_and_float_run(backend: RknnrtBackend, tmp_path: Path) -> None:
    path = write_stub_model(tmp_path / "m.rknn", custom_string="hello board")
    model = backend.open(path, RuntimeOptions())
    try:
        (spec,) = model.inputs
        assert (spec.name, spec.shape, spec.dtype, spec.layout) == ("in0", (1, 2, 2, 3), np.float32, "NHWC")
        assert model.custom_string() == "hello board"
        version = model.sdk_version()
        assert version is not None and version.api.startswith("2.3.2")
        assert model.native_inputs()[0].shape == (1, 2, 2, 3)
        x = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
        (y,) = model.run([x])
        np.testing.assert_array_equal(y, 2 * x + 1)
        assert y.dtype == np.float32
    finally:
        model.close()
    model.close()


def test_nchw_input_and_quantized_output(backend: RknnrtBackend, tmp_path: Path) -> None:
    path = write_stub_model(tmp_path / "q.rknn", outputs=[QUANT_OUT], a=1.3, b=0.0)
    model = backend.open(path, RuntimeOptions())
    try:
        out = model.outputs[0]
        assert out.quant_type is QuantType.AFFINE_ASYMMETRIC and (out.zero_point, out.scale) == (-3, 0.5)
        # The runtime takes 4-D inputs in either layout (it is told which), so the intake need not
        # transpose them: see tests/unit/server/core/test_frames.py.
        assert model.inputs[0].convertible_layouts == ("NCHW", "NHWC") and out.convertible_layouts == ()
        x_nchw = np.linspace(-50, 60, 12, dtype=np.float32).reshape(1, 3, 2, 2)
        (q,) = model.run([x_nchw], [InputFormat(layout="NCHW")])
        assert q.dtype == np.int8 and q.shape == (1, 3, 2, 2), (
            "affine int8 outputs come as stored (want_float=0)"
        )
        y = dequantize(q, out)
        nhwc = x_nchw.transpose(0, 2, 3, 1).reshape(-1) * np.float32(1.3)
        expected = (np.clip(np.round(nhwc / 0.5) - 3, -128, 127) + 3) * 0.5
        np.testing.assert_allclose(y.reshape(-1), expected, rtol=0, atol=1e-6)
        np.testing.assert_array_max_ulp(y, runtime_float_output(model), maxulp=1)
    finally:
        model.close()


def runtime_float_output(model: object) -> np.ndarray:
    """The runtime's own float conversion (want_float=1) of the last frame's output 0, fetched
    through the context the model holds, to compare the daemon/client dequantization with it."""
    import ctypes

    from rknn_server.runtime.rknnrt import abi

    lib, ctx = model._lib, model._ctx  # type: ignore[attr-defined]
    outputs = (abi.NATIVE.output * 1)()
    outputs[0].index, outputs[0].want_float = 0, 1
    assert lib.rknn_outputs_get(ctx, 1, outputs, None) == 0
    try:
        values = np.frombuffer(ctypes.string_at(outputs[0].buf, outputs[0].size), dtype=np.float32).copy()
    finally:
        lib.rknn_outputs_release(ctx, 1, outputs)
    return values.reshape(1, 3, 2, 2)


def test_uint8_float16_and_pass_through_inputs(backend: RknnrtBackend, tmp_path: Path) -> None:
    quant_in = StubTensor("in0", type="INT8", zp=10, scale=0.25)
    path = write_stub_model(tmp_path / "p.rknn", inputs=[quant_in], a=1.0, b=0.0)
    model = backend.open(path, RuntimeOptions())
    try:
        raw = np.array([-128, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 127], dtype=np.int8).reshape(1, 2, 2, 3)
        (y,) = model.run([raw], [InputFormat(pass_through=True)])
        np.testing.assert_allclose(y, (raw.astype(np.float32) - 10) * 0.25)
        real = np.full((1, 2, 2, 3), 1.1, dtype=np.float16)
        (y16,) = model.run([real])
        np.testing.assert_allclose(y16, np.full((1, 2, 2, 3), 1.0), atol=1e-6)  # quantized to the 0.25 grid
        (y8,) = model.run([np.full((1, 2, 2, 3), 3, dtype=np.uint8)])
        np.testing.assert_allclose(y8, 3.0)
    finally:
        model.close()


def test_dynamic_shapes(backend: RknnrtBackend, tmp_path: Path) -> None:
    path = write_stub_model(tmp_path / "d.rknn", dynamic=[(1, 2, 2, 3), (1, 4, 4, 3)])
    model = backend.open(path, RuntimeOptions())
    try:
        assert model.inputs[0].shape == (1, -1, -1, 3) and model.inputs[0].is_dynamic
        small = np.ones((1, 2, 2, 3), dtype=np.float32)
        big = np.ones((1, 4, 4, 3), dtype=np.float32)
        assert model.run([small])[0].shape == (1, 2, 2, 3)
        assert model.run([big])[0].shape == (1, 4, 4, 3)
        assert model.run([small])[0].shape == (1, 2, 2, 3)
        with pytest.raises(InputError, match="not among the model's shapes"):
            model.run([np.ones((1, 3, 3, 3), dtype=np.float32)])
    finally:
        model.close()


@pytest.mark.parametrize(
    ("soc", "mask", "message"),
    [
        ("rk3576", 0x4, "rk3576 lacks"),
        ("rk3576", 0x7, "rk3576 lacks"),
        ("rk3566", 0x1, "only supported on rk3588"),
    ],
)
def test_core_mask_refused(stub_lib: Path, tmp_path: Path, soc: str, mask: int, message: str) -> None:
    backend = RknnrtBackend(stub_lib, PlatformInfo(soc=soc), None)
    with pytest.raises(UnsupportedError, match=message):
        backend.open(write_stub_model(tmp_path / "m.rknn"), RuntimeOptions(core_mask=mask))


def test_core_mask_reaches_runtime_and_perf_detail(backend: RknnrtBackend, tmp_path: Path) -> None:
    path = write_stub_model(tmp_path / "m.rknn", outputs=[QUANT_OUT])
    model = backend.open(path, RuntimeOptions(perf_debug=True, core_mask=0x3))
    try:
        result = model.perf(None)
    finally:
        model.close()
    assert [layer.op_type for layer in result.layers] == ["InputOperator", "ConvRelu", "OutputOperator"]
    conv = result.layers[1]
    assert (conv.index, conv.data_type, conv.target, conv.name) == (2, "INT8", "NPU", "Conv:out0_conv")
    assert conv.input_shapes == ("(1,2,2,3)", "(1,1,1,1)", "(1)") and conv.output_shape == "(1,3,2,2)"
    assert conv.time_us == 20.0
    assert conv.extra["WorkLoad(0/1/2)--ImproveTherical"].startswith("50.0%/50.0%/0.0%")
    assert "DDRCycles" in result.extra_columns and "Time(us)" not in result.extra_columns
    assert result.total_time_us == 60.0 and result.total_operator_time_us == 60.0
    assert result.total_rw_kb == 1.5
    assert "Operator Time Consuming Ranking Table" in result.raw_text


def test_perf_without_perf_debug_has_total_only(backend: RknnrtBackend, tmp_path: Path) -> None:
    model = backend.open(write_stub_model(tmp_path / "m.rknn"), RuntimeOptions())
    try:
        result = model.perf([np.zeros((1, 2, 2, 3), dtype=np.float32)])
    finally:
        model.close()
    assert result.layers == () and result.total_time_us == 60.0


def test_memory(backend: RknnrtBackend, tmp_path: Path) -> None:
    path = write_stub_model(tmp_path / "m.rknn", weight=3000, internal=1000, dma=5000)
    model = backend.open(path, RuntimeOptions(eval_mem=True))
    try:
        memory = model.memory()
    finally:
        model.close()
    assert (memory.weight_memory, memory.internal_memory, memory.other_memory) == (3000, 1000, 1000)
    assert memory.model_size == path.stat().st_size
    assert "sram total 4096" in memory.method


def test_bad_model_file(backend: RknnrtBackend, tmp_path: Path) -> None:
    bad = tmp_path / "bad.rknn"
    bad.write_text("not a model\n")
    with pytest.raises(ModelFormatError, match="RKNN_ERR_MODEL_INVALID"):
        backend.open(bad, RuntimeOptions())


def test_plugins_registered_and_untrusted_ones_skipped(
    stub_lib: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    build_plugin(plugin_dir, "librkcst_myop.so", "MyOp")
    build_plugin(plugin_dir, "librkcst_noentry.so", "Unused", with_entry=False)
    open_to_all = build_plugin(plugin_dir, "librkcst_writable.so", "Writable")
    open_to_all.chmod(0o777)
    build_plugin(plugin_dir, "libother.so", "Other")
    foreign = build_plugin(plugin_dir, "librkcst_foreign.so", "Foreign")
    if os.geteuid() == 0:
        os.chown(foreign, 54321, -1)  # owned by neither root nor us
    (plugin_dir / "librkcst_garbage.so").write_text("not an ELF file")
    model_mine = write_stub_model(tmp_path / "mine.rknn", requires_op="MyOp")
    x = np.ones((1, 2, 2, 3), dtype=np.float32)

    backend = RknnrtBackend(stub_lib, RK3588, plugin_dir)
    model = backend.open(model_mine, RuntimeOptions())
    try:
        np.testing.assert_array_equal(model.run([x])[0], 3 * x)
    finally:
        model.close()
    for refused in ("Writable", "Foreign"):
        model = backend.open(
            write_stub_model(tmp_path / f"{refused}.rknn", requires_op=refused), RuntimeOptions()
        )
        try:
            with pytest.raises(ExecutionError, match="RKNN_ERR_MODEL_INVALID"):
                model.run([x])
        finally:
            model.close()
    assert "writable by everyone" in caplog.text and "librkcst_noentry.so" in caplog.text
    if os.geteuid() == 0:
        assert "owned by uid 54321" in caplog.text
    without = RknnrtBackend(stub_lib, RK3588, tmp_path / "missing")
    model = without.open(model_mine, RuntimeOptions())
    try:
        with pytest.raises(ExecutionError, match="RKNN_ERR_MODEL_INVALID"):
            model.run([x])
    finally:
        model.close()


def test_layer_dumps_in_private_directory(backend: RknnrtBackend, tmp_path: Path) -> None:
    path = write_stub_model(
        tmp_path / "m.rknn",
        inputs=[StubTensor("in0"), StubTensor("in1", dims=(1, 4))],
        outputs=[StubTensor("out0"), StubTensor("out1", fmt="UNDEFINED", dims=(1, 4))],
    )
    model = backend.open(path, RuntimeOptions())
    a = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
    b = np.array([[1, 2, 3, 4]], dtype=np.float32)
    try:
        layers = list(model.dump_layers([a, b]))
        assert os.environ.get("RKNN_LOG_LEVEL") is None
        assert len(model.run([a, b])) == 2
    finally:
        model.close()
    assert [(t.index, t.op_type, t.tensor_name) for t in layers] == [
        (0, "InputOperator", "in0"),
        (1, "InputOperator", "in1"),
        (2, "Conv", "out0_conv"),
        (3, "Conv", "out1_conv"),
    ]
    np.testing.assert_array_equal(layers[0].array, a)
    np.testing.assert_array_equal(layers[3].array, 2 * b + 1)


def test_layer_dump_temp_dirs_are_removed(
    backend: RknnrtBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    model = backend.open(write_stub_model(tmp_path / "m.rknn"), RuntimeOptions())
    try:
        dumps = model.dump_layers([np.ones((1, 2, 2, 3), dtype=np.float32)])
        first = next(dumps)
        assert first.op_type == "InputOperator" and len(list(scratch.iterdir())) == 1
        dumps.close()  # type: ignore[attr-defined]
    finally:
        model.close()
    assert list(scratch.iterdir()) == []


def test_mrt_zero_copy_path(stub_mrt_lib: Path, tmp_path: Path) -> None:
    backend = RknnrtBackend(stub_mrt_lib, PlatformInfo(soc="rv1106"), None)
    assert backend.version().api.startswith("librknnmrt 2.3.2")
    assert not backend.capabilities.perf_per_layer and not backend.capabilities.core_mask
    quant_in = StubTensor("in0", type="INT8", zp=0, scale=0.5)
    path = write_stub_model(tmp_path / "m.rknn", inputs=[quant_in], outputs=[QUANT_OUT], a=1.0, b=0.0)
    model = backend.open(path, RuntimeOptions(perf_debug=True))
    try:
        x = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
        (y,) = model.run([x])
        expected = (np.clip(np.round(x.reshape(-1) / 0.5) - 3, -128, 127) + 3) * 0.5
        np.testing.assert_allclose(y.reshape(-1), expected)
        (y2,) = model.run([x.transpose(0, 3, 1, 2)], [InputFormat(layout="NCHW")])
        np.testing.assert_array_equal(y, y2)
        result = model.perf(None)
        assert result.layers == () and result.total_time_us > 0
        assert "librknnmrt" in result.raw_text and "wall-clock" in result.raw_text
        assert model.memory().weight_memory == 1024
        layers = list(model.dump_layers([x]))
        assert [layer.op_type for layer in layers] == ["InputOperator", "Conv"]
        np.testing.assert_array_equal(layers[0].array, x)  # 0.5 steps survive int8 quantization
        with pytest.raises(UnsupportedError):
            backend.open(path, RuntimeOptions(core_mask=1))
    finally:
        model.close()


def test_failed_dump_run_reports_the_runtime_error(backend: RknnrtBackend, tmp_path: Path) -> None:
    model = backend.open(write_stub_model(tmp_path / "m.rknn"), RuntimeOptions())
    try:
        with pytest.raises(ExecutionError, match="RKNN_ERR_INPUT_INVALID"):
            list(model.dump_layers([np.ones((1, 2), dtype=np.float32)]))
        with pytest.raises(InputError, match="input formats"):
            model.run([np.ones((1, 2, 2, 3), dtype=np.float32)], [])
    finally:
        model.close()


def test_backend_on_probed_board_uses_default_plugin_dir(stub_lib: Path, tmp_path: Path) -> None:
    root = rk3588_board(tmp_path / "board")
    plugin_dir = root / "usr/lib/rknpu/op_plugins"
    plugin_dir.mkdir(parents=True)
    build_plugin(plugin_dir, "librkcst_myop.so", "MyOp")
    backend = RknnrtBackend(stub_lib, probe_platform(root), None)
    assert backend.soc() == "rk3588" and backend.version().driver == "0.9.8"
    assert [reading.kind for reading in backend.frequencies()] == ["CPU", "NPU", "DDR"]
    model = backend.open(write_stub_model(tmp_path / "m.rknn", requires_op="MyOp"), RuntimeOptions())
    try:
        assert model.run([np.zeros((1, 2, 2, 3), dtype=np.float32)])[0].max() == 1.0
    finally:
        model.close()


def test_plugins_ignored_where_runtime_cannot_register(
    stub_mrt_lib: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    build_plugin(tmp_path, "librkcst_myop.so", "MyOp")
    backend = RknnrtBackend(stub_mrt_lib, PlatformInfo(soc="rv1106"), tmp_path)
    model = backend.open(write_stub_model(tmp_path / "m.rknn"), RuntimeOptions())
    try:
        assert model.run([np.zeros((1, 2, 2, 3), dtype=np.float32)])[0].max() == 1.0
    finally:
        model.close()
    assert "cannot register custom operators" in caplog.text


def _resident(backend: RknnrtBackend) -> int:
    """The stand-in's count of weight bytes held for loaded models (each model's once)."""
    count = backend.library.cdll.rknn_stub_resident_weight
    count.restype = ctypes.c_uint64
    return int(count())


@pytest.mark.parametrize("lib", ["stub_lib", "stub_mrt_lib"])
def test_sessions_of_one_model_share_its_weights_through_duplicated_contexts(
    lib: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """rknn_dup_context: eight callers of one model hold its weights once on the NPU; sessions with
    other init flags (perf_debug) load their own; each context keeps its own inputs and outputs."""
    backend = RknnrtBackend(request.getfixturevalue(lib), RK3588, None)
    path = write_stub_model(tmp_path / "m.rknn", weight=1 << 20)
    before = _resident(backend)
    sessions = [backend.open(path, RuntimeOptions()) for _ in range(3)]
    assert _resident(backend) - before == 1 << 20
    shape = sessions[0].inputs[0].shape
    for value, session in enumerate(sessions):
        (y,) = session.run([np.full(shape, value, np.float32)])
        np.testing.assert_array_equal(y, np.full(shape, 2 * value + 1, np.float32))
    if lib == "stub_lib":  # the general API's perf flag: a context of its own
        profiled = backend.open(path, RuntimeOptions(perf_debug=True))
        assert _resident(backend) - before == 2 << 20
        profiled.close()
    sessions[0].close()  # the first, duplicated from: the others go on with the weights
    assert _resident(backend) - before == 1 << 20
    (y,) = sessions[1].run([np.ones(shape, np.float32)])
    np.testing.assert_array_equal(y, np.full(shape, 3, np.float32))
    another = backend.open(path, RuntimeOptions())  # duplicated from a session still open
    assert _resident(backend) - before == 1 << 20
    for session in [*sessions[1:], another]:
        session.close()
    assert _resident(backend) == before
