"""The toolkit protocol's inference round trip against rknn.v1's `Run`, on one daemon, side by side.

The unmodified RKNN-Toolkit2 (its own venv, its bundled adb, an emulated board whose
`local:transfer_proxy` reaches the daemon's legacy listener) times each `rknn.inference()` of a tiny
model on the stand-in librknnrt; rknn_client's `Session.run` times the same model and input on the
same daemon before and after it. The figure is the ratio of the two p50s: what the toolkit listener
adds to a call (framing, its turnaround floor: server/protocols/legacy/connection.py) over the gRPC path.
Skipped, saying why, without a toolkit (`rknn-client toolkit install --torch-stub`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from rknn_client import connect
from rknn_server.protocols.legacy.connection import MIN_TURNAROUND_S
from rknn_server.testing import start_daemon
from tests.adb.fixtures import EmulatedBoard, PrivateAdbServer
from tests.adb.services import DeviceProfile
from tests.legacy.conftest import ps_showing, recording
from tests.legacy.toolkit import export_tiny_rknn, find_toolkit
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt.stub_build import StubTensor, build_stub, write_stub_model
from tests.rknnrt_cases import rknnrt_args

RUNS = 300
WARMUP = 20
SHAPE = (1, 4, 4, 3)
# An unmodified toolkit script: N timed inferences after a warm-up, their seconds printed as JSON.
SCRIPT = """
import json, sys, time
import numpy as np
from rknn.api import RKNN

model, device, runs, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rknn = RKNN()
assert rknn.load_rknn(model) == 0
assert rknn.init_runtime(target="rk3588", device_id=device) == 0
x = np.load(sys.argv[5])
seconds = []
for i in range(warmup + runs):
    start = time.perf_counter()
    rknn.inference(inputs=[x])
    seconds.append(time.perf_counter() - start)
rknn.release()
print("SECONDS " + json.dumps(seconds[warmup:]))
"""


def _grpc_seconds(url: str, model: Path, x: np.ndarray) -> list[float]:
    seconds = []
    with connect(url) as device, device.load(model) as session:
        for _ in range(WARMUP):
            session.run([x])
        for _ in range(RUNS):
            start = time.perf_counter()
            session.run([x])
            seconds.append(time.perf_counter() - start)
    return seconds


def measure_legacy(work: Path) -> dict[str, Any]:
    toolkit = find_toolkit()
    if toolkit is None:
        return {"skipped": "no RKNN-Toolkit2 venv (rknn-client toolkit install --torch-stub)"}
    work.mkdir(parents=True, exist_ok=True)
    model = write_stub_model(
        work / "tiny-stub.rknn",
        inputs=[StubTensor("x", "FP32", "NHWC", SHAPE)],
        outputs=[StubTensor("y", "FP32", "NHWC", SHAPE)],
        container=export_tiny_rknn(toolkit, work / "export").read_bytes(),
    )
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    np.save(work / "x.npy", x)
    (work / "script.py").write_text(SCRIPT)
    name = f"rknn-bench-legacy-{uuid.uuid4().hex[:12]}"
    board_root = rk3588_board(work / "board")
    args = rknnrt_args(build_stub(work / "stub"), board_root, "--legacy-listen", f"unix-abstract:{name}")
    daemon = start_daemon(work / "cache", work / "daemon.log", args)
    adb = PrivateAdbServer(str(toolkit.adb), work / "adb-home")
    try:
        adb.start()
        profile = DeviceProfile(
            board_root,
            serial_name="bench-legacy",
            abstract_sockets={"transfer_proxy": name},
            commands={
                "ps": ps_showing(daemon.pid),
                "killall": recording("killall", board_root),
                "nohup": recording("nohup", board_root),
            },
        )
        board = EmulatedBoard(adb, profile)
        try:
            grpc = _grpc_seconds(daemon.url, model, x)
            run = subprocess.run(
                [str(toolkit.python), "script.py", str(model), board.serial, str(RUNS), str(WARMUP), "x.npy"],
                cwd=work,
                env=adb.env,
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            legacy = json.loads(run.stdout.split("SECONDS ", 1)[1])
            grpc += _grpc_seconds(daemon.url, model, x)  # before and after: the same machine noise
        finally:
            board.close()
    finally:
        adb.stop()
        daemon.stop()
    legacy_p50, grpc_p50 = statistics.median(legacy), statistics.median(grpc)
    return {
        "model": "stand-in librknnrt, 1x4x4x3 float32 in and out",
        "toolkit": toolkit.version,
        "legacy_turnaround_floor_ms": MIN_TURNAROUND_S * 1e3,
        "toolkit_inference_p50_ms": legacy_p50 * 1e3,
        "rknn_v1_run_p50_ms": grpc_p50 * 1e3,
        "toolkit_over_rknn_v1_p50": legacy_p50 / grpc_p50,
    }
