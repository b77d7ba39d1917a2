"""Client behaviour on the host runtime: device selection, dtypes, large tensors, multi-file models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from rknn_client import RKNN, connect
from rknn_client.errors import FailedPrecondition, InvalidInput
from rknn_server.testing import DaemonProcess
from tests import models
from tests.conftest import DaemonFactory


@pytest.mark.parametrize("dtype", sorted(models.DTYPES))
def test_every_dtype_travels_bit_exact(host_daemon: DaemonProcess, tmp_path: Path, dtype: str) -> None:
    model = models.identity_of(tmp_path / f"id_{dtype}.onnx", dtype)
    rng = np.random.default_rng(1)
    data = (rng.random((2, 3)) > 0.5) if dtype == "bool" else (rng.random((2, 3)) * 100).astype(dtype)
    with connect(host_daemon.url) as device, device.load(model) as session:
        assert session.inputs[0].dtype == np.dtype(dtype)
        (out,) = session.run([data])
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, data)


@pytest.mark.parametrize(("mib", "rpc"), [(3, "Run"), (5, "Inference")])
def test_small_frames_go_unary_and_large_ones_stream(
    make_daemon: DaemonFactory, tmp_path: Path, mib: int, rpc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RKNN_SHM", "off")  # the wire's own choice (a local client would use shared memory)
    daemon = make_daemon()
    elements = mib * (1 << 20) // 4 + 17  # several chunks, the last one partial
    model = models.big_identity(tmp_path / "big.onnx", elements)
    data = np.random.default_rng(2).standard_normal((1, elements)).astype(np.float32)
    with connect(daemon.url) as device, device.load(model) as session:
        (out,) = session.run([data])
        out[0, 0] = 1.0  # outputs are ordinary, writable arrays on either path
    np.testing.assert_array_equal(out[0, 1:], data[0, 1:])
    events = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    assert [e["outcome"] for e in events if e.get("method") == rpc] == ["OK"]
    other = "Inference" if rpc == "Run" else "Run"
    assert not [e for e in events if e.get("method") == other]


@pytest.mark.parametrize("mib", [3, 5])
def test_outputs_held_by_the_caller_are_never_overwritten(
    make_daemon: DaemonFactory, tmp_path: Path, mib: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outputs are assembled into memory used before (rknn_proto.buffers) on both paths, on both
    sides: a later run writes into none the caller still holds, through any view of it."""
    monkeypatch.setenv("RKNN_SHM", "off")
    daemon = make_daemon()
    elements = mib * (1 << 20) // 4
    model = models.big_identity(tmp_path / "big.onnx", elements)
    frames = [np.full((1, elements), value, np.float32) for value in (1.0, 2.0, 3.0)]
    with connect(daemon.url) as device, device.load(model) as session:
        first = session.run([frames[0]])[0]
        view = first.reshape(-1)[::2]
        del first
        pipelined = list(session.map([[f] for f in frames[1:]]))
        for _ in range(3):
            session.run([frames[1]])  # outputs dropped at once: their memory is used again
        last = session.run([frames[2]])[0]
    assert (view == 1.0).all()
    np.testing.assert_array_equal(pipelined[0][0], frames[1])
    np.testing.assert_array_equal(pipelined[1][0], frames[2])
    np.testing.assert_array_equal(last, frames[2])


def test_int64_and_several_inputs_through_the_compat_class(
    host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    model = models.two_inputs(tmp_path / "two.onnx")
    rknn = RKNN()
    try:
        assert rknn.load_onnx(str(model)) == 0
        assert rknn.init_runtime(device_id=host_daemon.url) == 0
        a = np.arange(4, dtype=np.float64).reshape(1, 4)  # cast to the model's float32, as the toolkit does
        b = np.ones((1, 4), dtype=np.float32)
        y, shape = rknn.inference([a, b]) or []
    finally:
        rknn.release()
    np.testing.assert_allclose(y, a * 2 + b)
    assert shape.dtype == np.int64 and shape.tolist() == [1, 4]


def test_a_bare_2d_ndarray_is_one_input_not_its_rows(host_daemon: DaemonProcess, tmp_path: Path) -> None:
    model = models.big_identity(tmp_path / "row.onnx", 8)
    rknn = RKNN()
    try:
        assert rknn.load_onnx(str(model)) == 0
        assert rknn.init_runtime(device_id=host_daemon.url) == 0
        data = np.arange(8, dtype=np.float32).reshape(1, 8)
        (out,) = rknn.inference(inputs=data) or []
    finally:
        rknn.release()
    np.testing.assert_array_equal(out, data)


def test_external_data_models_upload_as_one_content_address(
    host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    model = models.external_data_model(tmp_path)
    x = np.ones((1, 4), dtype=np.float32)
    reference = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    with connect(host_daemon.url) as device:
        first = device.upload(model)
        assert not first.cached and first.sent_bytes == sum(p.stat().st_size for p in tmp_path.iterdir())
        assert device.upload(model).cached
        with device.load(model) as session:
            np.testing.assert_allclose(session.run([x])[0], reference, rtol=1e-6)
        (tmp_path / "external.weights").write_bytes(b"\0" * (tmp_path / "external.weights").stat().st_size)
        changed = device.upload(model)
    assert changed.digest != first.digest and not changed.cached


def test_mean_and_std_are_baked_into_the_built_model(host_daemon: DaemonProcess, cnn_model: Path) -> None:
    image = np.full((16, 16, 3), 200, dtype=np.uint8)
    results = []
    for mean, std in ((0.0, 1.0), (100.0, 2.0)):
        rknn = RKNN()
        rknn.config(mean_values=[[mean] * 3], std_values=[[std] * 3])
        assert rknn.load_onnx(str(cnn_model)) == 0
        assert rknn.build(do_quantization=False) == 0
        assert rknn.init_runtime(device_id=host_daemon.url) == 0
        results.append(rknn.inference([image]))
        rknn.release()
    session = ort.InferenceSession(str(cnn_model))
    nchw = image.transpose(2, 0, 1)[np.newaxis].astype(np.float32)
    np.testing.assert_allclose(results[0][0], session.run(None, {"input": nchw})[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        results[1][0], session.run(None, {"input": (nchw - 100) / 2})[0], rtol=1e-4, atol=1e-4
    )


def test_target_mismatch_names_both_socs(make_daemon: DaemonFactory, cnn_model: Path, capsys) -> None:
    daemon = make_daemon("--soc", "rk3588")
    rknn = RKNN()
    assert rknn.load_onnx(str(cnn_model)) == 0
    assert rknn.init_runtime(target="rk3566", device_id=daemon.url) == -1
    err = capsys.readouterr().err
    assert "rk3566" in err and "rk3588" in err and "mismatch" in err
    assert rknn.init_runtime(target="rk3588", device_id=daemon.url) == 0
    rknn.release()


def test_idiomatic_api_is_strict_about_dtype_and_shape(host_daemon: DaemonProcess, cnn_model: Path) -> None:
    with connect(host_daemon.url) as device, device.load(cnn_model) as session:
        with pytest.raises(InvalidInput, match="float32"):
            session.run([np.zeros((1, 3, 16, 16), dtype=np.uint8)])
        with pytest.raises(InvalidInput, match=r"\[1, 3, 16, 16\]"):
            session.run([np.zeros((1, 16, 16, 3), dtype=np.float32)])


def test_daemon_target_check_is_enforced_on_the_wire_too(make_daemon: DaemonFactory, cnn_model: Path) -> None:
    daemon = make_daemon("--soc", "rk3576")
    with connect(daemon.url) as device, pytest.raises(FailedPrecondition, match="rk3576"):
        device.load(cnn_model, target="rk3588")


def test_no_target_and_no_device_starts_a_private_daemon_and_stops_it(
    cnn_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RKNN_SERVER", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rknn = RKNN()
    assert rknn.load_onnx(str(cnn_model)) == 0
    assert rknn.init_runtime() == 0
    device = rknn._runtime.device
    assert device is not None and device.endpoint.kind == "private"
    pid = int(device.endpoint.description.split("pid ")[1].split(")")[0])
    assert psutil.pid_exists(pid)
    assert rknn.inference([np.zeros((16, 16, 3), dtype=np.uint8)]) is not None
    rknn.release()
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(pid).status()


def test_rknn_server_env_selects_the_daemon(host_daemon: DaemonProcess, cnn_model: Path, monkeypatch) -> None:
    monkeypatch.setenv("RKNN_SERVER", host_daemon.url)
    rknn = RKNN()
    assert rknn.load_onnx(str(cnn_model)) == 0
    assert rknn.init_runtime() == 0
    assert rknn._runtime.device is not None and rknn._runtime.device.endpoint.kind == "tcp"
    rknn.release()


def test_export_rknn_before_build_refuses_with_a_reason(capsys, tmp_path: Path) -> None:
    assert RKNN().export_rknn(str(tmp_path / "x.rknn")) == -1
    assert "load_onnx() and build() first" in capsys.readouterr().err
    assert not (tmp_path / "x.rknn").exists()


def test_load_rknn_on_the_host_runtime_says_what_to_do(
    host_daemon: DaemonProcess, tmp_path: Path, capsys
) -> None:
    model = tmp_path / "model.rknn"
    model.write_bytes(b"RKNN" + os.urandom(64))
    rknn = RKNN()
    assert rknn.load_rknn(str(model)) == 0
    assert rknn.init_runtime(target=None, device_id=host_daemon.url) == -1
    err = capsys.readouterr().err
    assert "real RKNN model" in err and "host runtime cannot run RKNN models" in err and "load_onnx" in err
