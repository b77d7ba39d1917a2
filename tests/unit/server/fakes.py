"""A backend whose models are numpy functions: the data plane, registry and frame intake tested
in-process, without a runtime library or a daemon."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rknn_proto.manifest import one_file_manifest
from rknn_proto.messages import EvalMemoryResponse, EvalPerfResponse, TensorAttr
from rknn_server.runtime.base import (
    Backend,
    BackendCapabilities,
    InputFormat,
    ModelRuntime,
    RuntimeOptions,
    VersionInfo,
)
from rknn_server.store.model_cache import ModelCache

INPUT = TensorAttr(0, "x", (1, 3, 4, 4), np.dtype(np.float32), layout="NCHW")
OUTPUT = TensorAttr(0, "y", (1, 3, 4, 4), np.dtype(np.float32), layout="NCHW")


class FakeRuntime(ModelRuntime):
    """Doubles its input; `fail` makes the next run raise it."""

    def __init__(self, path: Path, options: RuntimeOptions) -> None:
        self.path, self.options = path, options
        self.inputs, self.outputs = [INPUT], [OUTPUT]
        self.closed = False
        self.fail: BaseException | None = None
        self.running = threading.Event()
        self.proceed = threading.Event()
        self.proceed.set()
        self.delay_s = 0.0
        self.threads: list[int] = []  # the thread of each run

    def run(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> list[np.ndarray]:
        self.threads.append(threading.get_ident())
        self.running.set()
        self.proceed.wait(30)
        time.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        return [inputs[0] * 2]

    def perf(self, inputs: Sequence[np.ndarray] | None) -> EvalPerfResponse:
        raise NotImplementedError

    def memory(self) -> EvalMemoryResponse:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


class FakeBackend(Backend):
    name = "fake"
    model_suffixes = (".onnx",)
    capabilities = BackendCapabilities()

    def __init__(self, soc: str = "") -> None:
        self._soc = soc
        self.opened: list[FakeRuntime] = []
        self.refuse: BaseException | None = None

    def version(self) -> VersionInfo:
        return VersionInfo("fake 1", "")

    def soc(self) -> str:
        return self._soc

    def open(self, model_path: Path, options: RuntimeOptions) -> ModelRuntime:
        if self.refuse is not None:
            raise self.refuse
        runtime = FakeRuntime(model_path, options)
        self.opened.append(runtime)
        return runtime


def store_model(cache: ModelCache, data: bytes, name: str = "m.onnx") -> str:
    """Cache a one-file model through an upload of it, as a client's would, and return its digest."""
    manifest = one_file_manifest(name, data)
    if cache.prepare(manifest)[0]:
        return manifest.digest
    upload = cache.begin_upload(manifest, [0])
    try:
        upload.write(0, 0, data)
        upload.finish()
    finally:
        upload.close()
    return manifest.digest
