"""What a user meets in everyday use of `rknn-client` (issue #29): Ctrl-C, a forgotten --device,
printed values, --json on errors, tokens as the docs tell users to send them, and messages that
name the cause."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rknn_server.testing import DaemonProcess
from tests import models
from tests.adb.fixtures import free_port
from tests.cli_run import CliRun, cli
from tests.metrics.conftest import get, start_metrics_daemon

TOKEN = "k" * 20 + "Q1w2E3r4"


def _no_board_env(adb_port: int) -> dict[str, str]:
    """Nothing names a board: the CLI's own default applies (a private host-runtime daemon)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RKNN_SERVER", "ANDROID_SERIAL")}
    return {**env, "ANDROID_ADB_SERVER_PORT": str(adb_port)}


def _compute_runs(metrics_url: str) -> int:
    _, body = get(metrics_url)
    found = re.search(r"^rknn_model_compute_seconds_count(?:\{[^}]*\})? (\S+)$", body.decode(), re.M)
    return int(float(found.group(1))) if found else 0


def test_ctrl_c_during_perf_prints_the_runs_timed_and_exits_130(tmp_path: Path, cnn_model: Path) -> None:
    daemon = start_metrics_daemon(tmp_path)
    run = CliRun(
        [
            "perf", str(cnn_model), "--device", daemon.daemon.url, "--runs", "100000000", "--warmup", "0",
            "--no-progress",
        ]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while _compute_runs(daemon.metrics_url) < 5:  # the daemon itself says runs are being timed
            assert run.process.poll() is None and time.monotonic() < deadline, "".join(run.lines)
            time.sleep(0.1)
        run.process.send_signal(signal.SIGINT)
        code, stdout, stderr = run.finish()
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()
        daemon.daemon.stop()
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    timed = re.search(r"^Runs: (\d+) timed after 0 warm-up \(stopped by Ctrl-C\)", stdout, re.M)
    assert timed and int(timed.group(1)) >= 4, stdout
    assert re.search(r"^Latency\(us\): p50 \d+", stdout, re.M), stdout
    assert f"interrupted (Ctrl-C) after {timed.group(1)} timed runs" in stderr


def test_ctrl_c_before_anything_is_measured_is_one_line_and_130(tmp_path: Path) -> None:
    """Ctrl-C while the private daemon starts (nothing measured yet): no traceback either."""
    model = models.small_cnn(tmp_path / "m.onnx")
    run = CliRun(["mem", str(model), "--no-progress"])
    try:
        run.wait_for({"rknn-client: warning: no --device given"})
        run.process.send_signal(signal.SIGINT)
        code, _, stderr = run.finish()
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()
    assert code == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert "rknn-client: interrupted (Ctrl-C)" in stderr.splitlines(), stderr[-1000:]


def test_without_device_the_private_daemon_is_named_and_the_figures_labelled(tmp_path: Path) -> None:
    model = models.small_cnn(tmp_path / "m.onnx")
    result = cli("mem", str(model), "--no-progress", env=_no_board_env(free_port()))
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stderr.splitlines() if "warning" in line)
    assert "private host-runtime daemon on this PC" in warning and "not on a board" in warning
    assert "--device" in warning
    assert "Measured on: host runtime on this PC" in result.stdout
    perf = cli("perf", str(model), "--runs", "2", "--json", "--no-progress", env=_no_board_env(free_port()))
    assert perf.returncode == 0, perf.stderr
    assert json.loads(perf.stdout)["measured_on"].startswith("host runtime on this PC")


def test_a_board_run_carries_no_such_label(host_daemon: DaemonProcess, tmp_path: Path) -> None:
    model = models.small_cnn(tmp_path / "m.onnx")
    result = cli("mem", str(model), "--device", host_daemon.url, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "Measured on" not in result.stdout and "warning" not in result.stderr


def test_run_prints_the_values_and_json_carries_them(host_daemon: DaemonProcess, tmp_path: Path) -> None:
    model = models.identity_of(tmp_path / "id.onnx", "float32", (2, 3))
    values = np.array([[1.25, -2.5, 3.75], [4.5, 5.125, -6.0]], np.float32)
    np.save(tmp_path / "x.npy", values)
    text = cli(
        "run", str(model), "--input", str(tmp_path / "x.npy"), "--device", host_daemon.url, "--no-progress"
    )
    assert text.returncode == 0, text.stderr
    for value in ("1.25", "-2.5", "3.75", "4.5", "5.125", "-6."):
        assert value in text.stdout, text.stdout
    assert "min=-6 max=5.125" in text.stdout
    as_json = cli(
        "run",
        str(model),
        "--input",
        str(tmp_path / "x.npy"),
        "--device",
        host_daemon.url,
        "--no-progress",
        "--json",
    )
    output = json.loads(as_json.stdout)["outputs"][0]
    assert output["values"] == values.reshape(-1).tolist() and output["values_truncated"] is False


def test_run_bounds_what_it_prints_of_a_big_output(host_daemon: DaemonProcess, tmp_path: Path) -> None:
    model = models.identity_of(tmp_path / "big.onnx", "float32", (1, 5000))
    np.save(tmp_path / "x.npy", np.arange(5000, dtype=np.float32).reshape(1, 5000))
    args = [
        "run",
        str(model),
        "--input",
        str(tmp_path / "x.npy"),
        "--device",
        host_daemon.url,
        "--no-progress",
    ]
    text = cli(*args)
    assert text.returncode == 0, text.stderr
    assert len(text.stdout) < 1000 and "..." in text.stdout and "4.999e+03" in text.stdout
    output = json.loads(cli(*args, "--json").stdout)["outputs"][0]
    assert output["values"] == list(range(1000)) and output["values_truncated"] is True


@pytest.mark.parametrize(
    "args",
    [
        ["info"],
        ["perf", "MODEL"],
        ["mem", "MODEL"],
        ["run", "MODEL", "--input", "INPUT"],
    ],
)
def test_json_errors_are_one_json_document_on_stdout(args: list[str], tmp_path: Path) -> None:
    model = models.small_cnn(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    dead = f"tcp://127.0.0.1:{free_port()}"
    given = [{"MODEL": str(model), "INPUT": str(tmp_path / "x.npy")}.get(a, a) for a in args]
    result = cli(*given, "--device", dead, "--json")
    assert result.returncode == 1
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "ConnectionFailed" and dead in error["message"]


def test_a_model_the_runtime_cannot_load_is_refused_before_upload(
    host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    model = models.small_cnn(tmp_path / "m.onnx").rename(tmp_path / "m.bin")
    result = cli("mem", str(model), "--device", host_daemon.url, "--no-progress")
    assert result.returncode == 1
    assert "loads .onnx models, not .bin" in result.stderr
    assert "uploaded" not in result.stderr and "cached" not in result.stderr


def test_a_name_token_file_works_as_doctor_and_the_docs_say(tmp_path: Path) -> None:
    """doctor: RKNN_SERVER_TOKEN=$(cat auth-token); docs/metrics-...md: curl Bearer $(cat auth-token)."""
    token_file = tmp_path / "auth-token"
    token_file.write_text(f"alice:{TOKEN}\n")
    token_file.chmod(0o600)
    daemon = start_metrics_daemon(tmp_path, "--auth-token-file", str(token_file))
    try:
        shell = {**os.environ, "FILE": str(token_file), "URL": daemon.daemon.url, "PY": sys.executable}
        grpc_call = subprocess.run(
            ["bash", "-c", 'RKNN_SERVER_TOKEN=$(cat "$FILE") "$PY" -m rknn_client.cli info --device "$URL"'],
            capture_output=True, text=True, timeout=120, env=shell,
        )  # fmt: skip
        assert grpc_call.returncode == 0, grpc_call.stderr
        curl = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
             f"Authorization: Bearer {token_file.read_text().strip()}", daemon.metrics_url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert curl.stdout == "200"
        assert get(daemon.metrics_url, TOKEN)[0] == 200  # the bare token as before
        assert get(daemon.metrics_url, f"bob:{TOKEN}")[0] == 401  # the line's name must be its token's
        assert get(daemon.metrics_url, f"alice:{TOKEN[:-1]}")[0] == 401
    finally:
        daemon.daemon.stop()


def test_metrics_port_in_use_names_the_flag_and_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "rknn_server", "--runtime", "host", "--listen", "tcp://127.0.0.1:0",
             "--model-cache", str(tmp_path / "cache"), "--metrics-listen", f"tcp://127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert result.returncode != 0
    assert f"--metrics-listen tcp://127.0.0.1:{port}: port {port} is already in use" in result.stderr
    assert "Errno" not in result.stderr


def test_daemon_help_has_no_developer_note() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rknn_server", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "rknn_server.config.limits" not in result.stdout and "Limits" not in result.stdout


def test_doctor_on_a_dead_loopback_port_advises_a_loopback_daemon() -> None:
    port = free_port()
    result = cli("doctor", "--device", f"tcp://127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"rknn_server serve --listen tcp://127.0.0.1:{port}" in result.stdout
    assert "0.0.0.0" not in result.stdout and "auth-token-file" not in result.stdout


def test_devices_without_an_adb_server_says_so_and_how_to_start_one() -> None:
    port = free_port()
    result = cli("devices", env=_no_board_env(port))
    assert result.returncode == 0
    assert f"no adb server answers on 127.0.0.1:{port}" in result.stdout
    assert f"adb -P {port} start-server" in result.stdout


def test_android_serial_names_the_board_when_no_device_is_given(tmp_path: Path) -> None:
    """As adb does: ANDROID_SERIAL picks the board, so no private daemon stands in for it."""
    port = free_port()
    model = models.small_cnn(tmp_path / "m.onnx")
    result = cli("mem", str(model), env={**_no_board_env(port), "ANDROID_SERIAL": "0123456789ABCDEF"})
    assert result.returncode == 1
    assert f"no adb server answers on 127.0.0.1:{port}" in result.stderr
    assert "private host-runtime daemon" not in result.stderr


def test_makefile_install_notice_names_every_package_it_installs() -> None:
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    installed = set(re.findall(r"\$\(APT_INSTALL\) ([\w.+-]+)\)", makefile))
    notice = next(line for line in makefile.splitlines() if "running as root, so installing" in line)
    assert installed and all(package in notice for package in installed), (installed, notice)
