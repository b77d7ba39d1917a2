"""A test-only backend, loaded with `rknn_server --backend tests.reliability.stall_backend:factory`.

It is the host backend, except that an inference whose first input value is STALL_VALUE stalls:
it touches `<dir>/started` and then waits until `<dir>/release` exists (forever if it never does).
That gives the tests a runtime call that hangs, or one that is in flight for exactly as long as
they want, with no timing involved. `<dir>` comes from RKNN_TEST_STALL_DIR.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rknn_proto.messages import EvalMemoryResponse, EvalPerfResponse
from rknn_server.runtime.base import (
    InputFormat,
    ModelRuntime,
    RuntimeOptions,
)
from rknn_server.runtime.host import HostBackend

STALL_VALUE = 7.0
ROOT = Path(__file__).resolve().parents[2]


def use_stall_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Let daemons and their workers import this backend from this tree; returns its stall folder."""
    paths = [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    stall = tmp_path / "stall"
    stall.mkdir()
    monkeypatch.setenv("RKNN_TEST_STALL_DIR", str(stall))
    return stall


class StallRuntime(ModelRuntime):
    def __init__(self, inner: ModelRuntime, folder: Path) -> None:
        self.inner = inner
        self.inputs = inner.inputs
        self.outputs = inner.outputs
        self.folder = folder

    def run(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> list[np.ndarray]:
        if inputs and inputs[0].size and float(inputs[0].reshape(-1)[0]) == STALL_VALUE:
            (self.folder / "started").touch()
            while not (self.folder / "release").exists():
                time.sleep(0.02)
        return self.inner.run(inputs, formats)

    def perf(self, inputs: Sequence[np.ndarray] | None) -> EvalPerfResponse:
        return self.inner.perf(inputs)

    def memory(self) -> EvalMemoryResponse:
        return self.inner.memory()

    def close(self) -> None:
        self.inner.close()


class StallBackend(HostBackend):
    name = "stall"

    def __init__(self, folder: str) -> None:
        super().__init__(threads=1)
        self.folder = folder

    def open(self, model_path: Path, options: RuntimeOptions) -> ModelRuntime:
        return StallRuntime(super().open(model_path, options), Path(self.folder))


def factory() -> StallBackend:
    return StallBackend(os.environ["RKNN_TEST_STALL_DIR"])
