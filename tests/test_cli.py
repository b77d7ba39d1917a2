"""`rknn-client` from a shell, against a real daemon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from demo.daemon_process import DaemonProcess


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rknn_client.cli", *args], capture_output=True, text=True, timeout=120
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
