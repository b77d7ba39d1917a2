"""`rknn-client` from a shell, against a real daemon."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from demo.daemon_process import DaemonProcess
from rknn_client.transport.adb import adb_server_running
from tests.adb.fixtures import find_adb, free_port


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rknn_client.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_info_describes_the_daemon(host_daemon: DaemonProcess) -> None:
    result = cli("info", "--device", host_daemon.url)
    assert result.returncode == 0, result.stderr
    assert "runtime:" in result.stdout and "onnxruntime" in result.stdout
    assert "max_sessions=" in result.stdout


def test_run_saves_outputs_equal_to_onnx_runtime(
    host_daemon: DaemonProcess, cnn_model: Path, tmp_path: Path
) -> None:
    x = np.random.default_rng(4).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = cli(
        "run",
        str(cnn_model),
        "--device",
        host_daemon.url,
        "--input",
        str(tmp_path / "x.npy"),
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert result.returncode == 0, result.stderr
    assert "output 0 logits: shape=[1, 10] dtype=float32" in result.stdout
    want = ort.InferenceSession(str(cnn_model)).run(None, {"input": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output_0.npy"), want, rtol=1e-5, atol=1e-6)


def test_perf_and_mem_print_the_toolkit_reports(host_daemon: DaemonProcess, cnn_model: Path) -> None:
    perf = cli("perf", str(cnn_model), "--device", host_daemon.url)
    assert perf.returncode == 0, perf.stderr
    assert "Network Layer Information Table" in perf.stdout and "Total Time(us):" in perf.stdout
    assert "already cached" in perf.stderr or "uploaded" in perf.stderr
    mem = cli("mem", str(cnn_model), "--device", host_daemon.url)
    assert mem.returncode == 0 and "Memory Profile Info Dump" in mem.stdout


def test_errors_are_one_clear_line_and_exit_one(
    host_daemon: DaemonProcess, cnn_model: Path, tmp_path: Path
) -> None:
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 8, 8), dtype=np.float32))
    result = cli("run", str(cnn_model), "--device", host_daemon.url, "--input", str(tmp_path / "bad.npy"))
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("rknn-client: input 0 (input) has shape [1, 3, 8, 8]")
    )
    unreachable = cli("info", "--device", "tcp://127.0.0.1:1")
    assert unreachable.returncode == 1 and "not reachable" in unreachable.stderr


@pytest.fixture
def adb_port() -> Iterator[int]:
    """A private ANDROID_ADB_SERVER_PORT with no server; a server the code under test starts there
    anyway (the failure these tests look for) is stopped afterwards."""
    port = free_port()
    yield port
    if adb_server_running("127.0.0.1", port):
        subprocess.run([find_adb() or "adb", "-P", str(port), "kill-server"], check=False, timeout=30)


def test_bare_host_port_reaches_the_daemon_without_starting_adb(
    host_daemon: DaemonProcess, adb_port: int
) -> None:
    result = cli("info", "--device", host_daemon.address, env={"ANDROID_ADB_SERVER_PORT": str(adb_port)})
    assert result.returncode == 0, result.stderr
    assert f"device:          {host_daemon.url}" in result.stdout
    assert not adb_server_running("127.0.0.1", adb_port), "an adb server was started"


def test_bare_host_port_with_nothing_there_is_refused_at_once(adb_port: int) -> None:
    started = time.monotonic()
    result = cli("info", "--device", "127.0.0.1:1", env={"ANDROID_ADB_SERVER_PORT": str(adb_port)})
    assert result.returncode == 1
    assert "did you mean tcp://127.0.0.1:1?" in result.stderr
    assert time.monotonic() - started < 12
    assert not adb_server_running("127.0.0.1", adb_port), "an adb server was started"


def test_other_schemes_are_refused_by_name(adb_port: int) -> None:
    result = cli("info", "--device", "http://127.0.0.1:50515", env={"ANDROID_ADB_SERVER_PORT": str(adb_port)})
    assert result.returncode == 1
    assert "unsupported scheme http://" in result.stderr and "tcp://HOST:PORT" in result.stderr
