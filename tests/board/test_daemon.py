"""The daemon installed in an emulated board as docs/deploy.md says, on the cross-compiled stand-in
runtime, driven from this PC over TCP and over adb as a toolkit user drives a real board."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import rknn_client
from rknn_client import RKNN, __version__
from rknn_server.testing import start_daemon
from tests.adb.fixtures import EmulatedBoard, PrivateAdbServer
from tests.board.conftest import BoardDaemon, ReadyBoard
from tests.board.rootfs import BOARD_VENV
from tests.board.stub_case import INTERNAL, PERF_US, WEIGHT, an_image, expected, stub_model
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt.stub_build import build_stub


def test_the_venv_holds_this_clones_wheel_and_pypi_wheels_for_the_board(
    ready_board: ReadyBoard, project_wheel: Path
) -> None:
    board = ready_board.board
    assert f"Successfully installed rknn-server-oss-{__version__}" in ready_board.install_output
    version = board.run(f"{BOARD_VENV}/bin/rknn_server --version", timeout=300)
    assert version.returncode == 0 and __version__ in version.stdout, version.stdout
    probe = board.run(
        f"{BOARD_VENV}/bin/python -c 'import platform, grpc, numpy, google.protobuf as p; "
        "from rknn_server.protocols.kserve import rest; "
        "print(platform.machine(), numpy.__file__, p.__version__, rest.orjson is not None, "
        'rest.parse_json(b"[1.5, 100000000000000000000]") == [1.5, 10**20])\'',
        timeout=300,
    )
    machine, numpy_file, protobuf, orjson_used, parsed = probe.stdout.split()
    assert machine == ready_board.spec.machine
    # The REST door's JSON: orjson from PyPI where the server extra has it (not armv7l), else json.
    assert (orjson_used, parsed) == (str(machine != "armv7l"), "True"), probe.stdout
    # armhf takes the distribution's numpy through --system-site-packages; arm64 PyPI's wheel.
    numpy_home = "/usr/lib/python3/dist-packages/" if ready_board.spec.system_site_packages else BOARD_VENV
    assert numpy_file.startswith(numpy_home), numpy_file
    assert int(protobuf.split(".")[0]) >= 5  # Debian's 4.21 cannot load the generated code


def test_tcp_outputs_are_exact_and_perf_and_memory_come_from_the_board_runtime(
    board_daemon: BoardDaemon, tmp_path: Path
) -> None:
    model = stub_model(tmp_path / "m.rknn")
    images = [an_image(seed) for seed in range(3)]
    with rknn_client.connect(board_daemon.url) as device:
        info = device.info()
        session = device.load(model, perf_debug=True, eval_mem=True)
        try:
            outputs = [session.run([image])[0] for image in images]
            perf = session.perf(fix_freq=False)
            memory = session.memory()
        finally:
            session.release()
    assert (info.runtime, info.soc) == ("rknnrt", "rk3588")
    assert info.runtime_version.startswith("librknnrt 2.3.2 (stub")
    for image, output in zip(images, outputs, strict=True):
        np.testing.assert_array_equal(output, expected(image))
    rows = [(layer.index, layer.op_type, layer.time_us) for layer in perf.layers]
    assert rows == [
        (1, "InputOperator", PERF_US),
        (2, "ConvRelu", 2 * PERF_US),
        (3, "OutputOperator", 3 * PERF_US),
    ]
    assert (memory.weight_memory, memory.internal_memory) == (WEIGHT, INTERNAL)


def test_the_toolkit_api_over_adb_reaches_the_board_daemon(
    adb_board: EmulatedBoard, adb_env: PrivateAdbServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = an_image(7)
    rknn = RKNN()
    try:
        assert rknn.load_rknn(str(stub_model(tmp_path / "m.rknn"))) == 0
        assert (
            rknn.init_runtime(target="rk3588", device_id=adb_board.serial, perf_debug=True, eval_mem=True)
            == 0
        )
        outputs = rknn.inference(inputs=[image])
        report = rknn.eval_perf(is_print=False, fix_freq=False)
        memory = rknn.eval_memory(is_print=False)
    finally:
        rknn.release()
    assert outputs is not None and len(outputs) == 1
    np.testing.assert_array_equal(outputs[0], expected(image))
    assert report is not None and "Network Layer Information Table" in report
    assert f"Total Operator Elapsed Per Frame Time(us): {6 * PERF_US}" in report
    assert memory is not None and (memory["weight_memory"], memory["internal_memory"]) == (WEIGHT, INTERNAL)


def test_the_board_sees_only_its_own_processes(adb_board: EmulatedBoard, board_daemon: BoardDaemon) -> None:
    """A board's `killall rknn_server` (the real toolkit sends one) must not reach this machine's
    processes: the board's /proc lists its own few, and this process's PID does not exist there."""
    device = adb_board.server.client().device(adb_board.serial)
    pids = device.shell("ls /proc | grep '^[0-9]*$'").split()
    assert 0 < len(pids) < 20, pids  # init, the daemon, this shell
    assert device.shell(f"kill -0 {os.getpid()} 2>/dev/null && echo seen || echo unseen").strip() == "unseen"
    assert psutil.pid_exists(board_daemon.host_pid())


def test_idle_rss_and_start_time_against_native(
    board_daemon: BoardDaemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The figures for the note, printed (no timed assertion: a shared 2-core machine varies)."""
    library = build_stub(tmp_path / "native-stub")
    args = [
        "--runtime",
        "rknnrt",
        "--runtime-lib",
        str(library),
        "--sysfs-root",
        str(rk3588_board(tmp_path / "b")),
    ]
    started = time.monotonic()
    native = start_daemon(tmp_path / "cache", tmp_path / "native.log", args)
    native_start = time.monotonic() - started
    try:
        native_rss = psutil.Process(native.pid).memory_info().rss
    finally:
        native.stop()
    board_rss = psutil.Process(board_daemon.host_pid()).memory_info().rss
    assert native_rss > 0 and board_rss > 0
    mib = 1024 * 1024
    with capsys.disabled():
        print(
            f"\nboard figures: start to ready {board_daemon.start_seconds:.2f} s emulated vs {native_start:.2f} s native "
            f"({board_daemon.start_seconds / native_start:.1f}x); idle RSS {board_rss / mib:.0f} MiB emulated "
            f"(qemu included) vs {native_rss / mib:.0f} MiB native ({board_rss / native_rss:.1f}x)"
        )
