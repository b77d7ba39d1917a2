"""The RKNN class wired to the real RKNN-Toolkit2: the official examples' call patterns (resnet50v2 style,
accuracy_analysis) with only the import line changed run in the toolkit through the bridge, and
init_runtime(target=...) uploads the `.rknn` Rockchip's compiler made to the board's daemon."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from rknn_client import RKNN
from rknn_client.compat.toolkit_route import ENV_TOOLKIT
from rknn_client.toolkit import Toolkit
from rknn_client.toolkit.locate import ENV_PYTHON
from rknn_proto import model_container
from rknn_server.testing import DaemonProcess
from tests import models
from tests.compat.test_exec import SCRIPT, VENV_BIN
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt_cases import start_rknnrt_daemon
from tests.toolkit.conftest import SIZE

MEAN = [123.675, 116.28, 103.53]
STD = [58.395, 58.395, 58.395]
INSTALL = "rknn-client toolkit install"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    """A dataset.txt of NCHW .npy calibration images (0..255) and a few NHWC uint8 test images."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(3)
    names = []
    for i in range(4):
        np.save(folder / f"cal{i}.npy", rng.integers(0, 256, (1, 3, SIZE, SIZE)).astype(np.float32))
        names.append(str(folder / f"cal{i}.npy"))
    (folder / "dataset.txt").write_text("\n".join(names) + "\n")
    tests = [rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for _ in range(3)]
    return folder / "dataset.txt", tests


@pytest.fixture(scope="module")
def converted(
    toolkit: Toolkit, tmp_path_factory: pytest.TempPathFactory, images: tuple[Path, list[np.ndarray]]
) -> Iterator[tuple[RKNN, Path, Path]]:
    """resnet50v2's flow on one shared RKNN (one worker for the module): config with mean/std,
    load_onnx, build(do_quantization=True, dataset=...), export_rknn."""
    folder = tmp_path_factory.mktemp("converted")
    model = models.small_cnn(folder / "cnn.onnx", size=SIZE)
    rknn = RKNN(verbose=False, toolkit="bridge")
    try:
        assert rknn.config(mean_values=[MEAN], std_values=[STD], target_platform="rk3588") == 0
        assert rknn.load_onnx(model=str(model)) == 0
        assert rknn.build(do_quantization=True, dataset=str(images[0])) == 0
        exported = folder / "cnn.rknn"
        assert rknn.export_rknn(str(exported)) == 0
        yield rknn, model, exported
    finally:
        rknn.release()


def test_export_rknn_writes_the_toolkits_real_rknn(converted: tuple[RKNN, Path, Path]) -> None:
    _, _, exported = converted
    data = exported.read_bytes()
    assert data[:4] == b"RKNN", data[:16]
    assert not data.startswith(model_container.MAGIC)
    assert b'"target_platform"' in data and b"rk3588" in data


def test_simulator_inference_matches_onnx_runtime(
    converted: tuple[RKNN, Path, Path], images: tuple[Path, list[np.ndarray]]
) -> None:
    rknn, model, _ = converted
    assert rknn.init_runtime() == 0
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for image in images[1]:
        outputs = rknn.inference(inputs=[image])
        assert outputs is not None and len(outputs) == 1
        got = outputs[0].astype(np.float64).ravel()
        nchw = ((image.astype(np.float32) - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)
        want = session.run(None, {"input": nchw})[0].astype(np.float64).ravel()
        cosine = got @ want / (np.linalg.norm(got) * np.linalg.norm(want))
        assert cosine > 0.99, (cosine, got, want)
        assert got.argmax() == want.argmax()


def test_accuracy_analysis_writes_the_toolkits_files(
    converted: tuple[RKNN, Path, Path], images: tuple[Path, list[np.ndarray]], tmp_path: Path
) -> None:
    """The official accuracy_analysis example reads snapshot/golden/<tensor>.txt with np.genfromtxt.
    The host path has no model here (it was loaded in the toolkit), so these files are the toolkit's."""
    rknn, _, _ = converted
    Image.fromarray(images[1][0]).save(tmp_path / "dog.png")
    out = tmp_path / "snapshot"
    assert rknn.accuracy_analysis(inputs=[str(tmp_path / "dog.png")], output_dir=str(out)) == 0
    table = (out / "error_analysis.txt").read_text()
    assert "layer_name" in table and "simulator_error" in table and "runtime_error" not in table
    assert (out / "map_name_to_file.txt").is_file()
    golden = sorted((out / "golden").glob("*.txt"))
    assert golden, sorted(p.name for p in out.rglob("*"))
    for side in ("golden", "simulator"):
        for text in golden:
            values = np.genfromtxt(out / side / text.name)
            array = np.load(out / side / "npy" / f"{text.stem}.npy")
            assert values.size == array.size
            np.testing.assert_allclose(values, array.ravel(), rtol=1e-4, atol=1e-4)


def test_accuracy_analysis_against_a_board_says_it_is_not_supported(
    converted: tuple[RKNN, Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    rknn, _, _ = converted
    out = tmp_path / "snapshot"
    assert rknn.accuracy_analysis(inputs=["dog.png"], output_dir=str(out), target="rk3588") == -1
    assert "the runtime side (target/device_id) of a model RKNN-Toolkit2 built" in capfd.readouterr().err
    assert not out.exists()


def test_encrypted_export_answers_through_the_bridge(
    converted: tuple[RKNN, Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A toolkit-only method answers from the toolkit (2.5.0 has no such method), not 'install it'."""
    rknn, _, exported = converted
    assert rknn.export_encrypted_rknn_model(str(exported), str(tmp_path / "enc.rknn")) == -1
    err = capfd.readouterr().err
    assert "has no RKNN.export_encrypted_rknn_model()" in err and INSTALL not in err


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory, stub_lib: Path) -> Iterator[tuple[DaemonProcess, Path]]:
    """A board daemon (rknnrt runtime on the stand-in librknnrt, a fake RK3588) and its model cache."""
    root = tmp_path_factory.mktemp("board")
    daemon = start_rknnrt_daemon(root, stub_lib, rk3588_board(root / "board"))
    yield daemon, root / "cache"
    daemon.stop()


def test_init_runtime_on_a_board_uploads_the_toolkits_rknn(
    converted: tuple[RKNN, Path, Path], board: tuple[DaemonProcess, Path]
) -> None:
    """The board gets the exact bytes the toolkit exported (the stand-in runtime may or may not run them)."""
    rknn, _, exported = converted
    daemon, cache = board
    rknn.init_runtime(target="rk3588", device_id=daemon.url)
    cached = {sha256(p): p for p in (cache / "models").glob("*/*") if p.is_file()}
    assert sha256(exported) in cached, sorted(p.name for p in cached.values())
    assert cached[sha256(exported)].read_bytes()[:4] == b"RKNN"


def test_hybrid_quantization_then_a_board_without_build(
    toolkit: Toolkit,
    board: tuple[DaemonProcess, Path],
    images: tuple[Path, list[np.ndarray]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hybrid_quant example's two steps; step 2 builds, so init_runtime(target) uploads its .rknn."""
    daemon, cache = board
    monkeypatch.chdir(tmp_path)
    model = models.small_cnn(tmp_path / "cnn.onnx", size=SIZE)
    rknn = RKNN(toolkit="bridge")
    try:
        assert rknn.config(mean_values=[MEAN], std_values=[STD], target_platform="rk3588") == 0
        assert rknn.load_onnx(model=str(model)) == 0
        assert rknn.hybrid_quantization_step1(dataset=str(images[0]), proposal=False) == 0
    finally:
        rknn.release()
    assert {"cnn.model", "cnn.data", "cnn.quantization.cfg"} <= {p.name for p in tmp_path.iterdir()}
    rknn = RKNN(toolkit="bridge")
    try:
        assert rknn.config(mean_values=[MEAN], std_values=[STD], target_platform="rk3588") == 0
        assert rknn.hybrid_quantization_step2("cnn.model", "cnn.data", "cnn.quantization.cfg") == 0
        rknn.init_runtime(target="rk3588", device_id=daemon.url)
        assert rknn.export_rknn("hybrid.rknn") == 0
    finally:
        rknn.release()
    cached = {sha256(p) for p in (cache / "models").glob("*/*") if p.is_file()}
    assert sha256(tmp_path / "hybrid.rknn") in cached


def test_a_host_runtime_daemon_refuses_the_toolkits_rknn(
    converted: tuple[RKNN, Path, Path], host_daemon: DaemonProcess, capfd: pytest.CaptureFixture[str]
) -> None:
    rknn, _, _ = converted
    assert rknn.init_runtime(device_id=host_daemon.url) == -1
    err = capfd.readouterr().err
    assert "the model RKNN-Toolkit2 built is a real RKNN model" in err
    assert "the host runtime cannot run RKNN models" in err


def test_auto_mode_builds_on_the_host_path_for_a_virtual_board(
    toolkit: Toolkit,
    host_daemon: DaemonProcess,
    images: tuple[Path, list[np.ndarray]],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The demo's flow with a toolkit installed: auto mode converts in the toolkit, and a host-runtime
    daemon (which cannot run what the toolkit compiled) gets the same model built with ONNX Runtime."""
    model = models.small_cnn(tmp_path / "cnn.onnx", size=SIZE)
    rknn = RKNN(verbose=True, toolkit="auto")
    try:
        assert rknn.config(mean_values=[MEAN], std_values=[STD], target_platform="rk3588") == 0
        assert rknn.load_onnx(model=str(model)) == 0
        assert rknn.build(do_quantization=False) == 0
        assert rknn._route.started  # the conversion ran in the real toolkit
        assert rknn.init_runtime(device_id=host_daemon.url) == 0
        said = capfd.readouterr()
        assert "is a virtual board" in said.out + said.err
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        image = images[1][0]
        outputs = rknn.inference(inputs=[image])
        assert outputs is not None
        nchw = ((image.astype(np.float32) - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)
        np.testing.assert_allclose(outputs[0], session.run(None, {"input": nchw})[0], rtol=1e-4, atol=1e-4)
    finally:
        rknn.release()


def test_a_killed_worker_is_minus_one_naming_the_install(
    toolkit: Toolkit, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    rknn = RKNN(toolkit="bridge")
    try:
        assert rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588") == 0
        bridge = rknn._route.bridge
        assert bridge is not None
        bridge.process.kill()
        bridge.process.wait(timeout=30)
        assert rknn.load_onnx(str(models.small_cnn(tmp_path / "cnn.onnx", size=SIZE))) == -1
        assert rknn.build(do_quantization=False) == -1
        err = capfd.readouterr().err
        assert "E load_onnx:" in err and "signal 9" in err and INSTALL in err
    finally:
        rknn.release()


def test_forced_bridge_without_a_toolkit_is_minus_one_naming_the_install(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_PYTHON, "/nowhere/python")
    monkeypatch.setenv(ENV_TOOLKIT, "bridge")
    rknn = RKNN()
    assert rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588") == -1
    assert rknn.hybrid_quantization_step1(dataset="dataset.txt") == -1
    err = capfd.readouterr().err
    assert "E config: RKNN-Toolkit2 is not available" in err and "/nowhere/python" in err and INSTALL in err
    rknn.release()


@pytest.mark.parametrize("how", ["argument", "env", "auto-without-toolkit"])
def test_the_host_path_when_forced_or_without_a_toolkit(
    how: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, images: tuple[Path, list[np.ndarray]]
) -> None:
    """The host path still converts and runs (its virtual-board export), whether forced or the fallback."""
    if how == "argument":
        monkeypatch.setenv(ENV_TOOLKIT, "bridge")
        rknn = RKNN(toolkit="host")
    else:
        monkeypatch.setenv(ENV_TOOLKIT, "host" if how == "env" else "auto")
        if how == "auto-without-toolkit":
            monkeypatch.setenv(ENV_PYTHON, "/nowhere/python")
        rknn = RKNN()
    try:
        model = models.small_cnn(tmp_path / "cnn.onnx", size=SIZE)
        assert rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588") == 0
        assert rknn.load_onnx(model=str(model)) == 0
        assert rknn.build(do_quantization=True, dataset=str(images[0])) == 0
        assert rknn.export_rknn(str(tmp_path / "cnn.rknn")) == 0
        assert (tmp_path / "cnn.rknn").read_bytes().startswith(model_container.MAGIC)
        assert rknn._route.bridge is None
    finally:
        rknn.release()


def test_exec_runs_a_toolkit_script_through_the_bridge(toolkit: Toolkit, tmp_path: Path) -> None:
    """`rknn-client exec` on an unchanged script that imports rknn.api: the export is the toolkit's."""
    (tmp_path / "convert.py").write_text(SCRIPT)
    rng = np.random.default_rng(5)
    for i in range(2):
        np.save(tmp_path / f"c{i}.npy", rng.integers(0, 256, (1, 3, 16, 16)).astype(np.float32))
    (tmp_path / "dataset.txt").write_text("c0.npy\nc1.npy\n")
    model = models.small_cnn(tmp_path / "cnn.onnx")
    exported = tmp_path / "cnn.rknn"
    env = {**os.environ, "PYTHONPATH": "", ENV_TOOLKIT: "auto"}
    result = subprocess.run(
        [str(VENV_BIN / "rknn-client"), "exec", "convert.py", str(model), str(exported)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "outputs (1, 10) rknn_client.compat.rknn" in result.stdout
    assert exported.read_bytes()[:4] == b"RKNN"


def test_an_unknown_path_choice_is_named_and_auto_is_used(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_TOOLKIT, "gpu")
    rknn = RKNN()
    assert rknn._route.mode == "auto"
    assert "RKNN_CLIENT_TOOLKIT='gpu' is not one of auto, bridge, host; using auto" in capfd.readouterr().err
    assert RKNN(toolkit="HOST")._route.mode == "host"  # the argument wins over the environment
