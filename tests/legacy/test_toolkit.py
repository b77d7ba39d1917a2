"""The unmodified RKNN-Toolkit2 drives the daemon through the real adb binary and an emulated board."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import rknn_client
from rknn_client import RKNN
from tests.adb.fixtures import PrivateAdbServer
from tests.legacy.conftest import RESTARTS_LOG, LegacyDaemon, LegacyDaemonFactory
from tests.legacy.toolkit import Toolkit, find_toolkit, run_on_board
from tests.rknnrt.stub_build import StubTensor, write_stub_model
from tests.rknnrt_cases import int8_roundtrip

OUT_ZP, OUT_SCALE = -10, 0.75
# An unmodified toolkit script; only the paths come from the command line.
SCRIPT = """
import json
import sys
import numpy as np
from rknn.api import RKNN

model, device, inputs, outputs = sys.argv[1:5]
rknn = RKNN(verbose=True)
assert rknn.load_rknn(model) == 0
assert rknn.init_runtime(target="rk3588", device_id=device, perf_debug=True, eval_mem=True) == 0
x = np.load(inputs)
outs = rknn.inference(inputs=[x])
np.save(outputs, outs[0])
perf = rknn.eval_perf()
memory = rknn.eval_memory()
sdk = rknn.get_sdk_version()
rknn.release()
print("RESULT " + json.dumps({"perf": perf, "memory": memory, "sdk": sdk}))
"""


def wrapped_model(real_rknn: Path, path: Path) -> Path:
    """The toolkit's real tiny.rknn carrying a stand-in model (y = 2x + 1) the stub librknnrt runs."""
    return write_stub_model(
        path,
        inputs=[StubTensor("x", "FP32", "NHWC", (1, 4, 4, 3))],
        outputs=[StubTensor("y", "INT8", "NCHW", (1, 3, 4, 4), OUT_ZP, OUT_SCALE)],
        container=real_rknn.read_bytes(),
    )


def run_script(
    toolkit: Toolkit, adb: PrivateAdbServer, tmp_path: Path, script: str, *args: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "script.py"
    path.write_text(script)
    return run_on_board(toolkit, path, list(args), adb.env, tmp_path)


def run_standard_script(
    toolkit: Toolkit,
    adb: PrivateAdbServer,
    tmp_path: Path,
    daemon: LegacyDaemon,
    serial: str,
    model: Path,
    x: np.ndarray,
) -> subprocess.CompletedProcess[str]:
    """SCRIPT on `model` with input `x` (its output lands in tmp_path/y.npy); it must succeed."""
    np.save(tmp_path / "x.npy", x)
    args = (str(model), serial, str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    run = run_script(toolkit, adb, tmp_path, SCRIPT, *args)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + daemon.process.log_text()[-3000:]
    return run


def expected_output(x: np.ndarray) -> np.ndarray:
    """The stub computes y = 2x + 1 element by element (in the data's own order) into int8 (zp, scale)."""
    return int8_roundtrip(2 * x.ravel() + 1, OUT_ZP, OUT_SCALE).reshape(1, 3, 4, 4)


def through_grpc(daemon: LegacyDaemon, model: Path, x: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """The rknn.v1 path (rknn_client's RKNN over gRPC) on the same daemon: outputs and eval_memory."""
    rknn = RKNN()
    try:
        assert rknn.load_rknn(str(model)) == 0
        assert rknn.init_runtime(target="rk3588", device_id=daemon.url, eval_mem=True) == 0
        outputs = rknn.inference(inputs=[x])
        memory = rknn.eval_memory()
    finally:
        rknn.release()
    assert outputs is not None and memory is not None
    return np.asarray(outputs[0]), memory


def test_the_unmodified_toolkit_runs_a_real_rknn_through_adb_with_the_rknn_v1_outputs(
    toolkit: Toolkit,
    toolkit_adb: PrivateAdbServer,
    real_rknn: Path,
    legacy_daemon: LegacyDaemonFactory,
    board_for,
    tmp_path: Path,
) -> None:
    daemon = legacy_daemon("--log-level", "debug")
    board = board_for(daemon)
    model = wrapped_model(real_rknn, tmp_path / "wrapped.rknn")
    x = np.random.default_rng(7).uniform(-20, 20, (1, 4, 4, 3)).astype(np.float32)
    run = run_standard_script(toolkit, toolkit_adb, tmp_path, daemon, board.serial, model, x)
    # The toolkit printed what the daemon described: the stand-in runtime's own tensors.
    assert "DRV: rknn_server: 2.5.0 (rknn-server-oss" in run.stdout
    assert "name=x, n_dims=4, dims=[1, 4, 4, 3], n_elems=48, size=192" in run.stdout
    assert "fmt=NHWC, type=FP32, qnt_type=NONE" in run.stdout
    assert "name=y, n_dims=4, dims=[1, 3, 4, 4], n_elems=48, size=48" in run.stdout
    assert f"type=INT8, qnt_type=AFFINE, zp={OUT_ZP}, scale={OUT_SCALE:f}" in run.stdout
    legacy = np.load(tmp_path / "y.npy")
    np.testing.assert_array_equal(legacy, expected_output(x))
    result = json.loads(run.stdout.split("RESULT ", 1)[1])
    grpc_outputs, grpc_memory = through_grpc(daemon, model, x)
    np.testing.assert_array_equal(legacy, grpc_outputs)
    # eval_memory: the stand-in's sizes (weight 1024, internal 512, dma 4096), as rknn.v1 reports them.
    assert result["memory"] == {
        "weight_memory": 1024,
        "internal_memory": 512,
        "other_memory": 2560,
        "total_memory": 4096,
    }
    assert {k: grpc_memory[k] for k in result["memory"]} == result["memory"]
    # eval_perf (perf_debug): the runtime's own per-layer table; get_sdk_version: both versions.
    assert "Network Layer Information Table" in result["perf"] and "ConvRelu" in result["perf"]
    assert "rknn_server: 2.5.0 (rknn-server-oss" in result["sdk"] and "rknnrt: 2.3.2" in result["sdk"]
    # ps showed the daemon as rknn_server, so the toolkit neither killed nor restarted anything.
    assert not (daemon.board / RESTARTS_LOG).exists()
    # The session was freed when the toolkit released it.
    daemon.process.stop()
    assert "unloaded by the toolkit" in daemon.process.log_text()


@pytest.mark.parametrize("claimed", ["2.3.2", "2.5.0"])
def test_toolkit_2_3_2_runs_on_the_daemon_in_either_releases_layout(
    toolkit_adb: PrivateAdbServer,
    real_rknn: Path,
    legacy_daemon: LegacyDaemonFactory,
    board_for,
    tmp_path: Path,
    claimed: str,
) -> None:
    """2.3.2's librknn_api is 2.5.0's code (only its version string differs): its client is served
    whichever of the two the daemon speaks, and prints the version the daemon claims."""
    older = find_toolkit("2.3.2")
    if older is None:
        pytest.skip("no RKNN-Toolkit2 2.3.2 venv (rknn-client toolkit install --version 2.3.2 --torch-stub)")
    daemon = legacy_daemon("--legacy-toolkit-version", claimed)
    board = board_for(daemon)
    x = np.random.default_rng(3).uniform(-20, 20, (1, 4, 4, 3)).astype(np.float32)
    model = wrapped_model(real_rknn, tmp_path / "wrapped.rknn")
    run = run_standard_script(older, toolkit_adb, tmp_path, daemon, board.serial, model, x)
    assert "rknn-toolkit2 version: 2.3.2" in run.stdout + run.stderr
    assert f"DRV: rknn_server: {claimed} (rknn-server-oss" in run.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected_output(x))


def test_a_model_over_8_mb_arrives_in_one_load_and_runs(
    toolkit: Toolkit,
    toolkit_adb: PrivateAdbServer,
    real_rknn: Path,
    legacy_daemon: LegacyDaemonFactory,
    board_for,
    tmp_path: Path,
) -> None:
    """load_rknn + init_runtime send the whole file in one MsgLoad (librknn_api's split mode is not
    used by the toolkit): a 9 MiB model travels whole and runs."""
    daemon = legacy_daemon("--log-level", "debug")
    board = board_for(daemon)
    model = write_stub_model(
        tmp_path / "big.rknn",
        inputs=[StubTensor("x", "FP32", "NHWC", (1, 4, 4, 3))],
        outputs=[StubTensor("y", "INT8", "NCHW", (1, 3, 4, 4), OUT_ZP, OUT_SCALE)],
        container=real_rknn.read_bytes() + bytes(9 << 20),
    )
    x = np.random.default_rng(5).uniform(-20, 20, (1, 4, 4, 3)).astype(np.float32)
    run_standard_script(toolkit, toolkit_adb, tmp_path, daemon, board.serial, model, x)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected_output(x))
    daemon.process.stop()
    loads = [
        json.loads(line)
        for line in daemon.process.log_text().splitlines()
        if '"legacy_request"' in line and '"LOAD"' in line
    ]
    # One frame: the 0x70-byte header and size, the file, and the client's 132 trailing zero bytes.
    assert [entry["size"] for entry in loads] == [0x70 + model.stat().st_size + 132]


@pytest.mark.parametrize("name", ["rknn_server"])
def test_the_daemon_is_named_as_the_toolkit_looks_for_it(
    legacy_daemon: LegacyDaemonFactory, name: str
) -> None:
    daemon = legacy_daemon()
    assert Path(f"/proc/{daemon.process.pid}/comm").read_text().strip() == name


TWO_INPUTS_SCRIPT = """
import sys
import numpy as np
from rknn.api import RKNN

model, device, inputs, outputs = sys.argv[1:5]
rknn = RKNN()
assert rknn.load_rknn(model) == 0
assert rknn.init_runtime(target="rk3588", device_id=device, core_mask=RKNN.NPU_CORE_0_1, perf_debug=True) == 0
data = np.load(inputs)
outs = rknn.inference(inputs=[data["a"], data["b"]])
np.savez(outputs, *outs)
print(rknn.eval_perf())
rknn.release()
"""


def test_two_inputs_of_two_dtypes_on_two_cores(
    toolkit: Toolkit,
    toolkit_adb: PrivateAdbServer,
    real_rknn: Path,
    legacy_daemon: LegacyDaemonFactory,
    board_for,
    tmp_path: Path,
) -> None:
    daemon = legacy_daemon("--log-level", "debug")
    board = board_for(daemon)
    model = write_stub_model(
        tmp_path / "two.rknn",
        inputs=[
            StubTensor("a", "FP32", "NHWC", (1, 4, 4, 3)),
            StubTensor("b", "UINT8", "NHWC", (1, 4, 4, 3)),
        ],
        outputs=[
            StubTensor("ya", "FP32", "NHWC", (1, 4, 4, 3)),
            StubTensor("yb", "FP32", "NHWC", (1, 4, 4, 3)),
        ],
        a=3.0,
        b=0.5,
        container=real_rknn.read_bytes(),
    )
    rng = np.random.default_rng(11)
    a = rng.uniform(-9, 9, (1, 4, 4, 3)).astype(np.float32)
    b = rng.integers(0, 256, (1, 4, 4, 3), dtype=np.uint8)
    np.savez(tmp_path / "in.npz", a=a, b=b)
    run = run_script(
        toolkit,
        toolkit_adb,
        tmp_path,
        TWO_INPUTS_SCRIPT,
        str(model),
        board.serial,
        str(tmp_path / "in.npz"),
        str(tmp_path / "y.npz"),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + daemon.process.log_text()[-3000:]
    assert (tmp_path / "y.npz").exists(), run.stdout[-3000:] + daemon.process.log_text()[-3000:]
    saved = np.load(tmp_path / "y.npz")
    legacy = [saved["arr_0"], saved["arr_1"]]
    # The stub's output i is 3 * input i + 0.5: each input arrived in its own dtype, in its place (the
    # toolkit hands the NHWC buffer back in the shape of the model's NCHW output).
    expected = [np.float32(3) * a + np.float32(0.5), np.float32(3) * b.astype(np.float32) + np.float32(0.5)]
    for mine, wanted in zip(legacy, expected, strict=True):
        np.testing.assert_array_equal(mine.ravel(), wanted.ravel())
    # The mask reached the runtime: its per-layer table splits the work over cores 0 and 1.
    assert "50.0%/50.0%/0.0%" in run.stdout
    rknn = RKNN()
    try:
        assert rknn.load_rknn(str(model)) == 0
        assert rknn.init_runtime(target="rk3588", device_id=daemon.url, core_mask=RKNN.NPU_CORE_0_1) == 0
        grpc_outputs = rknn.inference(inputs=[a, b])
    finally:
        rknn.release()
    assert grpc_outputs is not None
    # Same values; the shapes differ only because the real toolkit reshapes each output to the .rknn
    # container's own output shape (tiny.rknn's 1x3x4x4), which this stand-in model does not match.
    for mine, theirs in zip(legacy, grpc_outputs, strict=True):
        np.testing.assert_array_equal(mine.ravel(), np.asarray(theirs).ravel())


# Each step of a session, as a script sees it: the return code, or the toolkit's error code.
STEPS_SCRIPT = """
import json
import re
import sys
import numpy as np
from rknn.api import RKNN

device, bare, model, dynamic, needs_op = sys.argv[1:6]


def step(call):
    try:
        result = call()
    except Exception as exc:
        found = re.search(r"error code: (RKNN_ERR_[A-Z_]+)", str(exc))
        return found.group(1) if found else repr(exc)[:200]
    return "OK" if result is None or isinstance(result, int) and result == 0 else (
        "OK" if isinstance(result, list) else result)


def session(path, *inputs):
    rknn = RKNN()
    assert rknn.load_rknn(path) == 0
    seen = [step(lambda: rknn.init_runtime(target="rk3588", device_id=device))]
    seen += [step(lambda x=x: rknn.inference(inputs=[x])) for x in inputs]
    rknn.release()
    return seen


shape = (1, 4, 4, 3)
print("RESULT " + json.dumps({
    "refused model": session(bare),
    "inputs": session(model, np.ones((1, 4, 4, 2), np.float32), np.ones((1, 4, 4, 4), np.float32),
                      np.ones(shape, np.float32)),
    "dynamic": session(dynamic, np.ones(shape, np.float32)),
    "failing run": session(needs_op, np.ones(shape, np.float32)),
}))
"""


def test_no_refusal_gives_the_toolkit_a_reason_to_kill_the_daemon(
    each_toolkit: Toolkit,
    toolkit_adb: PrivateAdbServer,
    real_rknn: Path,
    legacy_daemon: LegacyDaemonFactory,
    board_for,
    tmp_path: Path,
) -> None:
    """After a crash report during a run the toolkit runs `killall rknn_server` and `nohup
    /usr/bin/rknn_server` on the board, so refusals are answered as Rockchip's rknn_server answers them,
    with the same codes for the script: a model the runtime refuses gets the LOAD ack ACK_FAIL
    (RKNN_ERR_MODEL_INVALID); a too-small input is refused by the toolkit itself; a larger one runs (the
    runtime takes what it needs); a run that fails is a MsgFinish with an error result. The daemon keeps
    its PID throughout and the board records no restart command. The same with 2.5.0 and 2.3.2."""
    daemon = legacy_daemon()
    board = board_for(daemon)
    pid = daemon.process.pid
    x = StubTensor("x", "FP32", "NHWC", (1, 4, 4, 3))
    needs_op = write_stub_model(
        tmp_path / "needs-op.rknn",
        inputs=[x],
        outputs=[StubTensor("y", "FP32", "NCHW", (1, 3, 4, 4))],
        requires_op="MyCustomOp",
        container=real_rknn.read_bytes(),
    )
    dynamic = write_stub_model(
        tmp_path / "dynamic.rknn",
        inputs=[x],
        outputs=[StubTensor("y", "FP32", "NHWC", (1, 4, 4, 3))],
        dynamic=[(1, 4, 4, 3), (1, 8, 8, 3)],
        container=real_rknn.read_bytes(),
    )
    model = wrapped_model(real_rknn, tmp_path / "wrapped.rknn")
    paths = (real_rknn, model, dynamic, needs_op)
    run = run_script(each_toolkit, toolkit_adb, tmp_path, STEPS_SCRIPT, board.serial, *map(str, paths))
    assert "RESULT " in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    seen = json.loads(run.stdout.split("RESULT ", 1)[1])
    assert seen["refused model"] == ["RKNN_ERR_MODEL_INVALID"]
    assert "msg_load_ack fail, ack = 1(ACK_FAIL)" in run.stdout
    assert seen["inputs"] == ["OK", "RKNN_ERR_PARAM_INVALID", "OK", "OK"]
    assert seen["failing run"] == ["OK", "RKNN_ERR_FAIL"]
    # Shapes only the runtime knows (the .rknn container declares none): MODEL_INFO carries the runtime's
    # dims (its largest shape), so the toolkit refuses the smaller input itself, as with Rockchip's
    # server; a .rknn built with dynamic_input runs at two sizes (test_dynamic_shapes.py).
    assert seen["dynamic"] == ["OK", "RKNN_ERR_PARAM_INVALID"]
    assert "Catch runtime Crash" not in run.stdout
    assert not (daemon.board / RESTARTS_LOG).exists(), (daemon.board / RESTARTS_LOG).read_text()
    assert daemon.process.pid == pid and Path(f"/proc/{pid}").exists()
    with rknn_client.connect(daemon.url) as device:
        assert device.info(refresh=True).open_sessions == 0
