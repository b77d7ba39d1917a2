"""`rknn-client` from a shell, against a real daemon."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from demo.models import save_mobilenet_v2
from rknn_client import digest_cache
from rknn_client.compat.rknn import RKNN
from rknn_client.device import connect
from rknn_client.errors import FailedPrecondition, advice
from rknn_client.input_files import read_image
from rknn_client.transport.adb import adb_server_running
from rknn_server.testing import DaemonProcess
from tests import models
from tests.adb.fixtures import find_adb, free_port
from tests.cli_run import cli
from tests.conftest import DaemonFactory


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
    # Both readings were tried: the message says so and suggests neither again.
    assert "both were tried, and nothing answers at tcp://127.0.0.1:1" in result.stderr
    assert "did you mean" not in result.stderr
    assert time.monotonic() - started < 12
    assert not adb_server_running("127.0.0.1", adb_port), "an adb server was started"


def test_other_schemes_are_refused_by_name(adb_port: int) -> None:
    result = cli("info", "--device", "http://127.0.0.1:50515", env={"ANDROID_ADB_SERVER_PORT": str(adb_port)})
    assert result.returncode == 1
    assert "unsupported scheme http://" in result.stderr and "tcp://HOST:PORT" in result.stderr


def test_run_takes_a_jpg_resized_to_the_model_input_as_rgb(
    host_daemon: DaemonProcess, cnn_model: Path, tmp_path: Path
) -> None:
    jpg = Path("demo/assets/grace_hopper.jpg").resolve()
    result = cli(
        "run", str(cnn_model), "--device", host_daemon.url, "--input", str(jpg), "--output-dir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "resized from 512x600 to the model input's 16x16" in result.stderr
    # The reading and resizing itself (OpenCV's, as toolkit scripts do) is checked in
    # tests/unit/client/test_input_files.py; here: RGB, NHWC->NCHW, and the same pixels reach the model.
    rgb = read_image(jpg, (16, 16, 3), lambda _: None)
    x = rgb.transpose(2, 0, 1)[np.newaxis].astype(np.float32)
    want = ort.InferenceSession(str(cnn_model)).run(None, {"input": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "output_0.npy"), want, rtol=1e-5, atol=1e-5)


def test_run_takes_an_npz_and_names_a_missing_file(
    host_daemon: DaemonProcess, cnn_model: Path, tmp_path: Path
) -> None:
    x = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "x.npz", input=x)
    ok = cli(
        "run",
        str(cnn_model),
        "--device",
        host_daemon.url,
        "--input",
        str(tmp_path / "x.npz"),
        "--output-dir",
        str(tmp_path),
    )
    assert ok.returncode == 0, ok.stderr
    want = ort.InferenceSession(str(cnn_model)).run(None, {"input": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "output_0.npy"), want, rtol=1e-5, atol=1e-6)
    missing = cli("run", str(cnn_model), "--device", host_daemon.url, "--input", str(tmp_path / "nope.npy"))
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"rknn-client: no such input file: {tmp_path / 'nope.npy'}"


def test_info_prints_readable_sizes_and_exact_json(host_daemon: DaemonProcess) -> None:
    text = cli("info", "--device", host_daemon.url)
    assert text.returncode == 0, text.stderr
    limits = next(line for line in text.stdout.splitlines() if line.startswith("limits:"))
    assert "e+" not in limits and "max_message_bytes=" in limits
    as_json = cli("info", "--device", host_daemon.url, "--json")
    info = json.loads(as_json.stdout)
    assert info["device"] == host_daemon.url and info["runtime"] == "host"
    message = info["limits"]["max_message_bytes"]
    assert isinstance(message, int) and message > 1 << 20
    shown = limits.split("max_message_bytes=", 1)[1].split(",")[0]
    number, unit = shown.split()
    assert float(number) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit] == pytest.approx(
        message, rel=1e-3
    )


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's model (MobileNetV2): big enough that a run is the model's work, not the call's."""
    return save_mobilenet_v2(tmp_path_factory.mktemp("demo-model") / "mobilenet_v2.onnx")


def test_perf_runs_report_percentiles_that_agree_with_the_demos_eval_perf(
    host_daemon: DaemonProcess, demo_model: Path
) -> None:
    result = cli("perf", str(demo_model), "--device", host_daemon.url, "--runs", "30", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    latency = report["latency"]
    assert latency["runs"] == 30 and latency["warmup"] == 3
    assert (
        0
        < latency["min_us"]
        <= latency["p50_us"]
        <= latency["p90_us"]
        <= latency["p99_us"]
        <= latency["max_us"]
    )
    assert latency["fps"] == pytest.approx(1e6 / latency["p50_us"])
    assert report["layers"], "the per-layer table comes from the runtime's profile"
    # The demo's path: the toolkit flow's eval_perf on the same daemon.
    rknn = RKNN()
    try:
        assert rknn.load_onnx(str(demo_model)) == 0 and rknn.build(do_quantization=False) == 0
        assert rknn.init_runtime(device_id=host_daemon.url, perf_debug=True) == 0
        texts = [rknn.eval_perf(is_print=False) for _ in range(5)]
    finally:
        rknn.release()
    totals = [
        int(next(line for line in text.splitlines() if line.startswith("Total Time(us):")).split(":")[1])
        for text in texts
        if text is not None
    ]
    # Both are the daemon's own run time of a frame. Load on this machine only ever adds time, so the
    # least of each side is its figure with the least noise; those must agree, generously.
    assert len(totals) == 5
    assert latency["min_us"] / 2.5 <= min(totals) <= latency["min_us"] * 2.5, (latency, totals)


def test_perf_text_keeps_the_toolkit_layout_aligned_and_leaves_out_what_is_not_measured(
    host_daemon: DaemonProcess, cnn_model: Path
) -> None:
    result = cli("perf", str(cnn_model), "--device", host_daemon.url, "--runs", "5")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines.index("Network Layer Information Table")
    table = lines[header + 1 : lines.index("", header)]
    bars = {tuple(i for i, ch in enumerate(line) if ch == "|") for line in table}
    assert len(bars) == 1, "columns are aligned"
    assert (
        "Total Memory Read/Write Per Frame Size(KB)" not in result.stdout
    )  # the host runtime does not measure it
    assert any(line.startswith("Latency(us): p50 ") for line in lines)
    assert any(line.startswith("Total Time(us): ") for line in lines)


def test_json_output_of_mem_doctor_and_devices_parses(host_daemon: DaemonProcess, cnn_model: Path) -> None:
    mem = json.loads(cli("mem", str(cnn_model), "--device", host_daemon.url, "--json").stdout)
    assert mem["weight_memory"] > 0 and mem["total_memory"] >= mem["weight_memory"]
    doctor = cli("doctor", "--device", host_daemon.url, "--json")
    checks = json.loads(doctor.stdout)
    assert doctor.returncode == 0 and checks["ok"] is True
    assert [c["name"] for c in checks["checks"]][:2] == ["tcp connect", "gRPC handshake"]
    rows = json.loads(cli("devices", "--device", host_daemon.url, "--json").stdout)
    assert {"address": host_daemon.url, "daemon": True, "state": "reachable"}.items() <= next(
        r for r in rows if r["address"] == host_daemon.url
    ).items()


def test_a_closed_pipe_ends_quietly(host_daemon: DaemonProcess) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "rknn_client.cli", "info", "--device", host_daemon.url, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first line is written, as with `| head -0`
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=120) == 141
    assert err == ""


def test_typos_get_a_suggestion_and_the_subcommands_own_usage() -> None:
    command = cli("pref", "model.onnx")
    assert command.returncode == 2
    first, *rest = command.stderr.splitlines()
    assert "invalid choice: 'pref'" in first and "did you mean perf?" in first
    option = cli("perf", "model.onnx", "--rnus", "5")
    first, *rest = option.stderr.splitlines()
    assert first.startswith("rknn-client perf: error: unrecognized arguments: --rnus 5")
    assert "did you mean --runs instead of --rnus?" in first
    assert rest[0].startswith("usage: rknn-client perf ")
    assert len(rest) < 10


def test_a_target_mismatch_is_fixed_in_the_terms_of_the_interface_in_use(
    make_daemon: DaemonFactory, cnn_model: Path, tmp_path: Path
) -> None:
    daemon = make_daemon("--soc", "rk3588")
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 3, 16, 16), np.float32))
    result = cli("run", str(cnn_model), "--device", daemon.url, "--target", "rk3566", "--input", str(x))
    assert result.returncode == 1
    assert "target mismatch" in result.stderr and "fix: use --target rk3588" in result.stderr
    assert "init_runtime" not in result.stderr
    with connect(daemon.url) as device, pytest.raises(FailedPrecondition) as raised:
        device.load(cnn_model, target="rk3566")
    assert (
        advice(raised.value, "toolkit") == "use init_runtime(target='rk3588'), or connect to a rk3566 board"
    )


def test_upload_reports_hashing_before_sending_in_bytes(
    make_daemon: DaemonFactory, demo_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A digest cache of this test's own: the model is hashed here, whatever other tests remembered.
    monkeypatch.setenv(digest_cache.PATH_ENV, str(tmp_path / digest_cache.FILE_NAME))
    events: list[tuple[str, int, int]] = []
    size = demo_model.stat().st_size
    with connect(make_daemon().url) as device:
        device.upload(
            demo_model,
            lambda done, total: events.append(("upload", done, total)),
            hashing=lambda done, total: events.append(("hashing", done, total)),
        )
    phases = [phase for phase, _, _ in events]
    first_upload = phases.index("upload")
    assert set(phases[:first_upload]) == {"hashing"} and "hashing" not in phases[first_upload:]
    hashed = [done for phase, done, _ in events if phase == "hashing"]
    assert len(hashed) > 1 and hashed == sorted(hashed) and hashed[-1] == size
    assert all(total == size for _, _, total in events)
    assert events[-1] == ("upload", size, size)


def test_a_big_run_reports_its_transfer_in_bytes(
    host_daemon: DaemonProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RKNN_SHM", "off")  # the wire's chunks (shared memory reports inputs, then outputs)
    elements = 3 << 20  # 12 MiB of float32 each way: streamed in chunks
    model = models.big_identity(tmp_path / "big.onnx", elements)
    events: list[tuple[int, int]] = []
    x = np.arange(elements, dtype=np.float32)
    with connect(host_daemon.url) as device, device.load(model) as session:
        [y] = session.run([x.reshape(session.inputs[0].shape)], progress=lambda d, t: events.append((d, t)))
    np.testing.assert_array_equal(y.reshape(-1), x)
    done = [d for d, _ in events]
    assert len(events) > 2 and done == sorted(done)
    assert events[-1] == (2 * x.nbytes, 2 * x.nbytes)  # inputs sent, then outputs received
    assert events[0][1] == x.nbytes  # the outputs' size is known only once the daemon names it
