"""Shared fixtures: real daemon subprocesses on free loopback ports, and the board cases the
compatibility tests run against (one per transport x backend, each with its own reference)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from rknn_client import digest_cache
from rknn_client.compat.toolkit_route import ENV_TOOLKIT
from rknn_server.testing import DaemonProcess, start_daemon
from tests import models
from tests.adb.host_board import AdbHostBoard, adb_host_board, point_adb_at
from tests.rknnrt.fake_sysfs import rk3588_board, rv1106_board
from tests.rknnrt.stub_build import build_stub
from tests.rknnrt_cases import image_model, image_reference, start_rknnrt_daemon

DaemonFactory = Callable[..., DaemonProcess]

# The RKNN class's host path (ONNX Runtime, our int8 emulation) is what the tests exercise unless they
# ask for the real toolkit (tests/toolkit: RKNN(toolkit="bridge")); a toolkit installed on the machine
# must not change what they test. Set here so `rknn-client exec` subprocesses inherit it too.
os.environ[ENV_TOOLKIT] = "host"

# Test files that run the real toolkit against an emulated board through adb: its `adb forward` binds
# the host's abstract socket @transfer_proxy, one per network namespace, so two of them at once on two
# xdist workers would collide ("cannot bind listener: Address already in use"). They share one scope.
TOOLKIT_OVER_ADB = (
    "tests/legacy/test_toolkit.py",
    "tests/legacy/test_dynamic_shapes.py",
    "tests/legacy/test_places.py",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With `--dist loadfile` (make unit), each test file is one unit of work as usual, except that the
    files in TOOLKIT_OVER_ADB are one unit together, so one worker runs them one after another."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ToolkitTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "toolkit-over-adb" if scope in TOOLKIT_OVER_ADB else scope

    return ToolkitTogether(config, log)


@pytest.fixture(scope="session", autouse=True)
def _client_digest_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The client's digest cache goes to a file of this run, not the user's (the user's cache folder
    stays visible: the toolkit the bridge tests drive is installed there)."""
    before = os.environ.get(digest_cache.PATH_ENV)
    os.environ[digest_cache.PATH_ENV] = str(tmp_path_factory.mktemp("client-cache") / digest_cache.FILE_NAME)
    yield
    if before is None:
        del os.environ[digest_cache.PATH_ENV]
    else:
        os.environ[digest_cache.PATH_ENV] = before


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def cnn_model(models_dir: Path) -> Path:
    return models.small_cnn(models_dir / "small_cnn.onnx")


@pytest.fixture(scope="session")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in librknnrt.so, compiled from tests/rknnrt/stub."""
    return build_stub(tmp_path_factory.mktemp("stub-rt"))


@pytest.fixture(scope="session")
def stub_mrt_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in librknnmrt.so (zero-copy API only)."""
    return build_stub(tmp_path_factory.mktemp("stub-mrt"), mrt=True)


@pytest.fixture(scope="session")
def stub_image_model(models_dir: Path) -> Path:
    return image_model(models_dir / "image.rknn")


def _stopped_cleanly(daemon: DaemonProcess) -> None:
    daemon.stop()
    assert daemon.process.returncode == 0, daemon.log_text()[-2000:]


@pytest.fixture(scope="session")
def rknnrt_daemon(tmp_path_factory: pytest.TempPathFactory, stub_lib: Path) -> Iterator[DaemonProcess]:
    """A daemon on the stub librknnrt, probing a fake RK3588."""
    root = tmp_path_factory.mktemp("rknnrt-daemon")
    daemon = start_rknnrt_daemon(root, stub_lib, rk3588_board(root / "board"))
    yield daemon
    _stopped_cleanly(daemon)


@pytest.fixture(scope="session")
def rknnmrt_daemon(tmp_path_factory: pytest.TempPathFactory, stub_mrt_lib: Path) -> Iterator[DaemonProcess]:
    """A daemon on the stub librknnmrt, probing a fake RV1106."""
    root = tmp_path_factory.mktemp("rknnmrt-daemon")
    daemon = start_rknnrt_daemon(root, stub_mrt_lib, rv1106_board(root / "board"))
    yield daemon
    _stopped_cleanly(daemon)


@pytest.fixture(scope="session")
def host_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One host-runtime daemon shared by the tests that only need a well-behaved board."""
    root = tmp_path_factory.mktemp("host-daemon")
    daemon = start_daemon(root / "cache", root / "daemon.log", ["--runtime", "host"])
    yield daemon
    _stopped_cleanly(daemon)


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[DaemonFactory]:
    """Factory for daemons with their own options (a declared SoC, short leases...), stopped at the end."""
    started: list[DaemonProcess] = []

    def make(*args: str, name: str = "daemon") -> DaemonProcess:
        daemon = start_daemon(
            tmp_path / f"{name}-cache", tmp_path / f"{name}.log", ["--runtime", "host", *args]
        )
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


def onnx_reference(
    model: Path, mean: float = 0.0, std: float = 1.0
) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """Outputs of a direct ONNX Runtime run of the model, on NCHW float inputs normalised as configured."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        feed = {n: ((a.astype(np.float32) - mean) / std) for n, a in zip(names, inputs, strict=True)}
        return list(session.run(None, feed))

    return run


@dataclass
class BoardCase:
    """A board the compatibility tests drive: how to reach it, how to load the model on an RKNN
    object, and the reference outputs for NCHW float inputs."""

    id: str
    device_id: str
    target: str | None
    load: Callable[[object], int]
    reference: Callable[[list[np.ndarray]], list[np.ndarray]]
    input_nchw: tuple[int, int, int, int]
    atol: float = 1e-4
    per_layer_perf: bool = True  # whether perf_debug gives per-layer rows (not on librknnmrt)
    lite_core_mask: int = 1  # the core mask the RKNNLite flow asks for (NPU_CORE_0; AUTO on one-core SoCs)


# mean/std the compat cases configure, so the tests also prove they are baked into the model.
CASE_MEAN, CASE_STD = 10.0, 50.0


def host_tcp_case(daemon: DaemonProcess, model: Path) -> BoardCase:
    def load(rknn: object) -> int:
        rknn.config(mean_values=[[CASE_MEAN] * 3], std_values=[[CASE_STD] * 3])  # type: ignore[attr-defined]
        return int(rknn.load_onnx(str(model)))  # type: ignore[attr-defined]

    return BoardCase(
        id="tcp-host",
        device_id=daemon.url,
        target=None,
        load=load,
        reference=onnx_reference(model, CASE_MEAN, CASE_STD),
        input_nchw=(1, 3, 16, 16),
    )


def stub_tcp_case(case_id: str, daemon: DaemonProcess, model: Path, target: str, mrt: bool) -> BoardCase:
    """A board on the stand-in runtime: the image model loaded with load_rknn, reference y = a*x + b."""

    def load(rknn: object) -> int:
        return int(rknn.load_rknn(str(model)))  # type: ignore[attr-defined]

    return BoardCase(
        id=case_id,
        device_id=daemon.url,
        target=target,
        load=load,
        reference=image_reference,
        input_nchw=(1, 3, 16, 16),
        per_layer_perf=not mrt,
        lite_core_mask=0 if mrt else 1,
    )


@pytest.fixture(scope="session")
def adb_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdbHostBoard]:
    """A host-runtime board reached over adb (emulated board, private adb server), shared by the session."""
    with adb_host_board(tmp_path_factory.mktemp("adb-board")) as board:
        yield board


def host_adb_case(board: AdbHostBoard, model: Path, monkeypatch: pytest.MonkeyPatch) -> BoardCase:
    """The tcp-host case reached through adb: device_id is the board's serial, target its SoC."""
    point_adb_at(board.server, monkeypatch)
    return replace(
        host_tcp_case(board.daemon, model), id="adb-host", device_id=board.serial, target=board.soc
    )


@pytest.fixture(params=["tcp-host", "adb-host", "tcp-rknnrt", "tcp-rknnmrt"])
def board(request: pytest.FixtureRequest) -> BoardCase:
    """Every transport x backend the compatibility suite runs over, each with its own reference."""
    if request.param == "tcp-host":
        return host_tcp_case(request.getfixturevalue("host_daemon"), request.getfixturevalue("cnn_model"))
    if request.param == "adb-host":
        monkeypatch = request.getfixturevalue("monkeypatch")
        return host_adb_case(
            request.getfixturevalue("adb_board"), request.getfixturevalue("cnn_model"), monkeypatch
        )
    model = request.getfixturevalue("stub_image_model")
    if request.param == "tcp-rknnrt":
        return stub_tcp_case(request.param, request.getfixturevalue("rknnrt_daemon"), model, "rk3588", False)
    if request.param == "tcp-rknnmrt":
        return stub_tcp_case(request.param, request.getfixturevalue("rknnmrt_daemon"), model, "rv1106", True)
    raise AssertionError(request.param)
