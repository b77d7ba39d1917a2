"""The toolkit sessions both servers get: the same unmodified toolkit script, models and inputs.

Each session is list_devices, load_rknn, init_runtime, `runs` inferences of each set of inputs (a
dynamic-shape model gets sets of other sizes), eval_perf, eval_memory, get_sdk_version and release;
the script prints what each step returned (an error as the toolkit's `RKNN_ERR_*` code) and each
set's last outputs land in an .npz, so the toolkit-visible results are compared beside the messages.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.adb.fixtures import PrivateAdbServer
from tests.legacy.test_dynamic_shapes import BIG, DYNAMIC_INPUT, SMALL, dynamic_model
from tests.legacy.toolkit import Toolkit, export_tiny_rknn
from tests.rknnrt.stub_build import StubTensor, write_stub_model

SCRIPT = """
import json, re, sys, time
import numpy as np
from rknn.api import RKNN

spec = json.loads(sys.argv[1])
result = {}


def step(name, call):
    try:
        value = call()
    except Exception as exc:
        found = re.search(r"error code: (RKNN_ERR_[A-Z_]+)", str(exc))
        value = found.group(1) if found else "exception: " + str(exc)[:200]
    result[name] = value
    return value


rknn = RKNN()
step("list_devices", lambda: rknn.list_devices() and None)
step("load_rknn", lambda: rknn.load_rknn(spec["model"]))
if step("init_runtime", lambda: rknn.init_runtime(target="rk3588", device_id=spec["device"], **spec["init"])) == 0:
    seconds, saved, outputs = [], [], None
    for paths in spec["inputs"]:
        inputs = [np.load(path) for path in paths]
        for _ in range(spec["runs"]):
            start = time.perf_counter()
            outputs = step("inference", lambda: rknn.inference(inputs=inputs))
            seconds.append(time.perf_counter() - start)
            if not isinstance(outputs, list):
                break
        if not isinstance(outputs, list):
            break
        saved += outputs
    if isinstance(outputs, list):
        np.savez(spec["outputs"], *saved)
        result["inference"] = "OK"
    result["inference_seconds"] = seconds
    step("eval_perf", lambda: rknn.eval_perf())
    step("eval_memory", lambda: rknn.eval_memory())
    step("get_sdk_version", lambda: rknn.get_sdk_version())
step("release", lambda: rknn.release())
print("RESULT " + json.dumps(result, default=str))
"""
SHAPE = (1, 4, 4, 3)
BIG_SHAPE = (1, 224, 224, 3)  # a 588 KiB float32 input
BIG_MODEL_BYTES = 9 * 1024 * 1024  # the `big` model's filler, between the real .rknn and the stand-in's text
Inputs = list[tuple[str, tuple[int, ...]]]  # dtype, shape of each input sent


@dataclass(frozen=True)
class Session:
    name: str
    model: str  # a key of `models`
    inputs: Inputs
    init: dict[str, Any] = field(default_factory=dict)
    runs: int = 1
    later: list[Inputs] = field(default_factory=list)  # further sets, `runs` inferences each

    @property
    def input_sets(self) -> list[Inputs]:
        return [self.inputs, *self.later]


SESSIONS = [
    Session("one-plain", "one", [("float32", SHAPE)]),
    Session("one-perf", "one", [("float32", SHAPE)], {"perf_debug": True, "eval_mem": True}),
    Session(
        "two-perf", "two", [("float32", SHAPE), ("uint8", SHAPE)], {"perf_debug": True, "eval_mem": True}
    ),
    Session("bare", "bare", [("float32", SHAPE)]),
    Session("wrongsize", "one", [("float32", (1, 4, 4, 4))]),
    Session("timing", "one", [("float32", SHAPE)], runs=20),
    # A real dynamic .rknn at two sizes and back: INPUT_DYNAMIC_RANGE, then command 16 before each run.
    Session("dyn", "dyn", [("float32", SMALL)], later=[[("float32", BIG)], [("float32", SMALL)]]),
    Session("big", "big", [("float32", BIG_SHAPE)], {"perf_debug": True, "eval_mem": True}),
]


def models(toolkit: Toolkit, folder: Path) -> dict[str, Path]:
    """The stand-in models (the toolkit's real .rknn, static or dynamic, carrying what the stand-in
    runtime runs; `big` with a filler that makes its LOAD ~9 MB) and the real .rknn alone, which the
    stand-in refuses."""
    real_rknn = export_tiny_rknn(toolkit, folder / "export")
    container = real_rknn.read_bytes()
    one = write_stub_model(
        folder / "one.rknn",
        inputs=[StubTensor("x", "FP32", "NHWC", SHAPE)],
        outputs=[StubTensor("y", "INT8", "NCHW", (1, 3, 4, 4), -5, 0.25)],
        container=container,
    )
    two = write_stub_model(
        folder / "two.rknn",
        inputs=[StubTensor("a", "FP32", "NHWC", SHAPE), StubTensor("b", "UINT8", "NHWC", SHAPE)],
        outputs=[StubTensor("ya", "FP32", "NHWC", SHAPE), StubTensor("yb", "INT8", "NHWC", SHAPE, -5, 0.25)],
        container=container,
    )
    dynamic = export_tiny_rknn(toolkit, folder / "export-dynamic", DYNAMIC_INPUT).read_bytes()
    filler = bytes(range(256)) * (BIG_MODEL_BYTES // 256)  # holds no "\nrknn-stub 1\n"
    big = write_stub_model(
        folder / "big.rknn",
        inputs=[StubTensor("x", "FP32", "NHWC", BIG_SHAPE)],
        outputs=[StubTensor("y", "INT8", "NCHW", (1, 3, 4, 4), -5, 0.25)],  # the container's output
        weight=BIG_MODEL_BYTES,
        dma=BIG_MODEL_BYTES + 4096,  # a runtime's DMA total holds the weights
        container=container + filler,
    )
    return {
        "one": one,
        "two": two,
        "bare": real_rknn,
        "dyn": dynamic_model(folder / "dyn.rknn", dynamic),
        "big": big,
    }


def run_session(
    toolkit: Toolkit, adb: PrivateAdbServer, serial: str, session: Session, model: Path, work: Path
) -> dict[str, Any]:
    """The session's toolkit-visible results (its outputs under `outputs`) and the toolkit's stdout."""
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(session.name))
    paths: list[list[str]] = []
    for n, inputs in enumerate(session.input_sets):
        paths.append([])
        for i, (dtype, shape) in enumerate(inputs):
            data = rng.uniform(-20, 20, shape) if dtype == "float32" else rng.integers(0, 256, shape)
            paths[-1].append(str(work / f"in{n}-{i}.npy"))
            np.save(paths[-1][-1], data.astype(dtype))
    spec = {"model": str(model), "device": serial, "init": session.init, "inputs": paths,
            "runs": session.runs, "outputs": str(work / "outputs.npz")}  # fmt: skip
    (work / "session.py").write_text(SCRIPT)
    run = subprocess.run(
        [str(toolkit.python), "session.py", json.dumps(spec)],
        cwd=work,
        env=adb.env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    (work / "toolkit.log").write_text(run.stdout + run.stderr)
    if "RESULT " not in run.stdout:
        return {"failed": f"the toolkit script exited with {run.returncode}", "stdout": run.stdout[-2000:]}
    result: dict[str, Any] = json.loads(run.stdout.split("RESULT ", 1)[1])
    if (work / "outputs.npz").exists():
        saved = np.load(work / "outputs.npz")
        result["outputs"] = [saved[name] for name in saved.files]
    result["stdout"] = run.stdout
    return result
