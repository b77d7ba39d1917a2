"""The rknnrt runtime through a real daemon on the stand-in librknnrt/librknnmrt: runtime choice,
versions, core masks, dynamic shapes, int8 (de)quantization, the zero-copy path and frequency pinning."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

import rknn_client
from rknn_client import RKNN
from rknn_client.errors import InvalidInput, Unsupported
from rknn_proto.messages import FrequencyList
from rknn_server import __version__ as daemon_version
from rknn_server.testing import DaemonProcess, start_daemon
from tests.rknnrt.fake_sysfs import npu_board, rk3588_board
from tests.rknnrt.stub_build import StubTensor, write_stub_model
from tests.rknnrt_cases import (
    IMAGE_NHWC,
    OUT_SCALE,
    OUT_ZP,
    A,
    B,
    image_reference,
    int8_roundtrip,
    rknnrt_args,
    start_rknnrt_daemon,
)

Starter = Callable[[Sequence[str]], DaemonProcess]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Starter]:
    """Start daemons with the given arguments; each is stopped by PID at the end."""
    started: list[DaemonProcess] = []

    def make(args: Sequence[str]) -> DaemonProcess:
        workdir = tmp_path / f"daemon{len(started)}"
        daemon = start_daemon(workdir / "cache", workdir / "daemon.log", list(args))
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


def int8_image_model(path: Path) -> Path:
    """The image model with an int8 input quantized as real = q + 128: a uint8 image fits it exactly."""
    return write_stub_model(
        path,
        inputs=[StubTensor("image", "INT8", "NHWC", IMAGE_NHWC, -128, 1.0)],
        outputs=[StubTensor("score", "INT8", "NHWC", IMAGE_NHWC, OUT_ZP, OUT_SCALE)],
        a=A,
        b=B,
    )


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


def test_get_info_and_sdk_version_come_from_the_probe_and_the_library(
    rknnrt_daemon: DaemonProcess, stub_image_model: Path
) -> None:
    with rknn_client.connect(rknnrt_daemon.url) as device:
        info = device.info()
    assert (info.runtime, info.soc, info.board, info.driver_version) == (
        "rknnrt",
        "rk3588",
        "Orange Pi 5",
        "0.9.8",
    )
    assert info.runtime_version == "librknnrt 2.3.2 (stub0000@2025-04-09T09:08:16)"
    assert "--runtime rknnrt" in info.runtime_reason and "/dev/dri/renderD129" in info.runtime_reason
    assert info.model_formats == (".rknn",)
    assert info.capabilities["core_mask"] and info.capabilities["fix_freq"]
    rknn = RKNN()
    try:
        assert rknn.load_rknn(str(stub_image_model)) == 0
        assert rknn.init_runtime(target="rk3588", device_id=rknnrt_daemon.url) == 0
        lines = (rknn.get_sdk_version() or "").splitlines()
    finally:
        rknn.release()
    assert lines[3].startswith(f"DRV: rknn_server: {daemon_version} ")
    assert lines[4] == "DRV: rknnrt: 2.3.2 (stub0000@2025-04-09T09:08:16) [0.9.8]"


@pytest.mark.parametrize(
    ("board_soc", "declared_soc", "mask", "allowed"),
    [
        ("", "rk3576", 0x4, "allowed: NPU_CORE_AUTO, NPU_CORE_0, NPU_CORE_1, NPU_CORE_0_1, NPU_CORE_ALL"),
        ("rk3566", "", 0x1, "allowed there: NPU_CORE_AUTO, NPU_CORE_ALL"),
    ],
)
def test_core_masks_the_soc_lacks_are_refused_with_the_allowed_ones(
    start: Starter,
    tmp_path: Path,
    stub_lib: Path,
    stub_image_model: Path,
    board_soc: str,
    declared_soc: str,
    mask: int,
    allowed: str,
) -> None:
    board = npu_board(tmp_path / "board", board_soc)
    soc = board_soc or declared_soc
    daemon = start(rknnrt_args(stub_lib, board, "--soc", declared_soc))
    with rknn_client.connect(daemon.url) as device:
        assert device.info().soc == soc
        with pytest.raises(Unsupported) as refused:
            device.load(stub_image_model, core_mask=mask)
        device.load(stub_image_model, core_mask=0).release()
    assert soc in str(refused.value) and f"{mask:#x}" in str(refused.value) and allowed in str(refused.value)


def test_a_dynamic_shape_model_takes_two_shapes_in_a_row(
    rknnrt_daemon: DaemonProcess, tmp_path: Path
) -> None:
    model = write_stub_model(tmp_path / "dynamic.rknn", a=2.0, b=1.0, dynamic=[(1, 2, 2, 3), (1, 4, 4, 3)])
    small = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
    big = np.arange(48, dtype=np.float32).reshape(1, 4, 4, 3)
    with rknn_client.connect(rknnrt_daemon.url) as device, device.load(model) as session:
        assert session.inputs[0].shape == (1, -1, -1, 3)
        for x in (small, big, small):
            (y,) = session.run([x])
            np.testing.assert_array_equal(y, 2 * x + 1)
        with pytest.raises(InvalidInput, match="not among the model's shapes"):
            session.run([np.ones((1, 3, 3, 3), dtype=np.float32)])


def test_int8_inputs_take_real_values_and_outputs_are_dequantized_exactly(
    rknnrt_daemon: DaemonProcess, tmp_path: Path
) -> None:
    model = int8_image_model(tmp_path / "int8.rknn")
    real = np.random.default_rng(3).uniform(-200, 300, IMAGE_NHWC).astype(np.float32)
    image = np.random.default_rng(4).integers(0, 256, IMAGE_NHWC[1:], dtype=np.uint8)
    with rknn_client.connect(rknnrt_daemon.url) as device, device.load(model) as session:
        assert (session.inputs[0].dtype, session.inputs[0].quant_type) == (np.dtype(np.int8), "affine")
        (y,) = session.run([real], strict=False)
        with pytest.raises(InvalidInput, match="the model expects int8"):
            session.run([real], pass_through=[True], strict=False)
    seen = int8_roundtrip(real, -128, 1.0)
    np.testing.assert_array_equal(y, int8_roundtrip(np.float32(A) * seen + np.float32(B), OUT_ZP, OUT_SCALE))
    rknn = RKNN()
    try:
        assert rknn.load_rknn(str(model)) == 0
        assert rknn.init_runtime(device_id=rknnrt_daemon.url) == 0
        outputs = rknn.inference([image])
    finally:
        rknn.release()
    assert outputs is not None
    nchw = image.transpose(2, 0, 1)[np.newaxis].astype(np.float32)
    np.testing.assert_array_equal(outputs[0], image_reference([nchw])[0])


def test_int8_outputs_cross_the_wire_as_int8_and_equal_the_float_path(
    start: Starter, stub_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RKNN_SHM", "off")  # the wire's bytes (shared memory moves none)
    daemon = start(rknnrt_args(stub_lib, rk3588_board(tmp_path / "b")))
    model = int8_image_model(tmp_path / "int8.rknn")
    real = np.random.default_rng(5).uniform(-200, 300, IMAGE_NHWC).astype(np.float32)
    with (
        rknn_client.connect(daemon.url) as device,
        device.load(model) as native,
        device.load(model, native_outputs=False) as floats,
    ):
        (a,) = native.run([real], strict=False)
        (b,) = floats.run([real], strict=False)
    assert a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    daemon.stop()
    events = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    sent = [e["bytes_out"] for e in events if e.get("method") == "Run"]
    assert sent == [int(np.prod(IMAGE_NHWC)), 4 * int(np.prod(IMAGE_NHWC))]


def test_the_host_runtime_stays_strict_about_input_dtypes(
    host_daemon: DaemonProcess, cnn_model: Path
) -> None:
    with (
        rknn_client.connect(host_daemon.url) as device,
        device.load(cnn_model) as session,
        pytest.raises(InvalidInput, match="the model expects float32"),
    ):
        session.run([np.zeros((1, 3, 16, 16), dtype=np.uint8)], strict=False)


def test_librknnmrt_runs_zero_copy_and_times_by_wall_clock(
    rknnmrt_daemon: DaemonProcess, stub_image_model: Path
) -> None:
    image = np.random.default_rng(5).integers(0, 256, IMAGE_NHWC, dtype=np.uint8)
    with rknn_client.connect(rknnmrt_daemon.url) as device:
        info = device.info()
        session = device.load(stub_image_model, perf_debug=True)
        try:
            (y,) = session.run([image])
            report = session.perf(fix_freq=False)
        finally:
            session.release()
    assert (info.runtime, info.soc, info.runtime_version.split()[0]) == ("rknnrt", "rv1106", "librknnmrt")
    assert not info.capabilities["perf_per_layer"]
    np.testing.assert_array_equal(y, image_reference([image.transpose(0, 3, 1, 2).astype(np.float32)])[0])
    assert report.layers == () and report.total_time_us > 0
    assert report.raw_text.startswith("librknnmrt: the runtime has no per-layer performance data")
    assert "wall-clock time around rknn_run" in report.raw_text


def following_minimum(board: Path) -> Path:
    """Make each domain's current frequency read its minimum, as a pinned board's does."""
    currents = [*board.glob("sys/devices/system/cpu/cpufreq/policy*/scaling_cur_freq")]
    currents += [*board.glob("sys/class/devfreq/*/cur_freq")]
    for current in currents:
        current.unlink()
        current.symlink_to("scaling_min_freq" if current.name == "scaling_cur_freq" else "min_freq")
    return board


def test_eval_perf_with_fix_freq_pins_the_board_and_restores_it(
    tmp_path: Path, stub_lib: Path, stub_image_model: Path
) -> None:
    board = following_minimum(rk3588_board(tmp_path / "board"))
    before = snapshot(board)
    daemon = start_rknnrt_daemon(tmp_path / "pinning", stub_lib, board)
    try:
        with rknn_client.connect(daemon.url) as device, device.load(stub_image_model) as session:
            pinned = session.perf(fix_freq=True)
            restored = snapshot(board)
            unpinned = session.perf(fix_freq=False)
    finally:
        daemon.stop()
    assert pinned.frequencies_fixed and pinned.frequency_note == ""
    assert pinned.frequencies == (
        FrequencyList("CPU", (1800000, 2256000, 2304000)),
        FrequencyList("NPU", (1000000000,)),
        FrequencyList("DDR", (2112000000,)),
    )
    assert not unpinned.frequencies_fixed and unpinned.frequency_note == ""
    assert unpinned.frequencies == (
        FrequencyList("CPU", (408000,) * 3),
        FrequencyList("NPU", (300000000,)),
        FrequencyList("DDR", (528000000,)),
    )
    assert restored == before


def test_the_host_runtime_reports_cpu_frequencies_it_cannot_fix(
    start: Starter, tmp_path: Path, cnn_model: Path
) -> None:
    board = rk3588_board(tmp_path / "board")
    daemon = start(["--runtime", "host", "--sysfs-root", str(board)])
    with rknn_client.connect(daemon.url) as device:
        assert (device.info().soc, device.info().board) == ("rk3588", "Orange Pi 5")
        with device.load(cnn_model) as session:
            report = session.perf(fix_freq=True)
    assert report.frequencies == (FrequencyList("CPU", (1200000,) * 3),)
    assert not report.frequencies_fixed
    assert report.frequency_note == (
        "frequencies were not fixed: the host runtime has no NPU and leaves the CPU to the OS"
    )


def test_sessions_in_worker_processes_run_on_the_rknnrt_runtime(
    start: Starter, tmp_path: Path, stub_lib: Path, stub_image_model: Path
) -> None:
    board = rk3588_board(tmp_path / "board")
    daemon = start(rknnrt_args(stub_lib, board, "--isolation", "process"))
    nchw = np.random.default_rng(6).integers(0, 256, (1, 3, 16, 16), dtype=np.uint8)
    with rknn_client.connect(daemon.url) as device, device.load(stub_image_model) as session:
        (y,) = session.run([nchw], ["NCHW"], strict=False)
        assert session.runtime_api_version == "2.3.2 (stub0000@2025-04-09T09:08:16)"
    np.testing.assert_array_equal(y, image_reference([nchw.astype(np.float32)])[0])


def _auto_board(root: Path, stub_lib: Path, library: bool, npu: bool) -> Path:
    board = rk3588_board(root)
    if not npu:
        shutil.rmtree(board / "dev")
    if library:
        (board / "usr/lib").mkdir(parents=True)
        shutil.copy(stub_lib, board / "usr/lib/librknnrt.so")
    return board


@pytest.mark.parametrize(
    ("library", "npu", "runtime", "reason"),
    [
        (True, True, "rknnrt", "usr/lib/librknnrt.so loaded and NPU device /dev/dri/renderD129 found"),
        (False, True, "host", "no RKNN runtime library (librknnrt.so or librknnmrt.so) in "),
        (True, False, "host", "usr/lib/librknnrt.so is present but no NPU device node"),
    ],
)
def test_runtime_auto_picks_rknnrt_only_with_the_library_and_an_npu(
    start: Starter, tmp_path: Path, stub_lib: Path, library: bool, npu: bool, runtime: str, reason: str
) -> None:
    board = _auto_board(tmp_path / "board", stub_lib, library, npu)
    daemon = start(["--runtime", "auto", "--sysfs-root", str(board)])
    with rknn_client.connect(daemon.url) as device:
        info = device.info()
    assert info.runtime == runtime
    assert reason in info.runtime_reason
    assert runtime == "rknnrt" or info.runtime_reason.endswith(
        "serving the host runtime (ONNX Runtime on the CPU)"
    )


def test_runtime_rknnrt_without_the_library_exits_with_a_clear_message(tmp_path: Path) -> None:
    missing = tmp_path / "librknnrt.so"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "rknn_server", "--runtime", "rknnrt", "--runtime-lib", str(missing)),
            *("--model-cache", str(tmp_path / "cache"), "--listen", "tcp://127.0.0.1:0"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"the RKNN runtime library {missing} (--runtime-lib) does not exist" in result.stderr


@pytest.mark.parametrize("daemon_fixture", ["rknnrt_daemon", "rknnmrt_daemon"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "dequantized"])
def test_shared_memory_frames_on_the_board_runtime_match_the_wire(
    request: pytest.FixtureRequest, daemon_fixture: str, native: bool, tmp_path: Path
) -> None:
    """A shared-memory frame's outputs, which the runtime writes into the region's slots where its
    API allows (ModelRuntime.run_into), are the wire's, for float and int8 outputs of both APIs."""
    from rknn_client.local import shared_memory

    daemon: DaemonProcess = request.getfixturevalue(daemon_fixture)
    model = write_stub_model(
        tmp_path / "two.rknn",
        outputs=[
            StubTensor("real", "FP32", "NHWC", (1, 2, 2, 3)),
            StubTensor("stored", "INT8", "NCHW", (1, 3, 2, 2), -3, 0.5),
        ],
        a=1.5,
        b=-2.0,
    )
    frames = [np.random.default_rng(i).uniform(-20, 20, (1, 2, 2, 3)).astype(np.float32) for i in range(3)]
    results = []
    for shared in (True, False):
        with rknn_client.connect(daemon.url) as device, device.load(model) as session:
            session.native_outputs = native
            if not shared:
                shared_memory.disable(device)
            results.append([[o.copy() for o in session.run([x])] for x in frames])
            assert shared_memory.usable(device) is shared
    for shm_outputs, wire_outputs in zip(*results, strict=True):
        for a, b in zip(shm_outputs, wire_outputs, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
