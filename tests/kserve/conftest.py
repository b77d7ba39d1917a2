"""Daemons serving KServe v2 (a model repository folder, the HTTP listener on), and the real
tritonclient, run from its own venv by driver.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.kserve.tritonclient_venv import PerfAnalyzer, ensure, ensure_perf_analyzer
from tests.metrics.conftest import MetricsDaemon, start_metrics_daemon
from tests.models import small_cnn, two_inputs

DRIVER = Path(__file__).with_name("driver.py")
DRIVE_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def perf_analyzer() -> PerfAnalyzer:
    tool, reason = ensure_perf_analyzer()
    if tool is None:
        pytest.skip(reason)
    return tool


@pytest.fixture(scope="session")
def triton_python() -> Path:
    python, reason = ensure()
    if python is None:
        pytest.skip(reason)
    return python


@dataclass
class V2Daemon:
    running: MetricsDaemon
    python: Path
    folder: Path

    @property
    def grpc(self) -> str:
        return self.running.daemon.address

    @property
    def http(self) -> str:
        return self.running.base.removeprefix("http://")

    def drive(self, *steps: dict[str, Any], http: str | None = None) -> list[dict[str, Any]]:
        """Each step's answer from the real tritonclient: {"ok": value} or {"error": text, "status": code};
        its HTTP client goes to `http` (HOST:PORT) when given, else to the daemon's listener."""
        job = {"grpc": self.grpc, "http": http or self.http, "steps": list(steps)}
        done = subprocess.run(
            [str(self.python), str(DRIVER)],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=DRIVE_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    def one(self, step: dict[str, Any]) -> dict[str, Any]:
        return self.drive(step)[0]

    def infer(
        self, model: str, protocol: str, arrays: dict[str, np.ndarray], **extra: Any
    ) -> dict[str, np.ndarray]:
        """The outputs of one inference through tritonclient, by name (fails on an error answer)."""
        inputs, out = self.folder / "inputs.npz", self.folder / "outputs.npz"
        np.savez(inputs, **arrays)
        answer = self.one(
            {
                "op": "infer",
                "model": model,
                "protocol": protocol,
                "inputs": str(inputs),
                "out": str(out),
                **extra,
            }
        )
        assert "ok" in answer, answer
        with np.load(out) as found:
            return {name: found[name] for name in found.files}


def make_repository(root: Path) -> Path:
    """cnn (as is), two (inputs renamed by config.toml), nhwc (clients send NHWC), spare (for unload
    and load) and broken (not a model: UNAVAILABLE)."""
    for name in ("cnn", "two", "nhwc", "spare", "broken"):
        (root / name).mkdir(parents=True)
    small_cnn(root / "cnn" / "model.onnx")
    two_inputs(root / "two" / "model.onnx")
    (root / "two" / "config.toml").write_text('[[inputs]]\nname = "first"\n[[inputs]]\nname = "second"\n')
    small_cnn(root / "nhwc" / "model.onnx", seed=1)
    (root / "nhwc" / "config.toml").write_text('[[inputs]]\nlayout = "NHWC"\n')
    two_inputs(root / "spare" / "model.onnx")
    (root / "broken" / "model.onnx").write_bytes(b"not an onnx model")
    return root


def start_v2_daemon(folder: Path, python: Path, *args: str) -> V2Daemon:
    repository = make_repository(folder / "repository")
    running = start_metrics_daemon(folder, "--model-repository", str(repository), *args)
    return V2Daemon(running, python, folder)


@pytest.fixture(scope="module")
def v2_daemon(tmp_path_factory: pytest.TempPathFactory, triton_python: Path) -> Iterator[V2Daemon]:
    daemon = start_v2_daemon(tmp_path_factory.mktemp("v2"), triton_python)
    yield daemon
    assert daemon.running.daemon.stop() == 0
